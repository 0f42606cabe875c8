"""Memory-aware placement: budgets per device, footprints per model, who makes room.

Used by `capacity` (the room a load needs), `core` (footprints as the runtimes come
and as children are measured) and `blazar coreside` later. Everything here is pure:
the devices, the footprints and the clock come in as values, the decisions go out as
values, so each is tested with tables of injected devices (the tests have no GPU).
The effects stay apart: NVML and /proc are read by `blazar.host.hardware`, file sizes
and measurements by the scheduler, the victims stopped by `capacity`.

Placement has Kubernetes' scheduler shape: filter (the devices a model may use, the
ones with room enough), score (the cost of the idle models evicted to make that room)
and choose (the cheapest). A victim costs its footprint (the bytes a reload reads
again) weighted up to twice by how recently it was used; pins, warm replicas, busy,
draining and just-loaded models (`serving.min_residency`) are never chosen, and a
model already being stopped is room to claim for nothing. `serving.max_loaded_models`
stays an extra cap: the same choice also unloads enough models to stay under it. A
together group (`groups`) is one victim: all its loaded models or none, and never to
load one of its own; an exclusive group's rivals that a load drains (`leaving`) are room
it takes, not victims.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blazar.host.hardware import Device
from blazar.models import fit
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler.groups import Groups
from blazar.serve.supervisor.scheduler.pools import Placement, Pool

GIB = 1024**3
MARGIN_SHARE = 0.10  # the default budget leaves this share of a device's total ...
MARGIN_MAX = 2 * GIB  # ... at most this much, for the host and other programs
RECENT = 60.0  # seconds: a victim used this long ago costs 1.5x, just now 2x, long ago 1x
EXACT_UP_TO = 14  # victims chosen by trying every set up to this many candidates


@dataclass(frozen=True)
class Budget:
    """What models may use on one device."""

    device: str  # "gpu:0", "cpu:0"
    kind: str  # gpu | cpu
    index: int
    total: int
    bytes: int


def budget_bytes(setting: int | str | None, device: Device) -> int:
    """Pure: `serving.memory_budget` on one device: bytes, a share of its total ('80%'),
    or by default its free memory less a margin (10% of its total, at most 2 GiB)."""
    if isinstance(setting, int):
        return setting
    if isinstance(setting, str):
        return int(device.total * float(setting.rstrip("% ")) / 100)
    margin = min(int(device.total * MARGIN_SHARE), MARGIN_MAX)
    return max(0, device.free - margin)


def budgets(devices: Sequence[Device], setting: int | str | None) -> tuple[Budget, ...]:
    """Pure: the budget of every device."""
    return tuple(
        Budget(f"{d.kind}:{d.index}", d.kind, d.index, d.total, budget_bytes(setting, d))
        for d in devices
    )


@dataclass(frozen=True)
class Footprint:
    """What a model's instances take, all together: `fit`'s estimate until a child of it
    was measured, then what it used."""

    bytes: int
    measured: bool = False

    @property
    def source(self) -> str:
        return "measured" if self.measured else "estimated"


def estimate_footprint(
    runtime: ModelRuntime, *, weights: int, projector: int = 0, draft: int = 0, on_gpu: bool
) -> Footprint:
    """Pure: `fit`'s estimate of the model as serve starts it (weights, KV for ctx x slots
    at its cache type, compute, the prompt cache on host RAM, the projector) plus its
    draft model's weights, times its instances. The file sizes come from the caller."""
    if runtime.ctx <= 0:  # a speech model (whisper, piper): no KV cache, its file's size
        return Footprint((weights + projector + draft) * runtime.instances)
    device = Device("gpu" if on_gpu else "cpu", 0, "", 0, 0)
    report = fit.estimate(
        runtime.name,
        {**runtime.facts, "size": weights},
        [device],
        ctx=runtime.ctx * runtime.slots,
        cache_type=runtime.cache.kv_type if runtime.cache.kv_type in fit.CACHE_TYPES else "f16",
        ctx_extend=runtime.cache.ctx_extend,
        cache_ram_mb=runtime.cache.cache_ram_mb,
        projector=projector,
    )
    return Footprint((report.needed + draft) * runtime.instances)


def footprint_of(runtime: ModelRuntime, estimated: Footprint, measured: int | None) -> Footprint:
    """Pure: the measured bytes of one instance (times its instances) once there are
    some, else the estimate."""
    if measured is None or measured <= 0:
        return estimated
    return Footprint(measured * runtime.instances, measured=True)


# -- placement ---------------------------------------------------------------------------


def candidates(
    need: int, budgets: Sequence[Budget], pinned: Sequence[int] | None = None
) -> list[Placement]:
    """Pure: filter. The placements a model of `need` bytes may take: each device it may
    use whose budget holds it, else one split across all of them in proportion to their
    budgets when together they hold it; [] when it can never fit. `pinned`: the GPUs the
    manifest names (`models.NAME.devices`)."""
    usable = [b for b in budgets if pinned is None or b.kind != "gpu" or b.index in pinned]
    whole = [Placement(((b.device, need),)) for b in usable if b.bytes >= need]
    if whole or len(usable) < 2:
        return whole
    total = sum(b.bytes for b in usable)
    if total < need:
        return []
    shares = [need * b.bytes // total for b in usable]
    shares[-1] += need - sum(shares)
    return [Placement(tuple((b.device, s) for b, s in zip(usable, shares, strict=True)))]


def too_big(
    name: str, footprint: Footprint, budgets: Sequence[Budget], pinned: Sequence[int] | None
) -> str | None:
    """Pure: why a model can never be loaded here (None when it can): its footprint is
    over every device's budget and over all of them together."""
    if candidates(footprint.bytes, budgets, pinned):
        return None
    usable = [b for b in budgets if pinned is None or b.kind != "gpu" or b.index in pinned]
    where = ", ".join(f"{b.device} {fmt(b.bytes)}" for b in usable) or "no device"
    return (
        f"model '{name}' needs {fmt(footprint.bytes)} ({footprint.source}) and the memory "
        f"budget is {where} (serving.memory_budget): it can never be loaded here; use a "
        f"smaller quantization, a smaller ctx or slots, a quantized cache_type (q8_0), or "
        f"raise serving.memory_budget; `blazar fit {name}` shows what fits"
    )


def fmt(size: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


# -- making room -------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """What the room decision knows of memory: the budgets, each model's footprint (by
    name; a model with none counts 0), the clock, `serving.min_residency` and the
    manifest's groups."""

    budgets: tuple[Budget, ...]
    footprints: Mapping[str, Footprint] = field(default_factory=dict)
    now: float = 0.0
    min_residency: float = 0.0
    pinned: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    groups: Groups = field(default_factory=Groups)

    def bytes_of(self, name: str) -> int:
        found = self.footprints.get(name)
        return found.bytes if found is not None else 0


@dataclass(frozen=True)
class Unit:
    """The pools that go together (a model's, or a together group's): evicted (idle) or
    claimed (being stopped)."""

    pools: tuple[Pool, ...]
    claim: bool
    freed: tuple[tuple[str, int], ...]  # (device, bytes) it gives back
    cost: float
    last_used: float


def victim_cost(footprint: int, idle: float) -> float:
    """Pure: what evicting a model costs: the bytes its reload reads again, weighted by
    how recently it was used (x2 just now, x1.5 after RECENT seconds, toward x1)."""
    return footprint * (1 + RECENT / (RECENT + max(0.0, idle)))


def usage(pools: Sequence[Pool], skip: Collection[str]) -> dict[str, int]:
    """Pure: bytes in use per device by the pools that hold room (loaded, or stopping
    and claimed by no load), except the models in `skip`."""
    used: dict[str, int] = {}
    for pool in pools:
        if pool.runtime.name in skip or pool.placement is None:
            continue
        if pool.loaded or (pool.stopping is not None and not pool.claimed):
            for device, size in pool.placement.shares:
                used[device] = used.get(device, 0) + size
    return used


def units(
    pools: Sequence[Pool], skip: str, memory: Memory, leaving: Collection[str] = ()
) -> list[Unit]:
    """Pure: what could give room, by model (a together group's models as one): being
    stopped and unclaimed (free), or loaded with every pool evictable and past its
    min_residency. Not model `skip` nor its together group, nor the models `leaving`."""
    own = memory.groups.unit(skip)
    loaded: dict[frozenset[str], list[Pool]] = {}
    stopping: dict[frozenset[str], list[Pool]] = {}
    for pool in pools:
        name = pool.runtime.name
        if name in own or name in leaving:
            continue
        if pool.loaded:
            loaded.setdefault(memory.groups.unit(name), []).append(pool)
        elif pool.stopping is not None and not pool.claimed:
            stopping.setdefault(memory.groups.unit(name), []).append(pool)
    out: list[Unit] = []
    for key, ps in stopping.items():
        if key not in loaded:
            out.append(Unit(tuple(ps), True, _freed(ps), 0.0, max(p.last_used for p in ps)))
    for ps in loaded.values():
        settled = all(memory.now - p.loaded_at >= memory.min_residency for p in ps)
        if all(p.evictable for p in ps) and settled:
            last = max(p.last_used for p in ps)
            size = sum(memory.bytes_of(n) for n in {p.runtime.name for p in ps})
            out.append(
                Unit(tuple(ps), False, _freed(ps), victim_cost(size, memory.now - last), last)
            )
    return out


def _freed(pools: Sequence[Pool]) -> tuple[tuple[str, int], ...]:
    freed: dict[str, int] = {}
    for pool in pools:
        for device, size in pool.placement.shares if pool.placement is not None else ():
            freed[device] = freed.get(device, 0) + size
    return tuple(freed.items())


def cheapest(
    options: Sequence[Unit], short: Mapping[str, int], count: int
) -> tuple[Unit, ...] | None:
    """Pure: choose. The set of units that frees `short[device]` bytes on each device and
    counts at least `count` units, at the least cost (then the fewest, then the least
    recently used); None when no set does. Exact up to EXACT_UP_TO options, greedy by
    cost per byte beyond."""
    if all(v <= 0 for v in short.values()) and count <= 0:
        return ()

    def enough(chosen: Sequence[Unit]) -> bool:
        if len(chosen) < count:
            return False
        for device, missing in short.items():
            if missing > 0 and sum(dict(u.freed).get(device, 0) for u in chosen) < missing:
                return False
        return True

    def rank(chosen: Sequence[Unit]) -> tuple[float, int, float]:
        return (sum(u.cost for u in chosen), len(chosen), max(u.last_used for u in chosen))

    if len(options) <= EXACT_UP_TO:
        best: tuple[Unit, ...] | None = None
        for size in range(1, len(options) + 1):
            for chosen in itertools.combinations(options, size):
                if enough(chosen) and (best is None or rank(chosen) < rank(best)):
                    best = chosen
        return best
    total_short = sum(max(0, v) for v in short.values())

    def per_byte(u: Unit) -> tuple[float, float]:
        useful = sum(b for d, b in u.freed if short.get(d, 0) > 0) if total_short else 1
        return (u.cost / useful if useful else math.inf, u.last_used)

    chosen_list: list[Unit] = []
    for unit in sorted(options, key=per_byte):
        chosen_list.append(unit)
        if enough(chosen_list):
            break
    else:
        return None
    for unit in sorted(chosen_list, key=lambda u: -u.cost):  # drop what is not needed
        rest = [u for u in chosen_list if u is not unit]
        if enough(rest):
            chosen_list = rest
    return tuple(chosen_list)


@dataclass(frozen=True)
class MemoryRoom:
    """Where a load goes and what it takes: units to evict and to claim, and why: memory
    (its device was short of room) or count (only `max_loaded_models` asked for them)."""

    placement: Placement
    evict: tuple[Pool, ...] = ()
    claim: tuple[Pool, ...] = ()
    reason: str = "memory"


def plan_memory(
    pools: Sequence[Pool],
    loading: Pool,
    max_loaded: int | None,
    memory: Memory,
    leaving: Collection[str] = (),
) -> MemoryRoom | None:
    """Pure: the placement of `loading` and the room it takes, by memory (and under the
    optional `max_loaded` models); None when no room can be made now (everything that
    holds the room it needs is pinned, kept warm, busy, draining or just loaded).
    `leaving`: the models this load unloads anyway (its exclusive group's others)."""
    name = loading.runtime.name
    need = memory.bytes_of(name)
    options = units(pools, name, memory, leaving)
    used = usage(pools, {name, *leaving})
    holding = {
        p.runtime.name
        for p in pools
        if p.runtime.name != name
        and p.runtime.name not in leaving
        and (p.loaded or (p.stopping is not None and not p.claimed))
    }
    count = 0 if max_loaded is None else max(0, len(holding) + 1 - max_loaded)
    by_budget = {b.device: b for b in memory.budgets}
    best: tuple[tuple[float, int, int], MemoryRoom] | None = None
    for placement in candidates(need, memory.budgets, memory.pinned.get(name)):
        short = {d: share - (by_budget[d].bytes - used.get(d, 0)) for d, share in placement.shares}
        chosen = cheapest(options, short, count)
        if chosen is None:
            continue
        headroom = sum(by_budget[d].bytes - used.get(d, 0) for d in placement.devices)
        key = (sum(u.cost for u in chosen), len(chosen), -headroom)
        room = MemoryRoom(
            placement,
            tuple(p for u in chosen if not u.claim for p in u.pools),
            tuple(p for u in chosen if u.claim for p in u.pools),
            "memory" if any(v > 0 for v in short.values()) else "count",
        )
        if best is None or key < best[0]:
            best = (key, room)
    return best[1] if best is not None else None


def view(budgets: Sequence[Budget], pools: Sequence[Pool]) -> list[dict[str, Any]]:
    """Pure: each device's budget and the bytes in use on it, for `blazar ps --json`."""
    used = usage(pools, ())
    return [
        {"device": b.device, "budget": b.bytes, "total": b.total, "used": used.get(b.device, 0)}
        for b in budgets
    ]
