"""Traces in the store: written in batches, pruned by age and count, read by `blazar why`.

`blazar.serve.state.tracing` queues each finished trace and hands a batch to `write`
about once a second, in a worker thread with a connection of its own, so a
request never waits for SQLite. `prune` keeps at most `count` traces younger than
`max_age` seconds (serving.trace_retention). `find` and `recent` read them back:
the gateway's `/api/why` after its in-memory ring, and `blazar why` directly from
the store when no daemon answers. Table `traces` (migration m005_traces).

One record never costs its batch: a record the store refuses (text that is not UTF-8,
from a header or a body) is written escaped, or left out and counted
(`blazar.store.db.insert_isolated`); the observer counts what was left out.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from blazar.store.db import Store, Written, insert_isolated

INSERT = "INSERT INTO traces (trace_id, time, model, status, record) VALUES (?, ?, ?, ?, ?)"


def write(store: Store, records: list[dict[str, Any]]) -> Written:
    """Insert a batch of trace records in one transaction; what was written as it was,
    escaped, or left out (a record without an id or a time, or not JSON at all)."""
    rows = [
        (r.get("id"), r.get("time"), r.get("model"), r.get("status"), _text(r)) for r in records
    ]
    with store.db.atomic():
        return insert_isolated(store.db.conn, INSERT, rows)


def _text(record: dict[str, Any]) -> str | None:
    """A record as compact JSON: orjson (this runs under the GIL the requests need), or
    json for what orjson cannot write (an integer past 64 bits, a lone surrogate, which
    json escapes); None for what neither can (the row is then refused and counted)."""
    try:
        return orjson.dumps(record).decode()
    except TypeError:
        pass
    try:
        return json.dumps(record, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return None


def prune(store: Store, *, max_age: float, count: int, now: float | None = None) -> int:
    """Delete traces older than `max_age` seconds and all but the newest `count`; return how
    many went. `max_age` < 0 keeps any age."""
    now = time.time() if now is None else now
    with store.db.atomic():
        conn = store.db.conn
        gone = 0
        if max_age >= 0:
            gone += conn.execute("DELETE FROM traces WHERE time < ?", [now - max_age]).rowcount
        newest = conn.execute("SELECT max(id) FROM traces").fetchone()[0]
        if newest is not None:
            # ids grow by one per insert, so the newest `count` rows are those above this.
            gone += conn.execute("DELETE FROM traces WHERE id <= ?", [newest - count]).rowcount
    return gone


def find(store: Store, trace_id: str) -> dict[str, Any] | None:
    """The newest trace with this id."""
    row = store.db.execute(
        "SELECT record FROM traces WHERE trace_id = ? ORDER BY id DESC LIMIT 1", [trace_id]
    ).fetchone()
    return json.loads(row[0]) if row else None


def recent(store: Store, *, model: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The newest traces, of one model or all, newest first."""
    if model:
        cursor = store.db.execute(
            "SELECT record FROM traces WHERE model = ? ORDER BY id DESC LIMIT ?", [model, limit]
        )
    else:
        cursor = store.db.execute("SELECT record FROM traces ORDER BY id DESC LIMIT ?", [limit])
    return [json.loads(row[0]) for row in cursor]


def count(store: Store) -> int:
    return int(store.db.execute("SELECT count(*) FROM traces").fetchone()[0])
