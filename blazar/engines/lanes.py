"""Engine lanes in the store: kind, origin, state, and what each engine can load.

`engines.kind` holds a lane's name; the `lanes` table adds the rest: the kind of
server (its contract), the origin (`mainstream` or `fork`), the catalog offer a
fork was installed from, the architectures it adds, and its state (`active`,
`retiring`, `retired`) with when and why. A lane with engines but no row is a
mainstream lane named after its kind. `engine_support` records, per engine,
whether it loads a GGUF architecture: from the catalog for forks, from a load
probe for mainstream (`blazar.engines.probe`).

`observe` turns both into the reconcilers' `ObservedLane` values; the serve
runtime routes models with them and the engines reconciler retires forks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blazar.engines.base import processes_using
from blazar.engines.ledger import EngineStore
from blazar.store.db import Store, utcnow
from reconcilers.ports import ObservedLane

MAINSTREAM, FORK = "mainstream", "fork"
ACTIVE, RETIRING, RETIRED = "active", "retiring", "retired"
_BUILD = re.compile(r"b([1-9][0-9]*)-")


@dataclass(frozen=True)
class LaneRecord:
    lane: str
    kind: str
    origin: str = MAINSTREAM
    state: str = ACTIVE
    since: str = ""
    reason: str = ""
    offer: dict[str, Any] = field(default_factory=dict)
    architectures: tuple[str, ...] = ()

    @property
    def upstream(self) -> int | None:
        """The mainstream build that added the fork's architectures, from its offer."""
        match = re.fullmatch(r"b([0-9]+)", str(self.offer.get("upstream") or ""))
        return int(match.group(1)) if match else None


def build_number(tag: str) -> int | None:
    """b11549-cpu -> 11549; None for a tag that names no build (b0-..., fork-...)."""
    match = _BUILD.match(tag)
    return int(match.group(1)) if match else None


class LaneStore:
    """The `lanes` and `engine_support` rows of the store."""

    def __init__(self, store: Store) -> None:
        self.db = store.db
        self.engines = EngineStore(store)

    def get(self, lane: str) -> LaneRecord:
        rows = list(self.db["lanes"].rows_where("lane = ?", [lane]))
        if not rows:
            return LaneRecord(lane, kind=lane)
        row = rows[0]
        return LaneRecord(
            lane=row["lane"],
            kind=row["kind"],
            origin=row["origin"],
            state=row["state"],
            since=row["state_since"],
            reason=row["reason"] or "",
            offer=json.loads(row["offer"] or "{}"),
            architectures=tuple(json.loads(row["architectures"] or "[]")),
        )

    def all(self) -> list[LaneRecord]:
        """Every lane: those with a row, and those with engines but none."""
        names = {r["lane"] for r in self.db["lanes"].rows} | set(self.engines.kinds())
        return [self.get(name) for name in sorted(names)]

    def put(self, lane: LaneRecord) -> None:
        row = {
            "lane": lane.lane,
            "kind": lane.kind,
            "origin": lane.origin,
            "offer": json.dumps(lane.offer, sort_keys=True),
            "architectures": json.dumps(list(lane.architectures)),
            "state": lane.state,
            "state_since": lane.since or utcnow(),
            "reason": lane.reason,
            "updated_at": utcnow(),
        }
        with self.db.atomic():
            self.db["lanes"].insert(row, replace=True)  # type: ignore[union-attr]

    def drop(self, lane: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM lanes WHERE lane = ?", [lane])

    def set_state(self, lane: str, state: str, reason: str, since: str) -> None:
        with self.db.atomic():
            self.db.execute(
                "UPDATE lanes SET state = ?, reason = ?, state_since = ?, updated_at = ? "
                "WHERE lane = ?",
                [state, reason, since, utcnow(), lane],
            )

    def support(self, lane: str, tag: str) -> dict[str, bool]:
        rows = self.db["engine_support"].rows_where("lane = ? AND tag = ?", [lane, tag])
        return {r["architecture"]: bool(r["supported"]) for r in rows}

    def record_support(
        self, lane: str, tag: str, architecture: str, supported: bool, how: str, detail: str = ""
    ) -> None:
        row = {
            "lane": lane,
            "tag": tag,
            "architecture": architecture,
            "supported": int(supported),
            "how": how,
            "detail": detail,
            "checked_at": utcnow(),
        }
        with self.db.atomic():
            self.db["engine_support"].insert(row, replace=True)  # type: ignore[union-attr]

    def forget_engine(self, lane: str, tag: str) -> None:
        with self.db.atomic():
            self.db.execute("DELETE FROM engine_support WHERE lane = ? AND tag = ?", [lane, tag])


def observe(store: Store, engines_root: Path | None = None) -> list[ObservedLane]:
    """Every lane as the reconcilers see it; with `engines_root`, also which fork engines
    a running process uses (a /proc scan, so only the reconcile pass asks for it)."""
    lanes = LaneStore(store)
    out = []
    for lane in lanes.all():
        records = lanes.engines.installed(lane.lane)
        active = next((r for r in records if r.active), None)
        in_use: list[int] = []
        if engines_root is not None and lane.origin == FORK:
            for record in records:
                in_use += processes_using(Path(record.path))
        out.append(
            ObservedLane(
                lane=lane.lane,
                kind=lane.kind,
                origin=lane.origin,
                state=lane.state,
                since=lane.since,
                reason=lane.reason,
                active=active.tag if active else None,
                build=build_number(active.tag) if active else None,
                tags=tuple(r.tag for r in records),
                adds=lane.architectures,
                upstream=lane.upstream,
                support=lanes.support(lane.lane, active.tag) if active else {},
                in_use=tuple(sorted(set(in_use))),
            )
        )
    return out
