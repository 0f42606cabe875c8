"""`blazar serve`'s log: configured once, when serve starts (`blazar.serve.daemon.run`).

Every `logging` record of Blazar's (the daemon's own lines, remotes going up and
down, drains, instances that could not start, the session bank) at INFO and above,
and every other library's at WARNING and above, goes to stderr and to
`<logs>/serve.log`, each line with its time and level. When stderr already is that
file (`blazar launch` starts serve with its output there) it is written once.
The file rotates at MAX_BYTES, keeping BACKUPS older ones. Children's output has
logs of its own (`blazar.children.ChildLog`, one per instance).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3
_MARK = "_blazar_serve"  # on the handlers this module installs, so a second call replaces them


def serve_log(logs: Path) -> Path:
    return logs / "serve.log"


def configure(logs: Path, *, stream: object = None) -> Path:
    """Send log records to `stream` (default: stderr) and to serve.log under `logs`; return
    that file's path. Calling it again replaces what an earlier call installed."""
    out = stream if stream is not None else sys.stderr
    path = serve_log(logs)
    path.parent.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(out)]  # type: ignore[arg-type]
    if not _same_file(out, path):
        handlers.append(
            logging.handlers.RotatingFileHandler(
                path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
            )
        )
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries: their warnings and errors
    logging.getLogger("blazar").setLevel(logging.INFO)
    return path


def _same_file(stream: object, path: Path) -> bool:
    """Whether `stream` writes to the file at `path` already (serve's output redirected)."""
    try:
        fileno = stream.fileno()  # type: ignore[attr-defined]
        here = os.fstat(fileno)
        there = path.stat()
    except (AttributeError, OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
