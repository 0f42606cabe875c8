"""Loading, evicting and unloading: which models hold a place, and stopping the rest.

Used by the scheduler (`core`) and by `reload`. With a memory budget (the daemon's
case: `memory.Memory`, from the devices and the footprints) loading a model places it
on a device with room and evicts the idle models that free enough at the least cost
(`memory.plan_memory`), `max_loaded_models` staying an extra cap; a model that can
never fit is refused before anything is spawned (`TooLarge`, 400). Without one (tests
of the count alone) `max_loaded_models` counts models and loading one more evicts the
least recently used idle model (`plan_room`). Pins and warm replicas are never evicted.
When no room can be made now (what holds it is busy, or loaded less than
`serving.min_residency` ago), the load waits for room, up to `serving.queue_timeout`,
woken whenever a model goes idle or stops (priority loads first); only then 503.
The loads waiting for room are listed with since when (`waiting`): the scheduler's
fairness bound reads it.
The manifest's groups (`groups`): loading a model of an exclusive group drains the
group's others that are loaded and waits for them to stop (their room is its own); a
together group is evicted and expires as one, and `on_load` is told of every load so
that the scheduler loads its companions.
Decisions apart from effects: the plans are pure functions of the pools,
made and acted on without an await in between, so no other task can interleave (no
lock is needed, and none is held while a child stops). The victims are marked at
once (not loaded, `stopping`, `claimed`), so nothing leases them and no other load
picks or counts them; they stop in tasks of their own: the session bank's
`before_stop` hook (bounded by `before_stop_timeout`), then SIGTERM and its grace.
Only the load that evicted them waits for that stop (it takes their room); every
other load goes on. A model being stopped for another reason (keep_alive, `blazar
stop`) still counts until it has stopped: a load that needs its room waits for it.

`drain` is `blazar stop` and ollama's `keep_alive: 0`: the pool takes no new lease
(they wait for the next load), its requests in flight and queued finish, and it
unloads when the last slot is given back: no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from blazar.serve.supervisor.scheduler.errors import NoCapacity, TooLarge
from blazar.serve.supervisor.scheduler.groups import Groups, Swap, due, plan_swap
from blazar.serve.supervisor.scheduler.memory import Memory, MemoryRoom, plan_memory, too_big
from blazar.serve.supervisor.scheduler.pools import Pool

logger = logging.getLogger("blazar.serve")
# Called with a pool whose instances are about to be stopped for any reason but a crash
# (idle, evicted, `blazar stop`, a reload, serve's shutdown), while they still run: the
# session bank saves their slots there (`blazar.serve.state.sessions`). It only talks HTTP to
# the children; stopping them stays their owners' job.
BeforeStop = Callable[[Pool], Awaitable[None]]
BEFORE_STOP_TIMEOUT = 60.0
# A keep_alive of a hundred years or more is "forever": an expiry that far out would
# overflow the dates `/api/ps` shows.
FOREVER = 100 * 365 * 24 * 3600.0


def choose_eviction(pools: Sequence[Pool]) -> Pool | None:
    """Pure: the least recently used loaded model that may be evicted, if any."""
    candidates = [p for p in pools if p.evictable]
    return min(candidates, key=lambda p: p.last_used) if candidates else None


@dataclass(frozen=True)
class Room:
    """What loading a pool takes: pools to evict now, and pools already being stopped
    whose room it claims; it waits for both to stop."""

    evict: tuple[Pool, ...] = ()
    claim: tuple[Pool, ...] = ()


def plan_room(
    pools: Sequence[Pool], loading: Pool, max_loaded: int, leaving: Collection[str] = ()
) -> Room | None:
    """Pure: the room `loading` needs under `max_loaded` models, None when there is none.

    Counted: models with a loaded pool, and models being stopped that no other load has
    claimed, but not those `leaving` (the load unloads them anyway: its exclusive
    group's). A model's pools (its pool and an elder) go together, and are evicted only
    when all of them may be, least recently used first.
    """
    name = loading.runtime.name
    loaded: dict[str, list[Pool]] = {}
    stopping: dict[str, list[Pool]] = {}
    for pool in pools:
        if pool is loading or pool.runtime.name == name or pool.runtime.name in leaving:
            continue
        if pool.loaded:
            loaded.setdefault(pool.runtime.name, []).append(pool)
        elif pool.stopping is not None and not pool.claimed:
            stopping.setdefault(pool.runtime.name, []).append(pool)
    coming = [ps for n, ps in stopping.items() if n not in loaded]
    excess = len(loaded) + len(coming) + 1 - max_loaded
    if excess <= 0:
        return Room()
    claim = [p for ps in coming[:excess] for p in ps]
    excess -= min(excess, len(coming))
    idle = [ps for ps in loaded.values() if all(p.evictable for p in ps)]
    if len(idle) < excess:
        return None
    idle.sort(key=lambda ps: max(p.last_used for p in ps))
    return Room(tuple(p for ps in idle[:excess] for p in ps), tuple(claim))


class Capacity:
    """The loads, keep-alives and stops of the scheduler's pools (`pools()`: all of them,
    retired ones included); `on_unload(pool)` is told when a pool starts unloading,
    `on_stopped(pool)` once its children have stopped, and `on_load(pool)` when a load
    is decided."""

    def __init__(
        self,
        pools: Callable[[], list[Pool]],
        *,
        max_loaded: int,
        clock: Callable[[], float],
        on_unload: Callable[[Pool], None],
        on_stopped: Callable[[Pool], None],
        before_stop: BeforeStop | None = None,
        before_stop_timeout: float = BEFORE_STOP_TIMEOUT,
        memory: Callable[[], Memory | None] = lambda: None,
        room_timeout: Callable[[], float] = lambda: 0.0,
        groups: Callable[[], Groups] = Groups,
        on_load: Callable[[Pool], None] = lambda pool: None,
    ) -> None:
        self.pools, self.max_loaded, self.clock = pools, max_loaded, clock
        self.memory, self.room_timeout = memory, room_timeout
        self.groups, self.on_load = groups, on_load
        self.room_waiters: deque[asyncio.Future[None]] = deque()  # loads waiting for room
        self.waiting: dict[Pool, float] = {}  # the loads waiting for room, since (clock)
        self.on_unload, self.on_stopped = on_unload, on_stopped
        self.before_stop, self.before_stop_timeout = before_stop, before_stop_timeout
        # models unloaded for another's load so far, by (model, reason: memory | count |
        # group), for /metrics (blazar_evictions_total)
        self.evictions: dict[tuple[str, str], int] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- loading --------------------------------------------------------------------------

    def plan(self, pool: Pool, leaving: Collection[str] = ()) -> Room | MemoryRoom | None:
        """Pure given the pools and the memory view: the room loading `pool` takes now
        (`leaving`: the models it unloads anyway, its exclusive group's others)."""
        memory = self.memory()
        if memory is None:
            return plan_room(self.pools(), pool, self.max_loaded, leaving)
        return plan_memory(self.pools(), pool, self.max_loaded, memory, leaving)

    def swap(self, pool: Pool) -> Swap | None:
        """Pure given the pools: what loading `pool` asks of its exclusive groups."""
        memory = self.memory()
        residency = memory.min_residency if memory is not None else 0.0
        return plan_swap(self.pools(), pool, self.groups(), self.clock(), residency)

    def refusal(self, pool: Pool) -> str | None:
        """Why `pool` can never be loaded here (bigger than the budget), or None."""
        memory = self.memory()
        name = pool.runtime.name
        if memory is None or name not in memory.footprints:
            return None
        return too_big(name, memory.footprints[name], memory.budgets, memory.pinned.get(name))

    async def load(
        self, pool: Pool, evicted: list[str] | None = None, *, priority: bool = False
    ) -> float:
        """Reserve a place for `pool` and wait for the children stopped to make it; the
        seconds it waited for room. TooLarge (400) when it can never fit; when no room can
        be made now it waits for some (a busy model going idle, one stopping, one passing
        its min_residency) up to `room_timeout()`, then NoCapacity (503). The caller
        checked that it is neither loaded, loading nor stopping; it looks again when this
        returns 0 rooms (another request's load took it meanwhile)."""
        why = self.refusal(pool)
        if why is not None:
            raise TooLarge(why)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            while True:
                if pool.loaded or pool.loading is not None or pool.stopping is not None:
                    return loop.time() - began  # another request loaded it meanwhile
                swap = self.swap(pool)
                room = self.plan(pool, swap.names) if swap is not None else None
                if swap is not None and room is not None:
                    break
                left = began + self.room_timeout() - loop.time()
                if left <= 0:
                    raise self.no_room(pool)
                self.waiting.setdefault(pool, self.clock())  # the fairness bound counts it
                await self.wait_for_room(min(left, self.next_settled()), priority)
        finally:
            self.waiting.pop(pool, None)
        assert swap is not None
        waited = loop.time() - began
        reason = room.reason if isinstance(room, MemoryRoom) else "count"
        if isinstance(room, MemoryRoom):
            pool.placement = room.placement
        pool.loaded_at = self.clock()
        for victim in room.evict:
            logger.info(
                "evicting '%s' to load '%s' (%s)", victim.runtime.name, pool.runtime.name, reason
            )
            self.begin_unload(victim)
            name = victim.runtime.name
            self.evictions[name, reason] = self.evictions.get((name, reason), 0) + 1
            if evicted is not None and name not in evicted:
                evicted.append(name)
        for rival in swap.leave:
            logger.info(
                "unloading '%s' to load '%s' (exclusive group)",
                rival.runtime.name,
                pool.runtime.name,
            )
            self.drain(rival)
            name = rival.runtime.name
            self.evictions[name, "group"] = self.evictions.get((name, "group"), 0) + 1
            if evicted is not None and name not in evicted:
                evicted.append(name)
        freed = [*room.evict, *room.claim, *swap.leave, *swap.wait]
        for each in freed:
            each.claimed = True
        pool.loaded, pool.expires_at = True, None
        self.on_load(pool)
        stops = [p.stopping for p in freed if p.stopping is not None]
        if not stops:
            return waited
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pool.loading = done
        try:
            await asyncio.shield(asyncio.gather(*stops))
        except asyncio.CancelledError:
            pool.loading = None
            if pool.idle:  # the request that asked went away: it may expire like any other
                self.settle(pool, None)
            raise
        finally:
            pool.loading = None
            done.set_result(None)
        return waited

    def no_room(self, pool: Pool) -> NoCapacity:
        memory = self.memory()
        what = (
            "the memory budget (serving.memory_budget) is held by models that are pinned, "
            "kept warm, busy or loaded less than serving.min_residency ago"
            if memory is not None
            else f"max_loaded_models ({self.max_loaded}) models are loaded and all are "
            "pinned, kept warm or busy"
        )
        return NoCapacity(
            f"cannot load '{pool.runtime.name}': {what}, and no room was made within "
            f"{self.room_timeout():g}s (serving.queue_timeout); retry later, or raise "
            "serving.max_loaded_models or serving.memory_budget (`blazar ps` shows what is loaded)",
            retry_after=5,
        )

    def next_settled(self) -> float:
        """Seconds until the next loaded model passes its min_residency (inf: none)."""
        memory = self.memory()
        if memory is None or memory.min_residency <= 0:
            return math.inf
        ends = [
            p.loaded_at + memory.min_residency - memory.now
            for p in self.pools()
            if p.loaded and p.loaded_at + memory.min_residency > memory.now
        ]
        return max(0.01, min(ends)) if ends else math.inf

    async def wait_for_room(self, timeout: float, priority: bool) -> None:
        """Until room may have been made (`room_changed`) or `timeout` seconds; a
        priority load is woken first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if priority:
            self.room_waiters.appendleft(future)
        else:
            self.room_waiters.append(future)
        try:
            async with asyncio.timeout(timeout if math.isfinite(timeout) else None):
                await future
        except TimeoutError:
            pass
        finally:
            if future in self.room_waiters:
                self.room_waiters.remove(future)

    def room_changed(self) -> None:
        """A model went idle or stopped: the loads waiting for room plan again, in the
        order they wait (each plans and marks its room without an await in between)."""
        waiters, self.room_waiters = self.room_waiters, deque()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # -- after a request ------------------------------------------------------------------

    def settle(self, pool: Pool, keep_alive: float | None) -> None:
        """An idle model: unload now, expire later, or keep (pins, replicas, -1)."""
        seconds = pool.runtime.keep_alive if keep_alive is None else keep_alive
        self.room_changed()  # idle now: a load waiting for room may evict it
        if pool.retired or pool.draining:
            self.begin_unload(pool)
        elif pool.sticky or seconds < 0 or not seconds < FOREVER:  # not <: NaN, inf, huge
            pool.expires_at = None
        elif seconds == 0:
            self.begin_unload(pool)
        else:
            pool.expires_at = self.clock() + seconds

    async def reap(self) -> None:
        """Unload idle models whose keep_alive ran out, and wait for them to stop."""
        expired = due(self.pools(), self.clock(), self.groups())
        await asyncio.gather(*(self.begin_unload(p) for p in expired))

    # -- stopping -------------------------------------------------------------------------

    def drain(self, pool: Pool) -> asyncio.Future[None]:
        """Stop taking leases for `pool` and unload it once its requests are done; the
        future is done when its children have stopped."""
        if pool.stopping is None:
            pool.stopping = asyncio.get_running_loop().create_future()
        if pool.loaded and pool.in_flight == 0 and not pool.waiters:
            self.begin_unload(pool)
        return pool.stopping

    def begin_unload(self, pool: Pool) -> asyncio.Future[None]:
        """Mark `pool` unloaded now and stop its children in a task: nothing leases it
        from here on. The future is done when they have stopped."""
        if pool.stopping is None:
            pool.stopping = asyncio.get_running_loop().create_future()
        if pool.loaded:
            pool.loaded, pool.expires_at = False, None
            self.on_unload(pool)
            self.spawn(self._stop(pool, pool.stopping))
        return pool.stopping

    async def _stop(self, pool: Pool, done: asyncio.Future[None]) -> None:
        try:
            await self.run_before_stop(pool)
            await asyncio.gather(*(m.instance.stop() for m in pool.members))
            if pool.retired:
                await asyncio.gather(*(m.instance.close() for m in pool.members))
        finally:
            pool.stopping, pool.claimed = None, False
            if not done.done():
                done.set_result(None)
            self.on_stopped(pool)
            self.room_changed()

    async def run_before_stop(self, pool: Pool) -> None:
        """The hook, bounded in time; its failure never keeps a model loaded."""
        if self.before_stop is None:
            return
        try:
            async with asyncio.timeout(self.before_stop_timeout):
                await self.before_stop(pool)
        except TimeoutError:
            logger.error(
                "saving the sessions of '%s' took over %gs: stopped without them",
                pool.runtime.name,
                self.before_stop_timeout,
            )
        except Exception:
            logger.exception("saving the sessions of '%s' failed", pool.runtime.name)

    async def close(self) -> None:
        """Cancel the stops in progress (serve is ending: every child is closed next)."""
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
