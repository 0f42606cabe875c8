"""A llama-server command line as a model declaration: the flags Blazar has fields for.

Pure: `map_command(words, base)` takes the words after the program name and
returns the fields (`source`, `ctx`, `slots`, `params`, cache and loading
fields, ...), the LoRA adapters it names, the flags kept as `args` (extra
llama-server flags Blazar passes through as given) and what it cannot carry
(`(flag, value, why)`: flags Blazar reserves for itself or that need a decision,
such as a key or a URL without a sha256). `blazar.migrate.llama_swap` calls it
for each model's `cmd`. Relative paths are taken from `base` (the config's
directory).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specs.fields import MODEL_PARAMS
from specs.models import _RESERVED_ARGS  # flags `args` may not carry: each has a field

# Flags that take a value: llama-server's vocabulary (a flag not here that is followed
# by a word not starting with '-' is taken to take it, and kept as args).
_SAMPLING = {
    "--temp": "temperature",
    "--temperature": "temperature",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--typical": "typical_p",
    "--typical-p": "typical_p",
    "--repeat-penalty": "repeat_penalty",
    "--repeat-last-n": "repeat_last_n",
    "--presence-penalty": "presence_penalty",
    "--frequency-penalty": "frequency_penalty",
    "--mirostat": "mirostat",
    "--mirostat-lr": "mirostat_eta",
    "--mirostat-ent": "mirostat_tau",
    "-s": "seed",
    "--seed": "seed",
    "--keep": "num_keep",
    "-n": "num_predict",
    "--n-predict": "num_predict",
    "--predict": "num_predict",
}
_BOOLEAN = {
    "--jinja",
    "--no-jinja",
    "--embedding",
    "--embeddings",
    "--rerank",
    "--reranking",
    "--mlock",
    "--no-mmap",
    "--mmap",
    "-kvu",
    "--kv-unified",
    "-no-kvu",
    "--no-kv-unified",
    "--metrics",
    "--slots",
    "--no-slots",
    "--props",
    "--no-warmup",
    "--cont-batching",
    "-cb",
    "--no-cont-batching",
    "-nocb",
    "--verbose",
    "-v",
    "--log-disable",
    "--no-webui",
    "--no-repack",
    "--check-tensors",
    "--cache-prompt",
    "--no-cache-prompt",
    "-fa",
}
_BLAZAR_OWNS = {
    "--port": "Blazar picks each child's port",
    "--host": "Blazar binds its children to loopback",
    "--api-key": "the key between llama-swap and its child; clients' keys are Blazar's "
    "[keys] (`blazar keys add`)",
    "--api-key-file": "as --api-key",
    "--slot-save-path": "Blazar keeps sessions under its data directory",
    "--lora-init-without-apply": "Blazar loads adapters and sets their scales itself",
    "--models-dir": "llama-server's router mode: declare each model instead",
    "--models-max": "llama-server's router mode: use serving.max_loaded_models",
}


@dataclass
class Mapped:
    """What one command line declares."""

    fields: dict[str, Any] = field(default_factory=dict)
    loras: list[dict[str, Any]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    unmapped: list[tuple[str, str, str]] = field(default_factory=list)


def _path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _number(value: str, kind: type) -> int | float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    if kind is int:
        return int(number) if number.is_integer() else None
    return int(number) if number.is_integer() else number


def _takes_value(flag: str, nxt: str | None) -> bool:
    if flag in _BOOLEAN or nxt is None:
        return False
    return not nxt.startswith("-") or re.fullmatch(r"-[0-9.]+", nxt) is not None


def map_command(words: list[str], base: Path) -> Mapped:
    """The declaration a llama-server command line (without the program) makes."""
    out = Mapped()
    params: dict[str, Any] = {}
    hf: dict[str, str] = {}
    cache: dict[str, str] = {}
    load: set[str] = set()
    rope: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        nxt = inline if eq else (words[i + 1] if i + 1 < len(words) else None)
        takes = bool(eq) or _takes_value(flag, nxt)
        if flag == "-fa" or flag == "--flash-attn":  # a bare flag once, a value now
            takes = bool(eq) or nxt in ("on", "off", "auto")
        value = nxt if takes else None
        i += 1 + (1 if takes and not eq else 0)
        handler = _HANDLERS.get(flag)
        if flag in _SAMPLING and value is not None:
            key = _SAMPLING[flag]
            number = _number(value, MODEL_PARAMS[key])
            if number is None:
                out.unmapped.append((flag, value, f"{key} takes a number"))
            else:
                params[key] = number
        elif flag in _BLAZAR_OWNS:
            if flag not in ("--port", "--host"):  # always set; nothing to say about them
                out.unmapped.append((flag, value or "", _BLAZAR_OWNS[flag]))
        elif flag in ("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file") and value is not None:
            hf["file" if flag in ("-hff", "--hf-file") else "repo"] = value
        elif flag in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v") and value:
            cache[flag[-1]] = value  # -ctk / --cache-type-k: "k"; the others "v"
        elif flag in ("--mlock", "--no-mmap", "--mmap"):
            load.add(flag)
        elif flag in ("--rope-scaling", "--rope-scale", "--yarn-orig-ctx") and value:
            rope[flag] = value
        elif handler is not None:
            handler(out, value, base)
        elif flag in _RESERVED_ARGS:  # a field covers it, but not this use of it
            out.unmapped.append(
                (flag, value or "", f"Blazar sets it itself: {_RESERVED_ARGS[flag]}")
            )
        elif flag.startswith("-"):
            out.args += [flag, value] if value is not None else [flag]
        else:
            out.unmapped.append(("argument", word, "a word that follows no flag"))
    if params:
        out.fields["params"] = params
    _source(out, hf)
    _cache(out, cache)
    _load(out, load)
    _rope(out, rope)
    return out


def _source(out: Mapped, hf: dict[str, str]) -> None:
    if "repo" not in hf:
        if "file" in hf:
            out.unmapped.append(("--hf-file", hf["file"], "it needs --hf-repo"))
        return
    repo, _, quant = hf["repo"].partition(":")
    if "file" in hf:
        out.fields["source"] = f"hf://{repo}/{hf['file']}"
    else:
        out.fields["source"] = f"hf://{repo}:{quant}" if quant else f"hf://{repo}"


def _cache(out: Mapped, cache: dict[str, str]) -> None:
    if not cache:
        return
    kinds = set(cache.values())
    if len(kinds) == 1 and len(cache) == 2 and kinds <= {"f16", "q8_0", "q4_0"}:
        out.fields["cache_type"] = kinds.pop()
    elif len(kinds) == 1 and kinds <= {"f16", "q8_0", "q4_0"} and "k" in cache:
        out.fields["cache_type"] = cache["k"]
        out.unmapped.append(("-ctv", "f16", "Blazar's cache_type sets K and V alike"))
    else:
        text = ", ".join(f"{k}={v}" for k, v in sorted(cache.items()))
        out.unmapped.append(
            ("-ctk/-ctv", text, "cache_type is one type (f16, q8_0 or q4_0) for K and V")
        )


def _load(out: Mapped, load: set[str]) -> None:
    if not load - {"--mmap"}:
        return
    mmap = "--no-mmap" not in load
    mlock = "--mlock" in load
    out.fields["load_mode"] = ("mmap+mlock" if mmap else "mlock") if mlock else "none"


def _rope(out: Mapped, rope: dict[str, str]) -> None:
    if not rope:
        return
    scale = _number(rope.get("--rope-scale", ""), float)
    if rope.get("--rope-scaling") == "yarn" and scale is not None and scale > 1:
        out.fields["ctx_extend"] = float(scale)
    else:
        text = " ".join(f"{k} {v}" for k, v in rope.items())
        out.unmapped.append(("rope", text, "Blazar extends context with YaRN only: ctx_extend"))


def _model(out: Mapped, value: str | None, base: Path) -> None:
    if value:
        out.fields["source"] = _path(value, base).as_uri()


def _int_field(
    name: str, *, minimum: int = 0, zero_means_default: bool = False
) -> Callable[..., None]:
    def handle(out: Mapped, value: str | None, base: Path) -> None:
        number = _number(value or "", int)
        if number is None or number < minimum:
            out.unmapped.append((name, value or "", f"{name} takes a whole number"))
        elif number == 0 and zero_means_default:
            return  # 0: the model's own (ctx) or the default: nothing to declare
        else:
            out.fields[name] = int(number)

    return handle


def _alias(out: Mapped, value: str | None, base: Path) -> None:
    for alias in (value or "").split(","):
        if alias.strip():
            out.fields.setdefault("aliases", []).append(alias.strip())


def _template(out: Mapped, value: str | None, base: Path) -> None:
    if value:
        out.fields["chat_template"] = value


def _template_file(out: Mapped, value: str | None, base: Path) -> None:
    if value:
        out.fields["chat_template"] = str(_path(value, base))


def _flash(out: Mapped, value: str | None, base: Path) -> None:
    out.fields["flash_attn"] = value if value in ("on", "off", "auto") else "on"


def _embeddings(out: Mapped, value: str | None, base: Path) -> None:
    out.fields["embeddings"] = True


def _rerank(out: Mapped, value: str | None, base: Path) -> None:
    out.fields["embeddings"] = True
    out.fields["pooling"] = "rank"


def _pooling(out: Mapped, value: str | None, base: Path) -> None:
    if value in ("mean", "cls", "last", "none", "rank"):
        out.fields["pooling"] = value
    else:
        out.unmapped.append(("--pooling", value or "", "pooling is mean, cls, last, none or rank"))


def _kv_unified(on: bool) -> Callable[..., None]:
    def handle(out: Mapped, value: str | None, base: Path) -> None:
        out.fields["kv_unified"] = on

    return handle


def _lora(out: Mapped, value: str | None, base: Path) -> None:
    for path in (value or "").split(","):
        if path.strip():
            out.loras.append({"source": _path(path.strip(), base).as_uri()})


def _lora_scaled(out: Mapped, value: str | None, base: Path) -> None:
    # `--lora-scaled FILE:SCALE` (now), `--lora-scaled FILE SCALE` (once): the first form
    for item in (value or "").split(","):
        path, _, scale = item.strip().rpartition(":")
        number = _number(scale, float)
        if not path or number is None:
            out.unmapped.append(("--lora-scaled", item, "write FILE:SCALE"))
            continue
        out.loras.append({"source": _path(path, base).as_uri(), "scale": float(number)})


def _model_url(out: Mapped, value: str | None, base: Path) -> None:
    out.unmapped.append(
        (
            "--model-url",
            value or "",
            "an https:// source needs its sha256: declare source and "
            "sha256 by hand (or `blazar pull URL --sha256 HEX`)",
        ),
    )


def _load_mode(out: Mapped, value: str | None, base: Path) -> None:
    if value in ("mmap", "none", "mlock", "mmap+mlock"):
        out.fields["load_mode"] = value
    else:
        out.unmapped.append(
            ("--load-mode", value or "", "load_mode is mmap, none, mlock or mmap+mlock")
        )


def _mmproj(out: Mapped, value: str | None, base: Path) -> None:
    if value:
        out.fields["mmproj"] = _path(value, base).as_uri()


def _mmproj_url(out: Mapped, value: str | None, base: Path) -> None:
    out.unmapped.append(
        (
            "--mmproj-url",
            value or "",
            "an https:// projector needs its sha256: set mmproj and mmproj_sha256 by hand",
        ),
    )


def _jinja(out: Mapped, value: str | None, base: Path) -> None:
    """On by default: nothing to declare."""


_HANDLERS: dict[str, Callable[[Mapped, str | None, Path], None]] = {
    "-m": _model,
    "--model": _model,
    "-mu": _model_url,
    "--model-url": _model_url,
    "-c": _int_field("ctx", zero_means_default=True),
    "--ctx-size": _int_field("ctx", zero_means_default=True),
    "-np": _int_field("slots"),
    "--parallel": _int_field("slots"),
    "-a": _alias,
    "--alias": _alias,
    "--jinja": _jinja,
    "--chat-template": _template,
    "--chat-template-file": _template_file,
    "-fa": _flash,
    "--flash-attn": _flash,
    "--embedding": _embeddings,
    "--embeddings": _embeddings,
    "--rerank": _rerank,
    "--reranking": _rerank,
    "--pooling": _pooling,
    "-kvu": _kv_unified(True),
    "--kv-unified": _kv_unified(True),
    "-no-kvu": _kv_unified(False),
    "--no-kv-unified": _kv_unified(False),
    "-cram": _int_field("cache_ram_mb", minimum=-1),
    "--cache-ram": _int_field("cache_ram_mb", minimum=-1),
    "--cache-reuse": _int_field("cache_reuse"),
    "--lora": _lora,
    "--lora-scaled": _lora_scaled,
    "-lm": _load_mode,
    "--load-mode": _load_mode,
    "-mm": _mmproj,
    "--mmproj": _mmproj,
    "-mmu": _mmproj_url,
    "--mmproj-url": _mmproj_url,
}
