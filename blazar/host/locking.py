"""The apply lock: one apply (or imperative edit) at a time per host.

An advisory `flock` on `<state>/apply.lock`, holding the owner's pid for the
message a waiting apply prints. The kernel drops the lock when its holder
dies, so a killed apply never leaves the host locked. `held` is the probe
`blazar serve` polls after a pass found the lock taken (docs/serve.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from blazar.errors import BlazarError


class LockTimeout(BlazarError):
    """Another apply held the lock for longer than we were willing to wait."""


@contextlib.contextmanager
def apply_lock(
    path: Path, *, timeout: float = 600.0, notify: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the lock for the block; wait up to `timeout` seconds for it (0: refuse at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"another apply (pid {holder}) holds {path}; try again when it is done"
                    ) from None
                if notify and not told:
                    notify(f"waiting for another apply (pid {holder}) to finish ...")
                    told = True
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def held(path: Path) -> bool:
    """Whether someone holds the lock at `path` now. A probe: it takes a shared lock and
    drops it at once, never waits, and leaves the file (and the holder's pid) as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
