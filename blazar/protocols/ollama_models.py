"""ollama's model listings (`/api/tags`, `/api/ps`, `/api/show`, `/api/version`), built from data.

Part of the ollama adapter (`blazar.protocols.ollama` re-exports all of it). The
gateway reads its store and scheduler and passes plain values in: a `ModelInfo`
per model (`ModelInfo.from_record` takes a store record as a dict: name, tag, size,
sha256, added_at and the GGUF facts), a `RunningModel` per loaded instance (with
the expiry time the scheduler computed). Nothing here reads a file or a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols.capabilities import template_capabilities

__all__ = ["ModelInfo", "RunningModel", "parameter_size", "ps", "show", "tags", "version"]

# GGUFFacts field -> GGUF key suffix after "<arch>." (general.* and tokenizer.* apart)
_ARCH_KEYS = {
    "context_length": "context_length",
    "embedding_length": "embedding_length",
    "block_count": "block_count",
    "feed_forward_length": "feed_forward_length",
    "head_count": "attention.head_count",
    "head_count_kv": "attention.head_count_kv",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "sliding_window": "attention.sliding_window",
    "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class ModelInfo:
    """One model as the listings show it."""

    name: str
    tag: str = "latest"
    size: int = 0
    sha256: str = ""
    added_at: str = ""
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    chat_template: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ModelInfo:
        """From a store record as a dict; missing fields fall back to its `facts`."""
        facts = dict(record.get("facts") or {})

        def pick(key: str) -> Any:
            value = record.get(key)
            return value if value is not None else facts.get(key)

        return cls(
            name=str(record["name"]),
            tag=str(record.get("tag") or "latest"),
            size=int(pick("size") or 0),
            sha256=str(record.get("sha256") or ""),
            added_at=str(record.get("added_at") or ""),
            architecture=pick("architecture"),
            parameters=pick("parameters"),
            quantization=pick("quantization"),
            context_length=pick("context_length"),
            chat_template=pick("chat_template"),
            facts=facts,
        )

    @property
    def ref(self) -> str:
        """The name clients use: `name:tag`."""
        return f"{self.name}:{self.tag}"


@dataclass(frozen=True)
class RunningModel:
    """A loaded instance: its model, when keep_alive lets it go, its context size."""

    model: ModelInfo
    expires_at: str  # RFC 3339; the scheduler's idea of when it unloads
    context_length: int
    size: int | None = None  # bytes in memory (its footprint); the file size when unknown
    size_vram: int = 0  # of those, the bytes on GPUs (0 on host RAM)


def parameter_size(count: int | None) -> str:
    """A parameter count the way ollama prints it: 268098176 -> "268.10M", 8.0e9 -> "8B"."""
    if not count:
        return ""
    for unit, scale, decimals in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 0)):
        if count >= scale:
            number = count / scale
            if number.is_integer():
                return f"{int(number)}{unit}"
            return f"{number:.{decimals}f}{unit}"
    return str(count)


def _details(model: ModelInfo) -> dict[str, Any]:
    family = model.architecture or ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": parameter_size(model.parameters),
        "quantization_level": model.quantization or "",
    }


def tags(models: Iterable[ModelInfo]) -> dict[str, Any]:
    """The `/api/tags` body: every model Blazar holds."""
    return {
        "models": [
            {
                "name": m.ref,
                "model": m.ref,
                "modified_at": m.added_at,
                "size": m.size,
                "digest": m.sha256,
                "details": _details(m),
            }
            for m in models
        ]
    }


def remote_tag(name: str, host: str) -> dict[str, Any]:
    """An `/api/tags` entry for a model served from another host, in the fields ollama
    uses for its own remote (cloud) models: `remote_model` and `remote_host`."""
    ref = name if ":" in name else f"{name}:latest"
    return {
        "name": ref,
        "model": ref,
        "modified_at": "",
        "size": 0,
        "digest": "",
        "details": _details(ModelInfo(ref.rsplit(":", 1)[0], ref.rsplit(":", 1)[1])),
        "remote_model": name,
        "remote_host": host,
    }


def ps(running: Iterable[RunningModel]) -> dict[str, Any]:
    """The `/api/ps` body: every loaded instance."""
    return {
        "models": [
            {
                "name": r.model.ref,
                "model": r.model.ref,
                "size": r.size if r.size is not None else r.model.size,
                "digest": r.model.sha256,
                "details": _details(r.model),
                "expires_at": r.expires_at,
                "size_vram": r.size_vram,
                "context_length": r.context_length,
            }
            for r in running
        ]
    }


def _model_info(model: ModelInfo) -> dict[str, Any]:
    """GGUF metadata keys, as ollama's `model_info` shows them."""
    arch = model.architecture or str(model.facts.get("architecture") or "unknown")
    info: dict[str, Any] = {"general.architecture": arch}
    if model.facts.get("name"):
        info["general.name"] = model.facts["name"]
    if model.parameters:
        info["general.parameter_count"] = model.parameters
    for fact, suffix in _ARCH_KEYS.items():
        value = model.context_length if fact == "context_length" else model.facts.get(fact)
        if value is not None:
            info[f"{arch}.{suffix}"] = value
    if model.facts.get("tokenizer_model"):
        info["tokenizer.ggml.model"] = model.facts["tokenizer_model"]
    # Facts already keyed the GGUF way (from a full header read) pass through.
    info.update({k: v for k, v in model.facts.items() if "." in k})
    return dict(sorted(info.items()))


def _capabilities(
    model: ModelInfo, *, embedding: bool, has_vision: bool, has_infill: bool
) -> list[str]:
    if embedding:
        return ["embedding"]
    found = template_capabilities(model.chat_template)
    caps = ["completion"]
    if found.tools:
        caps.append("tools")
    if found.thinking:
        caps.append("thinking")
    if has_vision:
        caps.append("vision")
    if has_infill:
        caps.append("insert")
    return caps


def show(
    model: ModelInfo,
    *,
    context_length: int | None = None,
    parameters: Mapping[str, Any] | None = None,
    embedding: bool = False,
    has_vision: bool = False,
    has_infill: bool = False,
) -> dict[str, Any]:
    """The `/api/show` body.

    `context_length` is the context the model is served with (the manifest's `ctx`),
    shown as the `num_ctx` parameter; `parameters` adds other serving defaults.
    `embedding` marks a model served for embeddings only.
    """
    params = dict(parameters or {})
    if context_length is not None:
        params = {"num_ctx": context_length, **params}
    parameter_lines = "\n".join(f"{k:<30} {_value(v)}" for k, v in params.items())
    modelfile = [f"# Modelfile generated by Blazar\nFROM {model.ref}"]
    if model.chat_template:
        modelfile.append(f'TEMPLATE """{model.chat_template}"""')
    modelfile += [f"PARAMETER {k} {_value(v)}" for k, v in params.items()]
    license_ = model.facts.get("license")
    if isinstance(license_, str) and license_:
        modelfile.append(f'LICENSE """{license_}"""')
    out = {
        "modelfile": "\n".join(modelfile) + "\n",
        "parameters": parameter_lines,
        "template": model.chat_template or "",
        "details": _details(model),
        "model_info": _model_info(model),
        "capabilities": _capabilities(
            model, embedding=embedding, has_vision=has_vision, has_infill=has_infill
        ),
        "modified_at": model.added_at,
    }
    if isinstance(license_, str) and license_:
        out["license"] = license_
    return out


def _value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def version(value: str) -> dict[str, Any]:
    """The `/api/version` body. Clients compare it with ollama's releases to enable
    features, so the gateway passes the ollama version whose API it matches."""
    return {"version": value}
