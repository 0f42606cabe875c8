"""Use a model from ollama's local store (`ollama://name[:tag]`), read-only.

Called by `blazar.sources.fetch`. Ollama keeps models as OCI-style manifests
(`manifests/registry.ollama.ai/<namespace>/<name>/<tag>`, JSON with layers)
and content-addressed blobs (`blobs/sha256-<hex>`); the layer whose
mediaType is `application/vnd.ollama.image.model` is the GGUF file. Its blob
is checked against the layer's size and digest and returned as is, for the
registry to hardlink: Blazar never writes to, moves or deletes ollama's files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.errors import VerificationFailed
from blazar.sources.base import Fetched, FetchError, check_gguf, verify_sha256
from specs.sources import OllamaSource

HOST = "registry.ollama.ai"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
# Where ollama keeps models when OLLAMA_MODELS is unset: a user's install, then
# the Linux service install (which runs as the `ollama` user).
SYSTEM_STORES = (Path("/usr/share/ollama/.ollama/models"), Path("/var/lib/ollama/.ollama/models"))
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


@dataclass(frozen=True)
class Layer:
    store: Path
    manifest: Path
    digest: str  # hex
    size: int
    blob: Path


def ollama_store(env: Mapping[str, str]) -> Path:
    """Ollama's models directory: OLLAMA_MODELS, else the first default that exists."""
    explicit = env.get("OLLAMA_MODELS")
    if explicit:
        return Path(explicit).expanduser()
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    candidates = (home / ".ollama" / "models", *SYSTEM_STORES)
    return next((c for c in candidates if (c / "manifests").is_dir()), candidates[0])


def manifest_path(store: Path, source: OllamaSource) -> Path:
    namespace, _, name = source.name.rpartition("/")
    return store / "manifests" / HOST / (namespace or "library") / name / source.tag


def model_layer(source: OllamaSource, env: Mapping[str, str]) -> Layer:
    """Find the GGUF layer of an ollama model; raise FetchError saying what was looked for."""
    store = ollama_store(env)
    pull = f"run `ollama pull {source.name}:{source.tag}`"
    if not (store / "manifests").is_dir():
        raise FetchError(
            f"no ollama model store at {store} (set OLLAMA_MODELS if ollama keeps its models "
            f"elsewhere); to get {source}, {pull}"
        )
    path = manifest_path(store, source)
    if not path.parent.is_dir():
        raise FetchError(f"ollama has no model {source.name!r} in {store}; {pull}")
    if not path.is_file():
        tags = sorted(p.name for p in path.parent.iterdir() if p.is_file())
        raise FetchError(
            f"ollama has {source.name!r} but not tag {source.tag!r} "
            f"(it has: {', '.join(tags) or 'none'}); {pull}"
        )
    try:
        manifest: Any = json.loads(path.read_text())
        layers = [x for x in manifest["layers"] if x.get("mediaType") == MODEL_MEDIA_TYPE]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FetchError(f"cannot read ollama's manifest {path}: {exc}; {pull}") from exc
    if not layers:
        raise FetchError(
            f"ollama's {source} has no GGUF model layer ({MODEL_MEDIA_TYPE}) in {path}; "
            "Blazar can only serve ollama models stored as GGUF"
        )
    layer = layers[0]
    match = _DIGEST.fullmatch(str(layer.get("digest", "")))
    size = layer.get("size")
    if match is None or not isinstance(size, int):
        raise FetchError(f"ollama's manifest {path} has a model layer without a sha256 or size")
    digest = match.group(1)
    return Layer(store, path, digest, size, store / "blobs" / f"sha256-{digest}")


def fetch_ollama(source: OllamaSource, *, sha256: str | None, env: Mapping[str, str]) -> Fetched:
    layer = model_layer(source, env)
    repair = f"run `ollama pull {source.name}:{source.tag}` to repair it"
    if not layer.blob.is_file():
        raise FetchError(f"ollama's blob {layer.blob} for {source} is missing; {repair}")
    actual = layer.blob.stat().st_size
    if actual != layer.size:
        raise VerificationFailed(
            f"ollama's blob {layer.blob} is {actual} bytes but its manifest says {layer.size}: "
            f"it is damaged; {repair}. Nothing was changed."
        )
    digest, size = verify_sha256(layer.blob, None, str(layer.blob))
    if digest != layer.digest:
        raise VerificationFailed(
            f"ollama's blob {layer.blob} has sha256 {digest}, not the {layer.digest} its name "
            f"says: it is damaged; {repair}. Nothing was changed."
        )
    if sha256 and digest != sha256.lower():
        raise VerificationFailed(
            f"sha256 mismatch for {source}: expected {sha256.lower()}, got {digest}; "
            "nothing was kept. Check the sha256 in the manifest or the ollama tag."
        )
    check_gguf(layer.blob, f"ollama's {source}")
    detail = {"store": str(layer.store), "manifest": str(layer.manifest)}
    return Fetched([layer.blob], digest, size, False, {**detail, "digest": f"sha256:{digest}"})
