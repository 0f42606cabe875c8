"""Will a model fit? Memory for weights + KV cache + compute, against what the machine has.

The estimate (every term is reported by `blazar fit --json`):

    weights  = size of the GGUF file (tensor bytes plus a small header)
    kv/token = layers x kv_heads x (key_length + value_length) x bytes per cache element
    kv       = kv/token x ctx
    compute  = 4 bytes x ubatch (512) x (vocab + 4 x embedding + feed_forward) + 32 MiB
    prompt cache = cache_ram_mb MiB when it is set and the budget is system RAM
    projector = size of the vision projector (mmproj GGUF), for a model that has one

`blazar fit` takes ctx (times slots), cache_type, ctx_extend and cache_ram_mb from
the manifest when the model is declared there, as serve would start it.
`compute` approximates llama.cpp's scratch buffers: the logits of one
micro-batch dominate for large vocabularies. Sliding-window layers (Gemma 3)
need less KV cache than counted here, so the estimate errs on the safe side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blazar.errors import InvalidInput
from blazar.host.hardware import Device

CACHE_TYPES = ("f16", "q8_0", "q4_0")
DEFAULT_CTX = 4096
UBATCH = 512
COMPUTE_FIXED = 32 * 1024 * 1024


def cache_bytes_per_element(cache_type: str) -> float:
    if cache_type not in CACHE_TYPES:
        raise InvalidInput(
            f"unknown cache type {cache_type!r}: choose one of {', '.join(CACHE_TYPES)}"
        )
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # numpy: only when estimating

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[cache_type.upper()]]
    return size / block


@dataclass(frozen=True)
class FitReport:
    model: str
    ctx: int
    cache_type: str
    terms: dict[str, Any]
    weights: int
    kv_per_token: int
    kv: int
    compute: int
    needed: int
    devices: list[dict[str, Any]]
    budget_device: str
    available: int
    fits: bool
    max_ctx: int
    context_length: int | None
    prompt_cache: int = 0
    notes: list[str] = field(default_factory=list)
    projector: int = 0
    # ctx is past what the model was trained for (times ctx_extend): memory may hold it,
    # but the answers past the training context are not the model's
    beyond_training: bool = False


def estimate(
    model: str,
    facts: dict[str, Any],
    devices: list[Device],
    *,
    ctx: int | None,
    cache_type: str,
    ctx_extend: float | None = None,
    cache_ram_mb: int | None = None,
    projector: int = 0,
) -> FitReport:
    """Pure: the fit of one model's facts on the given devices. `ctx_extend` (YaRN) raises
    the largest context to that factor of the training context; `cache_ram_mb` is the
    engine's host-memory prompt cache, counted when the budget is system RAM; `projector`
    the bytes of its vision projector (the engine loads it beside the model)."""
    per_elem = cache_bytes_per_element(cache_type)
    layers = facts.get("block_count") or 0
    heads = facts.get("head_count") or 0
    kv_heads = facts.get("head_count_kv") or heads
    embd = facts.get("embedding_length") or 0
    head_dim = embd // heads if heads else 0
    key_len = facts.get("key_length") or head_dim
    value_len = facts.get("value_length") or head_dim
    vocab = facts.get("vocab_size") or 0
    ff = facts.get("feed_forward_length") or 0
    train_ctx = facts.get("context_length")
    notes: list[str] = []
    if not layers or not kv_heads or not key_len:
        notes.append("the GGUF lacks attention shape keys; KV cache counted as 0")

    if ctx is None:
        ctx = min(DEFAULT_CTX, train_ctx) if train_ctx else DEFAULT_CTX
    if ctx <= 0:
        raise InvalidInput(f"--ctx must be a positive number of tokens, got {ctx}")
    limit = int(train_ctx * ctx_extend) if train_ctx and ctx_extend else train_ctx
    if limit and ctx > limit:
        extended = f" x ctx_extend {ctx_extend:g}" if ctx_extend else ""
        notes.append(f"ctx {ctx} is above the training context {train_ctx}{extended}")

    weights = int(facts.get("size") or 0)
    kv_per_token = int(layers * kv_heads * (key_len + value_len) * per_elem)
    kv = kv_per_token * ctx
    compute = 4 * UBATCH * (vocab + 4 * embd + ff) + COMPUTE_FIXED
    budget = max(devices, key=lambda d: d.free)
    on_ram = budget.kind != "gpu"
    prompt_cache = cache_ram_mb * 1024 * 1024 if on_ram and cache_ram_mb and cache_ram_mb > 0 else 0
    needed = weights + kv + compute + prompt_cache + projector

    if budget.kind == "gpu" and len(devices) > 1:
        notes.append("budget is the GPU with most free memory; a split across GPUs may hold more")
    room = budget.free - weights - compute - prompt_cache - projector
    max_ctx = max(0, room // kv_per_token) if kv_per_token else (limit or 0)
    if limit:
        max_ctx = min(max_ctx, limit)
    if room <= 0:
        max_ctx = 0
    return FitReport(
        model=model,
        ctx=ctx,
        cache_type=cache_type,
        terms={
            "layers": layers,
            "kv_heads": kv_heads,
            "key_length": key_len,
            "value_length": value_len,
            "bytes_per_cache_element": per_elem,
            "vocab_size": vocab,
            "embedding_length": embd,
            "feed_forward_length": ff,
            "ubatch": UBATCH,
            "compute_fixed": COMPUTE_FIXED,
            "ctx_extend": ctx_extend,
            "cache_ram_mb": cache_ram_mb,
            "formula": "needed = weights + kv_per_token * ctx + compute + prompt_cache + projector",
        },
        weights=weights,
        kv_per_token=kv_per_token,
        kv=kv,
        compute=compute,
        needed=needed,
        devices=[d.to_dict() for d in devices],
        budget_device=f"{budget.kind}:{budget.index} ({budget.name})",
        available=budget.free,
        fits=needed <= budget.free,
        max_ctx=int(max_ctx),
        context_length=train_ctx,
        prompt_cache=prompt_cache,
        notes=notes,
        projector=projector,
        beyond_training=bool(limit and ctx > limit),
    )
