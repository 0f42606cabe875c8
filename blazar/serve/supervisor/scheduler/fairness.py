"""The fairness bound: a busy resident model does not keep a waiting model out forever.

Used by the scheduler (`core.Scheduler.acquire`). A load that finds no room waits for
the models that hold it to go idle (`capacity`); a resident model whose clients keep it
busy never goes idle, so without a bound the waiting load would run out its
`serving.queue_timeout` and answer 503. Once some load has waited for room longer than
`serving.fairness_window`, new requests for the busy models stop taking slots: they
wait for their turn (requests in flight and already queued finish), the models go
idle, the waiting load evicts them and is served, and the held requests load their
model back once there is room again (`serving.min_residency` keeps the newcomer a few
seconds, so the two take turns instead of thrashing). Only the models on a device the
waiting load may use are held (on one device, all of them). `x-blazar-priority: high` is
never held. Pure: the pools, the devices and the clock come in as values.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from blazar.serve.supervisor.scheduler.memory import Memory, candidates, usage
from blazar.serve.supervisor.scheduler.pools import Pool


def held(
    pool: Pool,
    waiting: Mapping[Pool, float],
    now: float,
    window: float,
    *,
    priority: bool = False,
    wants: Mapping[Pool, Collection[str]] | None = None,
) -> bool:
    """Pure: whether a new request for the loaded `pool` waits for its turn: another
    model's load (`waiting`: each waiting load's pool and since when) has waited for room
    longer than `window` seconds while this one keeps its room on a device that load could
    use (`wants`: the devices each waiting load may be placed on; none given: any).
    Never for a priority request, a pinned or warm model (it never gives room), one not
    loaded, or with no window (0)."""
    if priority or window <= 0 or not pool.loaded or pool.sticky:
        return False
    name = pool.runtime.name
    mine = set(pool.placement.devices) if pool.placement is not None else None

    def in_the_way(other: Pool) -> bool:
        could = None if wants is None else wants.get(other)
        return mine is None or could is None or bool(mine & set(could))

    return any(
        other.runtime.name != name and now - since >= window and in_the_way(other)
        for other, since in waiting.items()
    )


def wants(
    waiting: Collection[Pool], pools: Collection[Pool], memory: Memory
) -> dict[Pool, set[str]]:
    """Pure: the devices each waiting load could be placed on once the busy models there
    gave their room: those of its candidate placements where the budget less what pinned
    and warm models hold (they never give room) has room for its share. Empty when no
    turn of the others would make room for it (a pin holds it): then nothing is held."""
    sticky = usage([p for p in pools if p.sticky], ())
    budget = {b.device: b.bytes for b in memory.budgets}
    out: dict[Pool, set[str]] = {}
    for pool in waiting:
        name = pool.runtime.name
        devices: set[str] = set()
        for placement in candidates(memory.bytes_of(name), memory.budgets, memory.pinned.get(name)):
            if all(budget[d] - sticky.get(d, 0) >= share for d, share in placement.shares):
                devices.update(placement.devices)
        out[pool] = devices
    return out
