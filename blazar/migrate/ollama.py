"""`blazar migrate ollama`: every model of a local ollama store as manifest entries.

Ollama keeps what a Modelfile made as layers of each model's manifest
(`manifests/<host>/<namespace>/<model>/<tag>`, read as `blazar.sources.ollama`
reads them): the GGUF (`...image.model`), `params` (JSON: PARAMETER lines),
`system` (SYSTEM), `adapter` (ADAPTER: a LoRA GGUF), `template` (TEMPLATE, a Go
template), `projector` (a vision projector), `messages` (MESSAGE) and `license`.
Mapped: the model as `ollama://name:tag` (models of other hosts, such as
`hf.co/...`, as the blob's `file://` path) with the layer's sha256, so applying
it hardlinks ollama's blob into Blazar's store (never copies, moves or changes
it); `num_ctx` as `ctx`, the sampling parameters Blazar keeps as `params`;
SYSTEM as `system`; each ADAPTER as an always-on `[loras]` entry of its blob; a
projector as the model's `mmproj` (its blob, with `mmproj_sha256`).
The rest is listed with why (`blazar.migrate.Unmapped`). Reads only; pure apart
from reading the store's small JSON and text layers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blazar.errors import NotFound
from blazar.migrate import Migrated, clean_name, unique
from blazar.sources.ollama import HOST, MODEL_MEDIA_TYPE, ollama_store
from specs.fields import MODEL_PARAMS

PREFIX = "application/vnd.ollama.image."
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
TEXT_LIMIT = 1 << 20  # a params, system or template layer is small text
WHY = {
    "template": "a Go template; Blazar applies the GGUF's own Jinja chat template (or set "
    "chat_template: a template Blazar ships such as chatml, Jinja text or a .jinja file)",
    "messages": "Blazar keeps no conversation with a model: send the messages with each request",
    "license": "Blazar keeps no license text with a model (the GGUF's general.license stays)",
}


def _layers(manifest: Path) -> list[dict[str, Any]] | None:
    try:
        layers = json.loads(manifest.read_text()).get("layers")
    except (OSError, ValueError, AttributeError):
        return None
    return [x for x in layers if isinstance(x, dict)] if isinstance(layers, list) else None


def _digest(layer: dict[str, Any]) -> str | None:
    match = _DIGEST.fullmatch(str(layer.get("digest", "")))
    return match.group(1) if match else None


def _text(store: Path, digest: str) -> str | None:
    blob = store / "blobs" / f"sha256-{digest}"
    try:
        if blob.stat().st_size > TEXT_LIMIT:
            return None
        return blob.read_text(errors="replace")
    except OSError:
        return None


def migrate_store(env: Mapping[str, str], store: Path | None = None) -> Migrated:
    """Every model in ollama's store (`store`, else where ollama keeps it) as declarations."""
    default = ollama_store(env)
    store = store or default
    manifests = store / "manifests"
    if not manifests.is_dir():
        raise NotFound(
            f"no ollama model store at {store} (set OLLAMA_MODELS, or pass --store DIR, if "
            "ollama keeps its models elsewhere)"
        )
    out = Migrated(origin=f"the ollama store {store}")
    taken: set[str] = set()
    for path in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = path.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        host, namespace, model, tag = parts
        full = model if namespace == "library" else f"{namespace}/{model}"
        origin = f"{full}:{tag}" if host == HOST else f"{host}/{full}:{tag}"
        # ollama:// finds the model where ollama keeps it; another store is named by path
        named = host == HOST and store.resolve() == default.resolve()
        _one(out, store, path, named, full, tag, origin, taken)
    if not taken:
        out.notes.append(f"ollama's store {store} holds no model with a GGUF layer.")
    return out


def _one(
    out: Migrated,
    store: Path,
    path: Path,
    named: bool,
    full: str,
    tag: str,
    origin: str,
    taken: set[str],
) -> None:
    where = f"ollama {origin}"
    layers = _layers(path)
    if layers is None:
        out.skip(where, str(path), "its manifest cannot be read: `ollama pull` it again")
        return
    models = [x for x in layers if x.get("mediaType") == MODEL_MEDIA_TYPE and _digest(x)]
    if not models:
        out.skip(where, "no GGUF layer", "Blazar serves GGUF models (a cloud or remote model?)")
        return
    name = unique(clean_name(f"{full.rsplit('/', 1)[-1]}:{tag}"), taken)
    digest = str(_digest(models[0]))
    blob = store / "blobs" / f"sha256-{digest}"
    source = f"ollama://{full}:{tag}" if named else blob.as_uri()
    fields: dict[str, Any] = {"source": source, "sha256": digest}
    for extra in models[1:]:
        out.skip(
            f"{where} model layer", _digest(extra), "a second GGUF layer; Blazar uses the first"
        )
    for layer in layers:
        kind = str(layer.get("mediaType", "")).removeprefix(PREFIX)
        layer_digest = _digest(layer)
        if kind == "model" or layer_digest is None:
            continue
        if kind == "params":
            _params(out, where, _text(store, layer_digest), fields)
        elif kind == "system":
            system = _text(store, layer_digest)
            if system and system.strip():
                fields["system"] = system
        elif kind == "projector":  # a vision projector: the model's mmproj
            fields["mmproj"] = (store / "blobs" / f"sha256-{layer_digest}").as_uri()
            fields["mmproj_sha256"] = layer_digest
        elif kind == "adapter":
            lora = unique(clean_name(f"{name.replace(':', '-')}-adapter"), taken)
            adapter = store / "blobs" / f"sha256-{layer_digest}"
            out.declare(
                "loras",
                lora,
                {
                    "model": name,
                    "source": adapter.as_uri(),
                    "sha256": layer_digest,
                    "always_on": True,
                },
            )
        elif kind in WHY:
            text = _text(store, layer_digest) if kind == "template" else layer_digest
            out.skip(f"{where} {kind.upper()}", text or layer_digest, WHY[kind])
        else:
            out.skip(f"{where} layer", kind, "a layer Blazar does not know")
    out.declare("models", name, fields)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _params(out: Migrated, where: str, text: str | None, fields: dict[str, Any]) -> None:
    try:
        params = json.loads(text or "{}")
    except ValueError:
        out.skip(f"{where} PARAMETER", text, "not JSON: set params by hand")
        return
    if not isinstance(params, dict):
        out.skip(f"{where} PARAMETER", params, "not an object: set params by hand")
        return
    kept: dict[str, Any] = {}
    for key, value in params.items():
        kind = MODEL_PARAMS.get(key)
        if key == "num_ctx" and isinstance(value, int) and value > 0:
            fields["ctx"] = value
        elif kind is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
            kept[key] = value
        elif kind is list and isinstance(value, str):
            kept[key] = [value]
        elif (
            kind in (int, float) and isinstance(value, int | float) and not isinstance(value, bool)
        ):
            kept[key] = int(value) if kind is int else value
        else:
            out.skip(
                f"{where} PARAMETER {key}",
                value,
                "not a sampling default Blazar keeps (it keeps num_ctx as ctx and "
                f"{', '.join(sorted(MODEL_PARAMS))}); set it per request or in args",
            )
    if kept:
        fields["params"] = kept
