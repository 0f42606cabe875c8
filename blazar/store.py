"""Blazar's store: the single record of observed state, in SQLite.

Opened through sqlite-utils in WAL mode (readers never block the writer);
migrations from `blazar.migrations` run on every open. Callers get and put
plain dataclasses; every multi-row write runs in one transaction so the store
is never left half-written.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlite_utils

from blazar.errors import NotFound
from blazar.migrations import migrate
from specs.names import ModelName

HELD_KINDS = ("hardlink", "copy", "reference")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ModelRecord:
    """One model Blazar holds, as the store records it."""

    name: str
    tag: str
    path: str
    held: str
    size: int
    sha256: str
    source: str
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    added_at: str = field(default_factory=utcnow)

    @property
    def ref(self) -> ModelName:
        return ModelName(self.name, self.tag)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["facts"] = json.dumps(self.facts, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelRecord:
        data = dict(row)
        data["facts"] = json.loads(data.get("facts") or "{}")
        return cls(**data)


class Store:
    """The SQLite store. One instance per process; cheap to open."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        conn = sqlite3.connect(str(path), timeout=30)
        self.db = sqlite_utils.Database(conn)
        self.db.enable_wal()
        self.db.execute("PRAGMA foreign_keys = ON")
        migrate(self.db)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- models ---------------------------------------------------------------

    def get_model(self, ref: ModelName) -> ModelRecord:
        rows = list(self.db["models"].rows_where("name = ? AND tag = ?", [ref.name, ref.tag]))
        if not rows:
            raise NotFound(
                f"model '{ref.short}' is not in the store: run `blazar list` to see models"
            )
        return ModelRecord.from_row(rows[0])

    def find_model(self, ref: ModelName) -> ModelRecord | None:
        try:
            return self.get_model(ref)
        except NotFound:
            return None

    def list_models(self) -> list[ModelRecord]:
        rows = self.db["models"].rows_where(order_by="name, tag")
        return [ModelRecord.from_row(r) for r in rows]

    def put_model(self, record: ModelRecord, *, event: str = "imported") -> None:
        """Insert or replace a model's record, journaling the change, atomically."""
        with self.db.atomic():
            self.db["models"].upsert(record.to_row(), pk=("name", "tag"))  # type: ignore[union-attr]
            self._event("model", record.ref.short, event, f"{record.path} ({record.held})")

    def delete_model(self, ref: ModelName) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM models WHERE name = ? AND tag = ?", [ref.name, ref.tag])
            self._event("model", ref.short, "removed", "")

    def paths_in_use(self, path: str) -> int:
        """How many model records point at this file (blobs are shared by content)."""
        row = self.db.execute("SELECT count(*) FROM models WHERE path = ?", [path]).fetchone()
        return int(row[0])

    # -- events ---------------------------------------------------------------

    def _event(self, kind: str, subject: str, action: str, message: str) -> None:
        row = {"time": utcnow(), "kind": kind, "subject": subject, "action": action}
        self.db["events"].insert({**row, "message": message})  # type: ignore[union-attr]

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        where = "kind = ?" if kind else None
        return list(self.db["events"].rows_where(where, [kind] if kind else [], order_by="id"))
