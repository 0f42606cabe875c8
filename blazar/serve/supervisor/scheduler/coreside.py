"""`blazar coreside`: which models can be resident at once, where, and what a load evicts.

The answer is one value (`Coreside`), made by `coreside` from the footprints (estimated
or measured), the budgets, the groups and the pools as they are: the daemon's scheduler
(`Scheduler.coreside`, `GET /api/blazar/coreside`) hands it its live pools; the CLI,
with no serve running, the store's footprints and no pool loaded. `blazar coreside
--json` prints its JSON and the human view is rendered from that JSON, so both say the
same. Pure: everything comes in as values and the same pure decisions the scheduler
takes are asked (`memory.plan_memory`, `groups.plan_swap`, `memory.too_big`); tested
with tables of injected devices (tests/test_coreside.py).

A set of models fits when they pack into the budgets (largest first, each on the device
it leaves the least room on; one no device holds split across several, as `candidates`
plans it), never when two of them are in one exclusive group; a model brings its
together group. When it does not fit, `over` says by how many bytes per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler.groups import Groups, plan_swap
from blazar.serve.supervisor.scheduler.memory import (
    Budget,
    Footprint,
    Memory,
    candidates,
    plan_memory,
    too_big,
    usage,
)
from blazar.serve.supervisor.scheduler.pools import Pool


@dataclass(frozen=True)
class Fit:
    """Whether models can be resident at once: where each goes, and by how much they do
    not fit (bytes over budget per device), or why never (an exclusive group)."""

    models: tuple[str, ...]
    placement: Mapping[str, tuple[str, ...]]
    over: Mapping[str, int] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.over and not self.conflicts

    def to_json(self) -> dict[str, Any]:
        return {
            "models": list(self.models),
            "fits": self.fits,
            "placement": {m: list(d) for m, d in self.placement.items()},
            "over": dict(self.over),
            "conflicts": list(self.conflicts),
        }


def pack(
    names: Sequence[str], footprints: Mapping[str, Footprint], budgets: Sequence[Budget]
) -> Fit:
    """Pure: `names` packed into the budgets, largest first, each where it leaves the
    least room (best fit; a split when no one device holds it); one that does not fit
    goes where the most room is left, and what it lacks is counted over there."""
    left = {b.device: b.bytes for b in budgets}
    placement: dict[str, tuple[str, ...]] = {}
    order = sorted(names, key=lambda n: (-footprints.get(n, Footprint(0)).bytes, n))
    for name in order:
        need = footprints.get(name, Footprint(0)).bytes
        room = [Budget(b.device, b.kind, b.index, b.total, max(0, left[b.device])) for b in budgets]
        options = candidates(need, room)
        if options:
            best = min(options, key=lambda p: sum(left[d] - s for d, s in p.shares))
            for device, share in best.shares:
                left[device] -= share
            placement[name] = best.devices
        elif left:
            device = max(left, key=lambda d: left[d])
            left[device] -= need
            placement[name] = (device,)
    over = {d: -bytes for d, bytes in left.items() if bytes < 0}
    return Fit(tuple(names), placement, over)


def fit_set(
    names: Sequence[str],
    footprints: Mapping[str, Footprint],
    budgets: Sequence[Budget],
    groups: Groups,
) -> Fit:
    """Pure: whether `names` (with their together groups) can be resident at once."""
    wanted: list[str] = []
    for name in names:
        for each in (name, *sorted(groups.companions(name))):
            if each not in wanted:
                wanted.append(each)
    conflicts = []
    for group, members in groups.exclusive:
        both = [m for m in wanted if m in members]
        if len(both) > 1:
            listed = ", ".join(f"'{m}'" for m in both)
            conflicts.append(f"{listed} are in exclusive group '{group}': one of them at a time")
    packed = pack(wanted, footprints, budgets)
    return Fit(packed.models, packed.placement, packed.over, tuple(conflicts))


def all_at_once(
    names: Sequence[str], footprints: Mapping[str, Footprint], groups: Groups
) -> list[str]:
    """Pure: the models that could ever be resident together: every model, but of each
    exclusive group only its largest (the others swap with it)."""
    dropped: set[str] = set()
    for _, members in groups.exclusive:
        present = sorted(
            (m for m in members if m in names),
            key=lambda m: (-footprints.get(m, Footprint(0)).bytes, m),
        )
        dropped.update(present[1:])
    return [n for n in names if n not in dropped]


@dataclass(frozen=True)
class LoadNow:
    """What loading one model now would do."""

    model: str
    loaded: bool = False  # already: nothing to do
    devices: tuple[str, ...] = ()  # where it would go
    evicts: tuple[str, ...] = ()  # idle models unloaded for its room
    drains: tuple[str, ...] = ()  # the others of its exclusive group
    companions: tuple[str, ...] = ()  # its together group, loaded beside it
    waits: bool = False  # no room now: it would wait (busy or just-loaded models)
    refused: str | None = None  # it can never fit: why, and what to change

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "loaded": self.loaded,
            "devices": list(self.devices),
            "evicts": list(self.evicts),
            "drains": list(self.drains),
            "companions": list(self.companions),
            "waits": self.waits,
            "refused": self.refused,
        }


def load_now(
    runtime: ModelRuntime, pools: Sequence[Pool], memory: Memory, max_loaded: int | None
) -> LoadNow:
    """Pure: what loading `runtime`'s model now would do, as the scheduler decides it."""
    name = runtime.name
    companions = tuple(sorted(memory.groups.companions(name)))
    mine = [p for p in pools if p.runtime.name == name]
    if any(p.loaded for p in mine):
        devices = tuple(d for p in mine if p.placement for d in p.placement.devices)
        return LoadNow(name, loaded=True, devices=devices, companions=companions)
    footprint = memory.footprints.get(name, Footprint(0))
    refused = too_big(name, footprint, memory.budgets, memory.pinned.get(name))
    if refused is not None:
        return LoadNow(name, refused=refused, companions=companions)
    loading = mine[0] if mine else Pool(runtime, [])
    swap = plan_swap(pools, loading, memory.groups, memory.now, memory.min_residency)
    room = plan_memory(pools, loading, max_loaded, memory, swap.names) if swap else None
    if swap is None or room is None:
        return LoadNow(name, waits=True, companions=companions)
    return LoadNow(
        name,
        devices=room.placement.devices,
        evicts=tuple(sorted({p.runtime.name for p in room.evict})),
        drains=tuple(sorted({p.runtime.name for p in swap.leave})),
        companions=companions,
    )


@dataclass(frozen=True)
class Resident:
    """One model as `coreside` lists it."""

    model: str
    footprint: Footprint
    loaded: bool
    devices: tuple[str, ...]  # where it is, or would go alone
    never: bool  # over every budget: it can never be loaded here
    groups: tuple[tuple[str, str], ...]  # (group, kind)
    pinned: bool


@dataclass(frozen=True)
class Coreside:
    """The whole answer: the budgets and what they hold, each model, the groups, whether
    all of them fit at once, whether the models asked about do, and what loading each
    of those now would do. `source`: "serve" (the running daemon's view) or "store"
    (none runs: nothing is loaded)."""

    source: str
    budgets: tuple[Budget, ...]
    used: Mapping[str, int]
    models: tuple[Resident, ...]
    groups: Groups
    everything: Fit
    asked: Fit | None = None
    loads: tuple[LoadNow, ...] = ()
    pegged: Mapping[str, int] = field(default_factory=dict)  # warm pegs held: bytes
    peg_budget: int = 0  # serving.warm_peg_budget in bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "devices": [
                {
                    "device": b.device,
                    "budget": b.bytes,
                    "total": b.total,
                    "used": self.used.get(b.device, 0),
                }
                for b in self.budgets
            ],
            "models": [
                {
                    "model": r.model,
                    "footprint": r.footprint.bytes,
                    "footprint_source": r.footprint.source,
                    "loaded": r.loaded,
                    "devices": list(r.devices),
                    "never_fits": r.never,
                    "groups": [{"name": g, "kind": k} for g, k in r.groups],
                    "pinned": r.pinned,
                    "pegged": self.pegged.get(r.model, 0),
                }
                for r in self.models
            ],
            "pegs": {
                "budget": self.peg_budget,
                "used": sum(self.pegged.values()),
                "models": dict(self.pegged),
            },
            "groups": [
                {"name": g, "kind": kind, "models": sorted(ms)}
                for kind, found in (
                    ("exclusive", self.groups.exclusive),
                    ("together", self.groups.together),
                )
                for g, ms in found
            ],
            "all": self.everything.to_json(),
            "set": self.asked.to_json() if self.asked is not None else None,
            "loads": [each.to_json() for each in self.loads],
        }


def coreside(
    runtimes: Sequence[ModelRuntime],
    pools: Sequence[Pool],
    memory: Memory,
    asked: Sequence[str] = (),
    *,
    max_loaded: int | None = None,
    source: str = "serve",
) -> Coreside:
    """Pure: the answer for these models (their runtimes, by the names they are served
    under), the pools as they are (none loaded: []) and `asked` (served names)."""
    names = [r.name for r in runtimes]
    loaded = {p.runtime.name for p in pools if p.loaded}
    rows = []
    for runtime in runtimes:
        name = runtime.name
        footprint = memory.footprints.get(name, Footprint(0))
        placed = [p.placement for p in pools if p.runtime.name == name and p.loaded and p.placement]
        alone = candidates(footprint.bytes, memory.budgets, memory.pinned.get(name))
        devices = placed[0].devices if placed else (alone[0].devices if alone else ())
        rows.append(
            Resident(
                name,
                footprint,
                name in loaded,
                devices,
                not alone,
                tuple(memory.groups.of_model(name)),
                runtime.pin,
            )
        )
    everything = fit_set(
        all_at_once(names, memory.footprints, memory.groups),
        memory.footprints,
        memory.budgets,
        memory.groups,
    )
    by_name = {r.name: r for r in runtimes}
    return Coreside(
        source,
        memory.budgets,
        usage(pools, ()),
        tuple(rows),
        memory.groups,
        everything,
        fit_set(asked, memory.footprints, memory.budgets, memory.groups) if asked else None,
        tuple(load_now(by_name[n], pools, memory, max_loaded) for n in asked if n in by_name),
    )
