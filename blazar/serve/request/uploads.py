"""What the HTTP API may read from the server's disk, and how long uploads are kept.

A client of `/api/create` or `/api/pull` names files on the *server*; unchecked,
that reads and registers any file serve can open (another user's model, or
`/etc/shadow` hashed and echoed in an error). `permitted` allows only paths in
the store, the uploaded blobs and `serving.import_roots`; it decides on the
path's text first, so nothing outside those is opened, hashed or even looked
up, and `refused` says the same whether such a path exists or not. Manifests
and the CLI are the user's own and read any `file://` source.

Uploads to `/api/blobs` (`ollama_blobs`) are capped by `upload_cap`, and an
upload that no model uses is removed after `UNUSED_TTL` by `sweep`, which the
daemon runs on its timer. Used by `ollama_pull`, `ollama_blobs` and the daemon.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from blazar.paths import Paths
from blazar.protocols import ProtocolError
from blazar.store.db import Store
from specs.manifest import Manifest
from specs.serving import Serving
from specs.sources import FileSource, InvalidSource, parse_source

DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")  # how ollama names a blob
DISK_MARGIN = 1024**3  # free space an upload must leave on the disk
UNUSED_TTL = 3600.0  # an upload no model declares is removed after this many seconds
TMP_PREFIX = ".tmp-"  # an upload in progress; swept like unused blobs if serve died


def blob_dir(paths: Paths) -> Path:
    return paths.cache / "blobs"


def blob_path(paths: Paths, sha256: str) -> Path:
    """Where the upload with this sha256 (64 lowercase hex digits) is kept."""
    return blob_dir(paths) / f"sha256-{sha256}"


def readable_roots(paths: Paths, serving: Serving) -> tuple[Path, ...]:
    """The directories the HTTP API may read models from."""
    return (paths.data / "models", blob_dir(paths), *(Path(r) for r in serving.import_roots))


def permitted(text: str, roots: Sequence[Path]) -> Path | None:
    """The path `text` names, if it lies in one of `roots` (symlinks followed); else None.

    The first test is on the text alone (normalized, `..` folded), so a path outside the
    roots is never looked up; only one that passes is resolved, and checked again."""
    if not os.path.isabs(text) or "\0" in text:
        return None
    lexical = Path(os.path.normpath(text))
    if not any(lexical.is_relative_to(os.path.normpath(root)) for root in roots):
        return None
    real = Path(os.path.realpath(lexical))
    if not any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        return None
    return real


def refused(route: str, text: str) -> ProtocolError:
    """The one answer for a server path the API may not read, whether it exists or not."""
    return ProtocolError(
        403,
        f"{route}: {text!r} is not in a directory the gateway reads models from over HTTP "
        "(the store, uploaded blobs, serving.import_roots): upload the file "
        "(POST /api/blobs/sha256:<digest>, then create with `files`), or add its directory "
        "to serving.import_roots in the manifest",
    )


def check_source(route: str, source: str, roots: Sequence[Path]) -> None:
    """Refuse a `file://` source outside the roots; other sources name no server path."""
    try:
        parsed = parse_source(source)
    except InvalidSource:
        return  # the declaration refuses it, saying why
    if isinstance(parsed, FileSource) and permitted(parsed.path, roots) is None:
        raise refused(route, parsed.path)


def upload_cap(max_upload: int, free_disk: int) -> int:
    """The largest upload accepted now: serving.max_upload, and free disk less a margin."""
    return max(0, min(max_upload, free_disk - DISK_MARGIN))


def unused_blobs(
    entries: Iterable[tuple[Path, float]], used: set[Path], now: float, ttl: float = UNUSED_TTL
) -> list[Path]:
    """The uploads (path, mtime) to remove: older than `ttl` and used by no model."""
    return sorted(path for path, mtime in entries if path not in used and now - mtime > ttl)


def used_blobs(manifest: Manifest, store: Store) -> set[Path]:
    """Files the declared models' sources and the store's records point at."""
    used = {Path(r.path) for r in store.list_models()}
    sources = [m.source for m in manifest.models.values()]
    sources += [r.source for r in store.list_models()]
    for source in sources:
        try:
            parsed = parse_source(source)
        except InvalidSource:
            continue
        if isinstance(parsed, FileSource):
            used.add(Path(parsed.path))
    return used


def sweep(paths: Paths, used: set[Path], now: float | None = None) -> list[Path]:
    """Remove the uploads no model has used within UNUSED_TTL; return what was removed."""
    folder = blob_dir(paths)
    if not folder.is_dir():
        return []
    entries = []
    for entry in folder.iterdir():
        try:
            entries.append((entry, entry.stat().st_mtime))
        except OSError:
            continue
    gone = unused_blobs(entries, used, time.time() if now is None else now)
    for path in gone:
        path.unlink(missing_ok=True)
    return gone
