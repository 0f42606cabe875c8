"""Reads of a store made and migrated already, with the standard library's sqlite3 alone.

`blazar list` starts in about half the time this way: sqlite-utils (with
python-dateutil and pluggy) is about 40 ms of a command's start, and a list needs none
of its table API. `blazar.cli.models` calls `read_models`; when it says None (no store
yet, or a migration pending) the command opens a `blazar.store.db.Store`, which makes or
migrates it, and reads through that.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from blazar.store.db import ModelRecord


def read_models(path: Path) -> list[ModelRecord] | None:
    """Every model record of the store at `path`; None when there is no store there yet
    or a migration is pending (then open a `Store`, which migrates it). Sorted as
    `Store.list_models` sorts them."""
    from blazar.store.schema import MIGRATIONS

    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=30)
    except sqlite3.Error:
        return None
    try:
        conn.row_factory = sqlite3.Row
        done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
        if any(fn.__name__ not in done for fn in MIGRATIONS):
            return None
        rows = conn.execute("SELECT * FROM models ORDER BY name, tag").fetchall()
    except sqlite3.Error:  # no _migrations table yet: a store being made
        return None
    finally:
        conn.close()
    return [ModelRecord.from_row(dict(row)) for row in rows]
