"""The response cache's table (`cache_entries`, migration m015): its reads and writes.

`blazar.serve.request.cache.ResponseCache` is the only writer (serve's event loop);
`blazar cache stats|clear` ask serve's API, which calls it. One plain sqlite3
connection in autocommit: every statement here is one small transaction, so a lookup
never waits behind a batch of trace writes for long (WAL: readers never block).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blazar.store.db import Store


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored answer (the `answer` and `request` as their JSON text)."""

    key: str
    scope: str
    model: str
    identity: str
    bucket: str
    request: str
    answer: str
    vector: bytes | None
    created: float
    used: float
    bytes: int
    trace_id: str


COLUMNS = (
    "key, scope, model, identity, bucket, request, answer, vector, created, used, bytes, trace_id"
)


class CacheTable:
    """The `cache_entries` table of the store at `path` (migrated when opened)."""

    def __init__(self, path: Path) -> None:
        Store(path).close()  # creates and migrates the store if it is new
        self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)

    def close(self) -> None:
        self.conn.close()

    def get(self, key: str) -> CacheEntry | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM cache_entries WHERE key = ?", (key,)
        ).fetchone()
        return CacheEntry(*row) if row is not None else None

    def put(self, entry: CacheEntry) -> None:
        self.conn.execute(
            f"INSERT OR REPLACE INTO cache_entries ({COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.key,
                entry.scope,
                entry.model,
                entry.identity,
                entry.bucket,
                entry.request,
                entry.answer,
                entry.vector,
                entry.created,
                entry.used,
                entry.bytes,
                entry.trace_id,
            ),
        )

    def touch(self, key: str, now: float) -> None:
        self.conn.execute("UPDATE cache_entries SET used = ? WHERE key = ?", (now, key))

    def vectors(self) -> Iterator[tuple[str, str, bytes, float]]:
        """(bucket, key, vector, created) of every semantic entry: the in-memory index's
        load when serve starts."""
        yield from self.conn.execute(
            "SELECT bucket, key, vector, created FROM cache_entries "
            "WHERE bucket != '' AND vector IS NOT NULL"
        )

    def delete(self, where: str, args: tuple[object, ...]) -> list[tuple[str, str]]:
        """Delete the entries `where` selects: their (bucket, key)."""
        gone = self.conn.execute(
            f"SELECT bucket, key FROM cache_entries WHERE {where}", args
        ).fetchall()
        if gone:
            self.conn.execute(f"DELETE FROM cache_entries WHERE {where}", args)
        return [(bucket or "", key) for bucket, key in gone]

    def delete_keys(self, keys: list[str]) -> list[tuple[str, str]]:
        """Delete these entries: their (bucket, key)."""
        gone: list[tuple[str, str]] = []
        for at in range(0, len(keys), 500):
            part = keys[at : at + 500]
            marks = ",".join("?" for _ in part)
            gone += self.delete(f"key IN ({marks})", tuple(part))
        return gone

    def totals(self) -> tuple[int, int]:
        """(entries, bytes) in the table."""
        count, size = self.conn.execute(
            "SELECT count(*), coalesce(sum(bytes), 0) FROM cache_entries"
        ).fetchone()
        return int(count), int(size)

    def by_model(self) -> list[tuple[str, int, int]]:
        """(model, entries, bytes) per model."""
        return self.conn.execute(
            "SELECT model, count(*), coalesce(sum(bytes), 0) FROM cache_entries "
            "GROUP BY model ORDER BY model"
        ).fetchall()

    def oldest_used(self, over: int) -> list[tuple[str, str]]:
        """The least recently used entries whose bytes, deleted, bring the table `over`
        bytes lighter: their (bucket, key)."""
        out: list[tuple[str, str]] = []
        freed = 0
        for bucket, key, size in self.conn.execute(
            "SELECT bucket, key, bytes FROM cache_entries ORDER BY used"
        ):
            if freed >= over:
                break
            out.append((bucket or "", key))
            freed += size
        return out
