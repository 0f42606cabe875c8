"""The audit log: admin actions and refused requests as JSON Lines, when `serving.audit_log`.

The access middleware (`blazar.serve.gateway.access`) calls `AuditLog.record` for
every admin-scope request (with its outcome) and every request it refuses
(401, 403, 429). A record holds the time, the key's name (never the key, nor
any header), the client's address, the method, the path (never the query
string) and the status. The file is `<state>/logs/audit.jsonl`, appended to
and rotated at `MAX_BYTES` with `BACKUPS` old files kept (`audit.jsonl.1`
...), each made readable by its owner only (0600: it names keys and clients).
Writes are synchronous and small; admin actions are rare, and a flood of refusals is
bounded by the rotation. A line is JSON in ASCII, so no text a client sent (a path's
byte that is not UTF-8) can make one record fail to be written.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
from datetime import UTC, datetime
from pathlib import Path

MAX_BYTES = 10 * 1024**2
BACKUPS = 5
MODE = 0o600


class _PrivateFileHandler(logging.handlers.RotatingFileHandler):
    """A rotated file created, and kept, readable by its owner only (each new file after a
    rotation too); one an older Blazar made 0644 is narrowed when it is opened."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, MODE)
        os.fchmod(fd, MODE)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)


class AuditLog:
    """An append-only, rotated JSON Lines file; `close` it when serve stops."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handler = _PrivateFileHandler(
            path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def record(
        self,
        event: str,
        *,
        key: str | None,
        client: str | None,
        method: str,
        path: str,
        status: int,
        reason: str = "",
    ) -> None:
        """Append one record: `event` is `admin` (an admin-scope request) or `refused`."""
        entry = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "event": event,
            "key": key,
            "client": client,
            "method": method,
            "path": path,
            "status": status,
            "outcome": "ok" if status < 400 else reason or "failed",
        }
        line = json.dumps(entry)  # ASCII: a lone surrogate is written as its JSON escape
        self._handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def close(self) -> None:
        self._handler.close()
