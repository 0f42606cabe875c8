"""The scheduler: which instance serves a request, and which models stay loaded.

Decisions apart from effects: `choose_eviction` is a pure function of what is
loaded; starting and stopping go through the instances' owners. A model is
loaded on demand; `max_loaded_models` evicts the least recently used idle
model (pins and warm replicas are never evicted); `keep_alive` unloads an idle
model after its time (0: right after the request; -1: never); `slots` bound
the requests an instance runs at once, and the rest wait in a bounded queue,
`x-blazar-priority: high` at its front. A full queue or an expired wait is
`Busy` (503 all_slots_busy with Retry-After); nothing is dropped silently.

A request's model is resolved once (`resolve`, to a `Target`: the pool and the
adapter asked for) and that target is what `acquire` leases a slot of. The
instances are made by an injected factory (`make_instance`), so tests schedule
stand-ins without processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blazar.serve.instance import Instance, InstanceSpec, State
from blazar.serve.runtime import ModelRuntime, resolve

InstanceFactory = Callable[[InstanceSpec], Instance]


class SchedulerError(Exception):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotFound(SchedulerError):
    status = 404
    code = "model_not_found"


def model_not_found(requested: str, served: Iterable[str]) -> ModelNotFound:
    """The 404 for a name that is not served, naming the models that are."""
    names = ", ".join(sorted(served)) or "none"
    return ModelNotFound(
        f"model '{requested}' not found; models served here: {names}. "
        "Declare it in the manifest (or `blazar pull`) first."
    )


class Busy(SchedulerError):
    code = "all_slots_busy"


class NoCapacity(SchedulerError):
    code = "max_loaded_models"


@dataclass
class Member:
    instance: Instance
    in_flight: int = 0


@dataclass
class Pool:
    """The instances of one model (one per replica) and its queue."""

    runtime: ModelRuntime
    members: list[Member]
    waiters: deque[asyncio.Future[Member]] = field(default_factory=deque)
    loaded: bool = False
    last_used: float = 0.0
    expires_at: float | None = None  # None: no expiry while loaded
    retired: bool = False

    @property
    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.members)

    @property
    def capacity(self) -> int:
        return self.runtime.slots * len(self.members)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and not self.waiters

    @property
    def sticky(self) -> bool:
        """Never evicted nor expired: pinned, or warm replicas kept up."""
        return self.runtime.pin or self.runtime.replicas > 0


@dataclass(frozen=True)
class Target:
    """What a requested name resolved to: a model's pool, and the adapter asked for."""

    pool: Pool
    adapter: str | None

    @property
    def runtime(self) -> ModelRuntime:
        return self.pool.runtime

    @property
    def ready(self) -> bool:
        """Loaded with every instance ready: a lease now starts nothing."""
        pool = self.pool
        return pool.loaded and all(m.instance.state == State.READY for m in pool.members)


@dataclass(frozen=True)
class Lease:
    pool: Pool
    member: Member
    adapter: str | None

    @property
    def url(self) -> str:
        url = self.member.instance.url
        assert url is not None
        return url

    @property
    def runtime(self) -> ModelRuntime:
        return self.pool.runtime


def choose_eviction(pools: Sequence[Pool]) -> Pool | None:
    """Pure: the least recently used loaded model that may be evicted, if any."""
    candidates = [p for p in pools if p.loaded and p.idle and not p.sticky]
    return min(candidates, key=lambda p: p.last_used) if candidates else None


class Scheduler:
    def __init__(
        self,
        runtimes: dict[str, ModelRuntime],
        *,
        max_loaded: int,
        max_queue: int,
        queue_timeout: float,
        log_dir: Path,
        on_event: Callable[[Instance, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_instance: InstanceFactory | None = None,
    ) -> None:
        self.max_loaded = max_loaded
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.log_dir = log_dir
        self.on_event = on_event
        self.clock = clock
        self.make_instance = make_instance or self._real_instance
        self.runtimes = dict(runtimes)
        self.pools: dict[str, Pool] = {}
        self.retired: list[Pool] = []
        self._capacity = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        for runtime in runtimes.values():
            self.pools[runtime.name] = self._pool(runtime)

    # -- pools ----------------------------------------------------------------

    def _pool(self, runtime: ModelRuntime) -> Pool:
        members = [Member(self._instance(runtime, i)) for i in range(runtime.instances)]
        return Pool(runtime, members)

    def _instance(self, runtime: ModelRuntime, replica: int) -> Instance:
        safe = runtime.name.replace(":", "_")
        spec = InstanceSpec(
            key=f"{runtime.name}/{replica}",
            model=runtime.name,
            replica=replica,
            engine_tag=runtime.engine_tag,
            command=runtime.command,
            args=runtime.args(),
            log_path=self.log_dir / f"{safe}-{replica}.log",
            slots=runtime.slots,
            ctx=runtime.ctx,
        )
        return self.make_instance(spec)

    def _real_instance(self, spec: InstanceSpec) -> Instance:
        return Instance(spec, on_event=self.on_event)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def warm_up(self) -> None:
        """Start the warm replicas of every model that declares some."""
        for pool in list(self.pools.values()):
            if pool.runtime.replicas > 0 and not pool.loaded:
                await self._load(pool)
                for member in pool.members:
                    self._spawn(self._quiet_ready(member.instance))

    @staticmethod
    async def _quiet_ready(instance: Instance) -> None:
        with contextlib.suppress(Exception):
            await instance.ensure_ready()

    # -- acquiring a slot -----------------------------------------------------

    def resolve(self, requested: str) -> Target:
        """The model (and adapter) a requested name means; ModelNotFound if none."""
        try:
            runtime, adapter = resolve(self.runtimes, requested)
        except KeyError:
            raise model_not_found(requested, self.runtimes) from None
        if adapter is not None and runtime.adapter_index(adapter) is None:
            known = ", ".join(a.name for a in runtime.adapters) or "none"
            raise ModelNotFound(
                f"model '{runtime.name}' has no adapter '{adapter}' (adapters: {known})"
            )
        return Target(self.pools[runtime.name], adapter)

    async def acquire(
        self, target: Target, *, priority: bool = False, keep_alive: float | None = None
    ) -> Lease:
        """A slot on an instance of the target's model, loading it and waiting in its
        queue as needed. Raises SchedulerError (Busy, NoCapacity) or InstanceFailed."""
        pool, adapter = target.pool, target.adapter
        if keep_alive is not None:
            pool.expires_at = None  # decided again when the request is done
        if not pool.loaded:
            await self._load(pool)
        member = self._free_member(pool) if not pool.waiters or priority else None
        if member is None:
            member = await self._wait(pool, priority)  # handed over with its slot counted
        else:
            member.in_flight += 1
        pool.last_used = self.clock()
        lease = Lease(pool, member, adapter)
        try:
            await member.instance.ensure_ready()
        except BaseException:
            self.release(lease)
            raise
        return lease

    @staticmethod
    def _free_member(pool: Pool) -> Member | None:
        free = [m for m in pool.members if m.in_flight < pool.runtime.slots]
        return min(free, key=lambda m: m.in_flight) if free else None

    async def _wait(self, pool: Pool, priority: bool) -> Member:
        if len(pool.waiters) >= self.max_queue:
            raise Busy(
                f"model '{pool.runtime.name}' is busy: all {pool.capacity} slots are in use "
                f"and {len(pool.waiters)} requests are queued (serving.max_queue)",
                retry_after=1,
            )
        future: asyncio.Future[Member] = asyncio.get_running_loop().create_future()
        if priority:
            pool.waiters.appendleft(future)
        else:
            pool.waiters.append(future)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.queue_timeout)
        except TimeoutError:
            if future.done() and not future.cancelled():
                return future.result()  # handed a slot just as the wait expired
            raise Busy(
                f"model '{pool.runtime.name}' is busy: no slot freed up within "
                f"{self.queue_timeout:g}s (serving.queue_timeout)",
                retry_after=max(1.0, self.queue_timeout / 2),
            ) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed a slot, then abandoned
                self.release(Lease(pool, future.result(), None))
            raise
        finally:
            if future in pool.waiters:
                pool.waiters.remove(future)
            if not future.done():
                future.cancel()

    def release(self, lease: Lease, *, keep_alive: float | None = None) -> None:
        pool, member = lease.pool, lease.member
        pool.last_used = self.clock()
        while pool.waiters:
            future = pool.waiters.popleft()
            if not future.done():
                future.set_result(member)  # the slot passes to the waiter, still counted
                return
        member.in_flight -= 1
        if pool.in_flight == 0:
            self._settle(pool, keep_alive)

    def _settle(self, pool: Pool, keep_alive: float | None) -> None:
        """An idle model: unload now, expire later, or keep (pins, replicas, -1)."""
        seconds = pool.runtime.keep_alive if keep_alive is None else keep_alive
        if pool.retired:
            self._spawn(self._unload(pool))
        elif pool.sticky or seconds < 0:
            pool.expires_at = None
        elif seconds == 0:
            self._spawn(self._unload(pool))
        else:
            pool.expires_at = self.clock() + seconds

    # -- loading and unloading ------------------------------------------------

    async def _load(self, pool: Pool) -> None:
        async with self._capacity:
            if pool.loaded:
                return
            loaded = [p for p in self._all_pools() if p.loaded]
            while len(loaded) >= self.max_loaded:
                victim = choose_eviction(loaded)
                if victim is None:
                    raise NoCapacity(
                        f"cannot load '{pool.runtime.name}': max_loaded_models "
                        f"({self.max_loaded}) models are loaded and all are pinned, kept "
                        "warm or busy; retry later, or raise serving.max_loaded_models",
                        retry_after=5,
                    )
                await self._unload(victim, lock=False)
                loaded.remove(victim)
            pool.loaded = True
            pool.expires_at = None

    async def _unload(self, pool: Pool, *, lock: bool = True) -> None:
        if lock:
            async with self._capacity:
                await self._unload(pool, lock=False)
            return
        if not pool.loaded or pool.in_flight:
            return
        pool.loaded = False
        pool.expires_at = None
        await asyncio.gather(*(m.instance.stop() for m in pool.members))
        if pool.retired:
            await asyncio.gather(*(m.instance.close() for m in pool.members))
            if pool in self.retired:
                self.retired.remove(pool)

    async def stop_model(self, requested: str) -> bool:
        """Unload a model now (`blazar stop`); its in-flight requests finish first."""
        pool = self.resolve(requested).pool
        if not pool.loaded:
            return False
        while pool.in_flight:
            await asyncio.sleep(0.05)
        await self._unload(pool)
        return True

    async def reap(self) -> None:
        """Unload idle models whose keep_alive ran out."""
        now = self.clock()
        for pool in list(self._all_pools()):
            if pool.loaded and pool.idle and pool.expires_at is not None and pool.expires_at <= now:
                await self._unload(pool)

    def _all_pools(self) -> list[Pool]:
        return [*self.pools.values(), *self.retired]

    # -- hot reload -----------------------------------------------------------

    async def update(self, runtimes: dict[str, ModelRuntime]) -> dict[str, str]:
        """Apply new runtimes: restart only models whose instance arguments changed.

        Returns what happened per model: added, restarted, updated, removed.
        """
        changes: dict[str, str] = {}
        for name, pool in list(self.pools.items()):
            new = runtimes.get(name)
            if new is None:
                changes[name] = "removed"
                self._retire(pool)
                del self.pools[name]
            elif new.args() != pool.runtime.args() or new.command != pool.runtime.command:
                changes[name] = "restarted"
                self._retire(pool)
                self.pools[name] = self._pool(new)
            elif new != pool.runtime:
                changes[name] = "updated"
                pool.runtime = new
        for name, runtime in runtimes.items():
            if name not in self.pools:
                changes[name] = "added"
                self.pools[name] = self._pool(runtime)
        self.runtimes = dict(runtimes)
        await self.warm_up()
        return changes

    def _retire(self, pool: Pool) -> None:
        """Drain, then stop: in-flight requests finish on the old instances."""
        pool.retired = True
        for waiter in pool.waiters:
            if not waiter.done():
                waiter.cancel()
        self.retired.append(pool)
        if pool.in_flight == 0:
            self._spawn(self._unload(pool))

    # -- views and shutdown ---------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        now = self.clock()
        rows = []
        for pool in self._all_pools():
            for member in pool.members:
                inst = member.instance
                if inst.state == State.STOPPED:
                    continue
                expires = pool.expires_at
                remaining = None if expires is None else max(0.0, expires - now)
                rows.append(
                    {
                        "model": pool.runtime.name,
                        "replica": inst.spec.replica,
                        "engine": pool.runtime.engine_tag,
                        "pid": inst.pid,
                        "port": inst.port,
                        "slots": pool.runtime.slots,
                        "ctx": pool.runtime.ctx,
                        "in_flight": member.in_flight,
                        "queued": len(pool.waiters),
                        "keep_alive_remaining": remaining,
                        "pinned": pool.runtime.pin,
                        "state": str(inst.state),
                        "retired": pool.retired,
                        "size": pool.runtime.facts.get("size"),
                    }
                )
        return rows

    async def close(self) -> None:
        """Stop every child: nothing is left running when serve ends."""
        for task in list(self._tasks):
            task.cancel()
        members = [m for p in self._all_pools() for m in p.members]
        await asyncio.gather(*(m.instance.close() for m in members), return_exceptions=True)
