"""The message batches' rows in the store (tables `message_batches` and
`message_batch_requests`, migration m011), read and written in worker threads.

`blazar.serve.request.batches` keeps the batches in memory and writes behind through
`BatchStore.write` (under the apply lock, as the audio jobs and key usage do: an
apply's transactions fail if another writer commits under them); it loads them all at
start (`load`: the params only of requests still queued) and reads a batch's results
back page by page (`results`), so results never stay in serve's memory. A row the store
refuses costs only itself (`blazar.store.db.insert_isolated`): it is written escaped, or
left out and logged, and the rest of the write goes in.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.host.locking import LockTimeout, apply_lock
from blazar.store.db import insert_isolated

BATCH_COLUMNS = (
    "id",
    "key",
    "status",
    "requests",
    "created_at",
    "expires_at",
    "ended_at",
    "cancel_initiated_at",
)
REQUEST_COLUMNS = ("batch_id", "idx", "custom_id", "state", "params", "result")
PAGE = 1000
logger = logging.getLogger("blazar.serve")


@dataclass(frozen=True)
class Loaded:
    """What the store holds: each batch's row, and its requests' (batch_id, idx,
    custom_id, state, params) with params only where the state is queued."""

    batches: list[dict[str, Any]]
    requests: list[tuple[str, int, str, str, str | None]]


@dataclass(frozen=True)
class BatchStore:
    db: Path
    lock: Path

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db, timeout=30)

    def load(self) -> Loaded:
        with contextlib.closing(self._connect()) as conn:
            conn.row_factory = sqlite3.Row
            batches = [
                dict(r)
                for r in conn.execute("SELECT * FROM message_batches ORDER BY created_at, id")
            ]
            conn.row_factory = None
            requests = conn.execute(
                "SELECT batch_id, idx, custom_id, state, "
                "CASE WHEN state = 'queued' THEN params END "
                "FROM message_batch_requests ORDER BY batch_id, idx"
            ).fetchall()
        return Loaded(batches, requests)

    def write(
        self,
        batches: list[dict[str, Any]],
        requests: list[dict[str, Any]],
        gone: list[str],
        timeout: float,
    ) -> bool:
        """Upsert rows and delete gone batches in one transaction; False when the apply
        lock or the database could not be had (the caller keeps the rows and retries). A
        row refused for what it holds is written escaped, or left out and logged."""
        try:
            with (
                apply_lock(self.lock, timeout=timeout),
                contextlib.closing(self._connect()) as conn,
                conn,
            ):
                for table, columns, rows in (
                    ("message_batches", BATCH_COLUMNS, batches),
                    ("message_batch_requests", REQUEST_COLUMNS, requests),
                ):
                    marks = ", ".join("?" for _ in columns)
                    written = insert_isolated(
                        conn,
                        f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                        [[r.get(c) for c in columns] for r in rows],
                    )
                    if written.escaped or written.dropped:
                        logger.warning(
                            "%s: %d row(s) written escaped, %d refused and left out (the "
                            "other %d written)",
                            table,
                            written.escaped,
                            written.dropped,
                            written.rows,
                        )
                for batch_id in gone:
                    for sql in (
                        "DELETE FROM message_batch_requests WHERE batch_id = ?",
                        "DELETE FROM message_batches WHERE id = ?",
                    ):
                        conn.execute(sql, [batch_id])
        except (LockTimeout, sqlite3.Error) as exc:
            if timeout > 0:
                logger.warning("message batches not written to the store: %s", exc)
            return False
        return True

    def results(self, batch_id: str, after: int) -> list[tuple[int, str, str | None]]:
        """Up to PAGE of a batch's (idx, custom_id, result) with idx > `after`."""
        with contextlib.closing(self._connect()) as conn:
            return conn.execute(
                "SELECT idx, custom_id, result FROM message_batch_requests "
                "WHERE batch_id = ? AND idx > ? ORDER BY idx LIMIT ?",
                [batch_id, after, PAGE],
            ).fetchall()


def pages(store: BatchStore, batch_id: str) -> Iterator[list[tuple[int, str, str | None]]]:
    """A batch's results, page after page (each read in the calling thread)."""
    after = -1
    while rows := store.results(batch_id, after):
        yield rows
        after = rows[-1][0]
