"""A model's cache and memory settings: from the manifest, checked against its GGUF, as flags.

The manifest's fields (`cache_type`, `kv_unified`, `cache_ram_mb`, `cache_reuse`,
`ctx_extend`, `load_mode`, `deterministic`, `flash_attn`; per model, with
`[serving]` defaults) become one `CacheSettings` value. `problems` says, from
the GGUF's facts alone, why the engine would refuse them or serve them wrongly
(a quantized KV cache on heads whose size is no multiple of the block, a YaRN
factor beyond what the model declares), so a model with a problem is refused
before any child is spawned. `flags` maps them onto llama-server's flags.
`blazar.serve.supervisor.runtime` builds the runtime of each model with them and
`blazar.models.fit` (through `blazar fit`) estimates memory with the same values.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specs.models import Model
from specs.serving import Serving

# Elements per quantization block of the KV cache types Blazar offers (ggml's q8_0, q4_0).
QUANT_BLOCK = {"q8_0": 32, "q4_0": 32}
# YaRN's factor is trusted up to what the GGUF declares (its rope.scaling.factor); a GGUF
# that declares none gets this, the largest factor model cards commonly validate (Qwen's 4).
MAX_YARN_FACTOR = 4.0
DETERMINISTIC_SEED = 0


@dataclass(frozen=True)
class CacheSettings:
    """The effective settings of one model; None leaves the engine's default."""

    cache_type: str | None = None
    kv_unified: bool | None = None
    cache_ram_mb: int | None = None
    cache_reuse: int | None = None
    ctx_extend: float | None = None
    load_mode: str | None = None
    deterministic: bool = False
    flash_attn: str | None = None

    @property
    def kv_type(self) -> str:
        """The KV cache element type the engine will use."""
        return self.cache_type or "f16"


def settings_for(model: Model | None, serving: Serving) -> CacheSettings:
    """The model's own fields over `[serving]`'s defaults."""

    def pick(name: str) -> Any:
        own = getattr(model, name) if model is not None else None
        return own if own is not None else getattr(serving, name, None)

    return CacheSettings(
        cache_type=pick("cache_type"),
        kv_unified=pick("kv_unified"),
        cache_ram_mb=pick("cache_ram_mb"),
        cache_reuse=pick("cache_reuse"),
        ctx_extend=model.ctx_extend if model is not None else None,
        load_mode=pick("load_mode"),
        deterministic=bool(pick("deterministic")),
        flash_attn=pick("flash_attn"),
    )


def head_sizes(facts: dict[str, Any]) -> tuple[int | None, int | None]:
    """(K, V) head sizes from the GGUF's facts; None where the GGUF does not tell."""
    heads = facts.get("head_count") or 0
    embd = facts.get("embedding_length") or 0
    fallback = embd // heads if heads and embd else None
    return facts.get("key_length") or fallback, facts.get("value_length") or fallback


def max_factor(facts: dict[str, Any]) -> float:
    """The largest ctx_extend the model supports (see MAX_YARN_FACTOR)."""
    declared = facts.get("rope_scaling_factor")
    if facts.get("rope_scaling_type") == "yarn" and isinstance(declared, int | float):
        return max(float(declared), 1.0)
    return MAX_YARN_FACTOR


def ctx_limit(settings: CacheSettings, train_ctx: int | None) -> int | None:
    """The largest ctx the model can be served with: its training context, times the
    YaRN factor when ctx_extend is set; None when the GGUF does not say."""
    if not train_ctx:
        return None
    return int(train_ctx * settings.ctx_extend) if settings.ctx_extend else train_ctx


def problems(settings: CacheSettings, facts: dict[str, Any], *, name: str, ctx: int) -> list[str]:
    """Why the settings cannot serve this model, each with its fix; [] when they can."""
    found = []
    where = f"models.{name}"
    kv = settings.cache_type
    if kv in QUANT_BLOCK:
        block = QUANT_BLOCK[kv]
        k_size, v_size = head_sizes(facts)
        bad = [size for size in (k_size, v_size) if size is not None and size % block]
        if bad:
            found.append(
                f"cache_type = {kv!r} needs a head size that is a multiple of {block}, and "
                f"model '{name}' has heads of {k_size} (K) and {v_size} (V): set "
                f'{where}.cache_type = "f16" (or remove it, and serving.cache_type)'
            )
        if settings.flash_attn == "off":
            found.append(
                f"cache_type = {kv!r} quantizes the V cache, which needs flash attention, and "
                f'flash_attn = "off": set flash_attn to "auto" or "on", or cache_type to "f16"'
            )
    if settings.ctx_extend is not None:
        factor = settings.ctx_extend
        has_rope = facts.get("rope_dimension_count") or facts.get("rope_freq_base")
        if not has_rope and "rope_freq_base" in facts:
            found.append(
                f"ctx_extend = {factor:g} applies YaRN RoPE scaling, and model '{name}' has no "
                f"RoPE keys in its GGUF: remove {where}.ctx_extend"
            )
        elif factor > (most := max_factor(facts)):
            found.append(
                f"ctx_extend = {factor:g} is beyond what model '{name}' supports ({most:g}x its "
                f"training context of {facts.get('context_length')}): set {where}.ctx_extend "
                f"to at most {most:g}"
            )
    if settings.cache_reuse is not None and settings.cache_reuse >= ctx:
        found.append(
            f"cache_reuse = {settings.cache_reuse} is not below the model's ctx ({ctx}): no "
            f"chunk that size fits; lower {where}.cache_reuse (0 turns it off)"
        )
    return found


def flags(settings: CacheSettings, *, train_ctx: int | None) -> list[str]:
    """llama-server's flags for the settings (none for what is left to the engine)."""
    out: list[str] = []
    if settings.cache_type is not None:
        out += ["--cache-type-k", settings.cache_type, "--cache-type-v", settings.cache_type]
    if settings.kv_unified is not None:
        out.append("--kv-unified" if settings.kv_unified else "--no-kv-unified")
    if settings.cache_ram_mb is not None:
        out += ["--cache-ram", str(settings.cache_ram_mb)]
    if settings.cache_reuse is not None:
        out += ["--cache-reuse", str(settings.cache_reuse)]
    if settings.ctx_extend is not None:
        out += ["--rope-scaling", "yarn", "--rope-scale", f"{settings.ctx_extend:g}"]
        if train_ctx:
            out += ["--yarn-orig-ctx", str(train_ctx)]
    if settings.load_mode is not None:
        out += ["--load-mode", settings.load_mode]
    if settings.flash_attn is not None:
        out += ["--flash-attn", settings.flash_attn]
    if settings.deterministic:
        out += ["--seed", str(DETERMINISTIC_SEED)]
    return out
