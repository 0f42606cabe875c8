"""Streaming sha256 of files, in one pass, at disk speed."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 4 * 1024 * 1024


def sha256_file(path: Path) -> tuple[str, int]:
    """Return (sha256 hex, size in bytes) of a file, read once."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
