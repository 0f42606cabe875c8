"""A fake-but-faithful ollama models directory for tests of `ollama://` sources.

Laid out the way ollama lays out `~/.ollama/models` (or `$OLLAMA_MODELS`):

    manifests/registry.ollama.ai/<namespace>/<name>/<tag>   JSON: schemaVersion 2, a config
                                                          blob and layers with mediaTypes
    blobs/sha256-<hex>                                    content-addressed files

The model layer (`application/vnd.ollama.image.model`) holds the GGUF bytes;
template, params and license layers and the config blob are there too, as
ollama writes them, so a reader has to pick the right layer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HOST = "registry.ollama.ai"


def _blob(store: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    blobs = store / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}", len(data)


def _layer(store: Path, media_type: str, data: bytes) -> dict[str, object]:
    digest, size = _blob(store, data)
    return {"mediaType": media_type, "digest": digest, "size": size}


def write_ollama_model(
    store: Path,
    name: str,
    tag: str = "latest",
    *,
    gguf: bytes,
    model_layer: bool = True,
    params: dict[str, object] | None = None,
    system: str | None = None,
    adapter: bytes | None = None,
    projector: bytes | None = None,
    host: str = HOST,
) -> Path:
    """Store a model as `ollama pull name:tag` (or `ollama create` from a Modelfile with
    PARAMETER, SYSTEM and ADAPTER lines; a vision model with its projector) would; return
    the GGUF blob's path."""
    media = "application/vnd.ollama.image."
    layers = []
    if model_layer:
        layers.append(_layer(store, media + "model", gguf))
    if adapter is not None:
        layers.append(_layer(store, media + "adapter", adapter))
    if projector is not None:  # a vision model: its mmproj
        layers.append(_layer(store, media + "projector", projector))
    if system is not None:
        layers.append(_layer(store, media + "system", system.encode()))
    layers += [
        _layer(store, media + "template", b"{{ .Prompt }}"),
        _layer(store, media + "params", json.dumps(params or {"stop": ["<|im_end|>"]}).encode()),
        _layer(store, media + "license", b"MIT License\n"),
    ]
    config = json.dumps(
        {"model_format": "gguf", "model_family": "llama", "file_type": "F16"}
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": _layer(store, "application/vnd.docker.container.image.v1+json", config),
        "layers": layers,
    }
    namespace, _, short = name.rpartition("/")
    path = store / "manifests" / host / (namespace or "library") / short / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    digest = hashlib.sha256(gguf).hexdigest()
    return store / "blobs" / f"sha256-{digest}"
