"""Engines in the store: install records, the active engine per lane, switches, bench history.

Every switch of the active engine is journaled in `engine_switches`, so
`engine rollback` after a restart knows exactly which engine was active
before; every bench figure lands in `bench`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blazar.engines.base import InstalledEngine
from blazar.errors import NotFound
from blazar.store.db import Store, StoredRecord, utcnow


@dataclass(frozen=True)
class EngineRecord(StoredRecord):
    """An installed engine, and whether it is its lane's active one."""

    JSON: ClassVar[Mapping[str, type]] = {"command": list, "details": dict}
    FLAGS: ClassVar[tuple[str, ...]] = ("active",)

    kind: str
    tag: str
    method: str
    version: str
    path: str
    command: list[str]
    active: bool
    installed_at: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchResult:
    model: str
    sha256: str
    kind: str
    tag: str
    prompt_tps: float
    decode_tps: float
    prompt_n: int
    predicted_n: int
    runs: int
    note: str = "bench"
    time: str = field(default_factory=utcnow)
    spec: str = "off"  # the decoding mode measured: off | ngram | draft


class EngineStore:
    """Engine rows of the store. Switches are one transaction: never two actives."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def add(self, engine: InstalledEngine) -> EngineRecord:
        row = {
            "kind": engine.kind,
            "tag": engine.tag,
            "method": engine.method,
            "version": engine.version,
            "path": str(engine.path),
            "command": json.dumps(engine.command),
            "details": json.dumps(engine.details, sort_keys=True),
            "active": 0,
            "installed_at": utcnow(),
        }
        with self.db.atomic():
            self.db["engines"].insert(row, replace=True)  # type: ignore[union-attr]
        return self.get(engine.kind, engine.tag)

    def get(self, kind: str, tag: str) -> EngineRecord:
        rows = list(self.db["engines"].rows_where("kind = ? AND tag = ?", [kind, tag]))
        if not rows:
            raise NotFound(
                f"engine {kind} {tag} is not installed: `blazar engine list` shows what is"
            )
        return EngineRecord.from_row(rows[0])

    def find_tag(self, tag: str) -> EngineRecord:
        """An engine by tag across lanes (tags name a llama.cpp build, unique in practice)."""
        rows = list(self.db["engines"].rows_where("tag = ?", [tag]))
        if not rows:
            raise NotFound(
                f"no engine tagged {tag!r}: `blazar engine list` shows what is installed"
            )
        return EngineRecord.from_row(rows[0])

    def installed(self, kind: str | None = None) -> list[EngineRecord]:
        where, args = ("kind = ?", [kind]) if kind else (None, [])
        rows = self.db["engines"].rows_where(where, args, order_by="kind, installed_at, tag")
        return [EngineRecord.from_row(r) for r in rows]

    def kinds(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT kind FROM engines ORDER BY kind")]

    def active(self, kind: str) -> EngineRecord | None:
        rows = list(self.db["engines"].rows_where("kind = ? AND active = 1", [kind]))
        return EngineRecord.from_row(rows[0]) if rows else None

    def activate(self, kind: str, tag: str, reason: str) -> EngineRecord | None:
        """Make `tag` the lane's active engine; return the one it replaced."""
        self.get(kind, tag)
        previous = self.active(kind)
        if previous and previous.tag == tag:
            return previous
        with self.db.atomic():
            self.db.execute("UPDATE engines SET active = 0 WHERE kind = ?", [kind])
            self.db.execute("UPDATE engines SET active = 1 WHERE kind = ? AND tag = ?", [kind, tag])
            self.db["engine_switches"].insert(  # type: ignore[union-attr]
                {
                    "time": utcnow(),
                    "kind": kind,
                    "from_tag": previous.tag if previous else None,
                    "to_tag": tag,
                    "reason": reason,
                }
            )
        return previous

    def previous_active(self, kind: str) -> str | None:
        """The engine that was active before the current one (what rollback restores)."""
        row = self.db.execute(
            "SELECT from_tag FROM engine_switches WHERE kind = ? ORDER BY id DESC LIMIT 1", [kind]
        ).fetchone()
        return row[0] if row else None

    def switches(self, kind: str) -> list[dict[str, Any]]:
        return list(self.db["engine_switches"].rows_where("kind = ?", [kind], order_by="id"))

    def remove(self, kind: str, tag: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM engines WHERE kind = ? AND tag = ?", [kind, tag])

    def record_bench(self, result: BenchResult) -> None:
        with self.db.atomic():
            self.db["bench"].insert(result.__dict__)  # type: ignore[union-attr]

    def last_bench(self, kind: str, tag: str) -> dict[str, Any] | None:
        rows = list(
            self.db["bench"].rows_where(
                "kind = ? AND tag = ?", [kind, tag], order_by="id DESC", limit=1
            )
        )
        return rows[0] if rows else None

    def bench_history(self, model: str | None = None) -> list[dict[str, Any]]:
        """Every bench figure, oldest first (of one model, with `model`)."""
        where, args = ("model = ?", [model]) if model else (None, [])
        return list(self.db["bench"].rows_where(where, args, order_by="id"))
