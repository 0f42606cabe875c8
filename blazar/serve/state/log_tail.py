"""The children's log files, listed and followed for the dashboard's Logs page (`/ui`).

Each instance's child writes `<state>/logs/<model>-<replica>.log` itself
(`blazar.host.children.DirectLog`, rotated to `.log.1`...: renamed between children,
copied and truncated while one runs). `listing` names the `.log` files directly in the logs
directory (regular files, not links); `pick` gives the path of one of them for a name a
client sent, only when that exact name is in the listing, so nothing outside the
directory (`../`, a link, an absolute path, the audit log) can be opened through it.
`follow` yields the file's last lines and then its new lines as they are written,
reopening it when it is rotated. `blazar.serve.routes.ui_admin` streams them.

A child's line shows up here as soon as the child has written it (within POLL); a
truncation (the rotation while a child runs) is followed like a rotation.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from blazar.errors import NotFound

BACKLOG = 64 * 1024  # bytes of the file's end sent first
POLL = 0.25  # seconds between looks for new lines
MAX_LINE = 16 * 1024  # longer lines are cut (a child printing a whole prompt)


def _regular(entry: os.DirEntry[str]) -> bool:
    try:
        return stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False


def listing(logs: Path) -> list[dict[str, Any]]:
    """The `.log` files directly in `logs`, newest first: name, size, modified time."""
    try:
        entries = list(os.scandir(logs))
    except OSError:
        return []
    rows = []
    for entry in entries:
        if entry.name.endswith(".log") and _regular(entry):
            info = entry.stat(follow_symlinks=False)
            rows.append({"name": entry.name, "size": info.st_size, "modified": info.st_mtime})
    return sorted(rows, key=lambda r: (-r["modified"], r["name"]))


def pick(logs: Path, name: str) -> Path:
    """The log file called `name` in `logs`; NotFound unless `listing` names it."""
    if name not in {row["name"] for row in listing(logs)}:
        raise NotFound(
            f"no log {name!r} under the logs directory; GET /api/ui/logs lists the ones there"
        )
    return logs / name


def _lines(data: bytes) -> list[str]:
    return [line[:MAX_LINE].decode("utf-8", "replace") for line in data.split(b"\n")]


async def follow(path: Path, fh: BinaryIO, stop: asyncio.Event) -> AsyncIterator[list[str]]:
    """The last lines of `path`, open as `fh` (at most BACKLOG bytes), then each batch of
    new ones, until `stop` is set. A rotated file is reopened by its path; the caller
    closes `fh`, this closes the files it opened."""
    first = fh
    try:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - BACKLOG)
        fh.seek(start)
        data = fh.read()
        if start > 0:  # the first line was cut by the seek
            data = data.partition(b"\n")[2]
        pending = b""
        while True:
            if data:
                *whole, pending = (pending + data).split(b"\n")
                if whole:
                    yield _lines(b"\n".join(whole))
            try:
                await asyncio.wait_for(stop.wait(), POLL)
                return
            except TimeoutError:
                pass
            data = fh.read()
            if data:
                continue
            try:
                now = os.stat(path)
            except OSError:
                continue  # between the rotation's renames: look again
            mine = os.fstat(fh.fileno())
            if now.st_ino != mine.st_ino or now.st_size < fh.tell():  # rotated or truncated
                if pending:
                    yield _lines(pending)
                    pending = b""
                fh.close()
                fh = path.open("rb")
                data = fh.read()
    finally:
        if fh is not first:
            fh.close()
