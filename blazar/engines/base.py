"""What every install method produces, where engines live on disk, and which processes run them.

Layout: `<data>/engines/<kind>/<tag>/` holds one engine; installs are built in
`<data>/engines/<kind>/.tmp-<uuid>/` and renamed into place only once they
passed their checks, so a half-made engine is never visible.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from blazar.errors import AlreadyExists

KIND = "llamacpp"
METHODS = ("wheel", "release", "source")


@dataclass(frozen=True)
class InstalledEngine:
    """An engine on disk, ready to be recorded in the store."""

    kind: str
    tag: str  # b11549-cpu
    method: str  # wheel | release | source
    version: str  # xllamacpp version, release tag, or source commit
    path: Path  # the engine's directory
    command: list[str]  # argv that starts a llama-server-compatible server; flags follow
    details: dict[str, str] = field(default_factory=dict)


def lane_dir(engines_root: Path, kind: str = KIND) -> Path:
    return engines_root / kind


@contextmanager
def staging(engines_root: Path, tag: str, kind: str = KIND) -> Iterator[tuple[Path, Path]]:
    """Yield (temporary dir, final dir) for building engine `tag`.

    The caller fills the temporary dir and renames it with `publish`; on any
    error the temporary dir is removed. Refuses a tag that is already installed.
    """
    root = lane_dir(engines_root, kind)
    root.mkdir(parents=True, exist_ok=True)
    final = root / tag
    if final.exists():
        raise AlreadyExists(f"engine {kind} {tag} is already installed at {final}")
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        yield tmp, final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, final: Path) -> None:
    """Make a finished engine visible under its final name, atomically."""
    os.rename(tmp, final)


def processes_using(engine_dir: Path) -> list[int]:
    """PIDs of running processes started from files under `engine_dir` (Linux /proc)."""
    prefix = str(engine_dir.resolve()) + os.sep
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").startswith(prefix) for arg in argv):
            found.append(int(entry.name))
    return sorted(found)
