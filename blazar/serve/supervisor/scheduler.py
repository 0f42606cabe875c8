"""The scheduler: which instance serves a request, and which models stay loaded.

Decisions apart from effects: `choose_eviction` is a pure function of what is
loaded; starting and stopping go through the instances' owners. A model is
loaded on demand; `max_loaded_models` evicts the least recently used idle
model (pins and warm replicas are never evicted); `keep_alive` unloads an idle
model after its time (0: right after the request; -1: never); `slots` bound
the requests an instance runs at once, and the rest wait in a bounded queue,
`x-blazar-priority: high` at its front. A full queue or an expired wait is
`Busy` (503 all_slots_busy with Retry-After); nothing is dropped silently.

A request's model is resolved once (`resolve`, to a `Target`: the pool, the
adapters asked for, and the replica when `model#N` addressed one) and that
target is what `acquire` leases a slot of. The
instances are made by an injected factory (`make_instance`), so tests schedule
stand-ins without processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blazar.serve.supervisor.instance import Instance, InstanceSpec, State
from blazar.serve.supervisor.runtime import ModelRuntime, resolve
from specs.names import AdapterChoice

# A keep_alive of a hundred years or more is "forever": an expiry that far out would
# overflow the dates `/api/ps` shows.
FOREVER = 100 * 365 * 24 * 3600.0

logger = logging.getLogger("blazar.serve")
InstanceFactory = Callable[[InstanceSpec], Instance]
# Called with a pool whose instances are about to be stopped for any reason but a crash
# (idle, evicted, `blazar stop`, a reload, serve's shutdown), while they still run: the
# session bank saves their slots there (`blazar.serve.state.sessions`). It only talks HTTP to
# the children; stopping them stays their owners' job.
BeforeStop = Callable[["Pool"], Awaitable[None]]
BEFORE_STOP_TIMEOUT = 60.0


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


class Starting(SchedulerError):
    """A name asked for before serve's first pass built what is served (503)."""

    code = "starting"


class Busy(SchedulerError):
    code = "all_slots_busy"


class NoCapacity(SchedulerError):
    code = "max_loaded_models"


class Misconfigured(SchedulerError):
    """The model's settings cannot serve its GGUF (`ModelRuntime.settings_problem`): it is
    never spawned, and requests for it say why."""

    status = 400
    code = "model_misconfigured"


@dataclass
class Member:
    instance: Instance
    in_flight: int = 0


@dataclass(frozen=True)
class Waiter:
    """A queued request: handed a member (with its slot counted) when one frees up; only
    `member` when it addressed one replica (`model#N`)."""

    future: asyncio.Future[Member]
    member: Member | None = None

    def accepts(self, member: Member) -> bool:
        return self.member is None or self.member is member


@dataclass
class Pool:
    """The instances of one model (one per replica) and its queue."""

    runtime: ModelRuntime
    members: list[Member]
    waiters: deque[Waiter] = field(default_factory=deque)
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
    """What a requested name resolved to: a model's pool, the adapters asked for (None:
    the model's always-on ones) and the replica, when one was addressed (`model#N`)."""

    pool: Pool
    adapters: tuple[AdapterChoice, ...] | None = None
    replica: int | None = None

    @property
    def runtime(self) -> ModelRuntime:
        return self.pool.runtime

    @property
    def ready(self) -> bool:
        """Loaded with every instance ready: a lease now starts nothing."""
        pool = self.pool
        return pool.loaded and all(m.instance.state == State.READY for m in pool.members)


@dataclass(frozen=True)
class Decision:
    """How `acquire` chose the instance, for the request's trace (`blazar why`)."""

    how: str = "warm"  # warm | least_loaded | spawned | queued
    evicted: tuple[str, ...] = ()  # models unloaded to make room
    queue_ns: int = 0  # waiting in the model's queue for a slot
    load_ns: int = 0  # loading the model and starting the instance
    in_flight: int = 0  # requests already on the chosen instance
    replicas: int = 1


@dataclass(frozen=True)
class Lease:
    pool: Pool
    member: Member
    adapters: tuple[AdapterChoice, ...] | None = None  # as in Target
    decision: Decision = Decision()

    @property
    def lora(self) -> list[dict[str, Any]] | None:
        """The engine's per-request `lora` list for this request (None: the body needs none)."""
        return self.pool.runtime.lora_field(self.adapters)

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
        before_stop: BeforeStop | None = None,
    ) -> None:
        self.max_loaded = max_loaded
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.log_dir = log_dir
        self.on_event = on_event
        self.clock = clock
        self.starting = False  # until the daemon's first pass: unknown names are 503
        self.make_instance = make_instance or self._real_instance
        self.before_stop = before_stop
        self.runtimes = dict(runtimes)
        self.pools: dict[str, Pool] = {}
        self.retired: list[Pool] = []
        self.evictions: dict[str, int] = {}  # models evicted so far, for /metrics
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
            if (
                pool.runtime.replicas > 0
                and not pool.loaded
                and pool.runtime.refusal is None
                and not pool.runtime.settings_problem
            ):
                await self._load(pool)
                for member in pool.members:
                    self._spawn(self._quiet_ready(member.instance))

    @staticmethod
    async def _quiet_ready(instance: Instance) -> None:
        with contextlib.suppress(Exception):
            await instance.ensure_ready()

    # -- acquiring a slot -----------------------------------------------------

    def resolve(
        self, requested: str, visible: Callable[[ModelRuntime], bool] | None = None
    ) -> Target:
        """The model, adapters and replica a requested name means; ModelNotFound (404) for
        an unknown model, adapter or replica, InvalidName (400) for a malformed name.
        `visible` (an API key's view) answers a model it does not see as if it were absent,
        naming only the models it sees, before anything of the model is told."""
        try:
            runtime, asked = resolve(self.runtimes, requested)
            if visible is not None and not visible(runtime):
                served = (r.name for r in self.runtimes.values() if visible(r))
                raise model_not_found(requested, served)
        except KeyError:
            if self.starting:  # the first pass has not said yet what is served
                raise Starting(
                    f"Blazar is starting: model '{requested}' is not known yet, the first "
                    "pass over the manifest is still running; retry",
                    retry_after=1,
                ) from None
            served = (r.name for r in self.runtimes.values() if visible is None or visible(r))
            raise model_not_found(requested, served) from None
        for choice in asked.adapters or ():
            if runtime.adapter_index(choice.name) is None:
                known = ", ".join(runtime.variants) or "none: `blazar lora add` declares one"
                raise ModelNotFound(
                    f"model '{runtime.name}' has no adapter '{choice.name}'; its adapters: {known}"
                )
        pool = self.pools[runtime.name]
        if asked.replica is not None and asked.replica >= len(pool.members):
            count = len(pool.members)
            which = "#0" if count == 1 else f"#0 to #{count - 1}"
            raise ModelNotFound(
                f"model '{runtime.name}' has no replica #{asked.replica}: it runs {count} "
                f"instance{'s' if count != 1 else ''} ({which}; `blazar ps` lists them)"
            )
        return Target(pool, asked.adapters, asked.replica)

    async def acquire(
        self, target: Target, *, priority: bool = False, keep_alive: float | None = None
    ) -> Lease:
        """A slot on an instance of the target's model, loading it and waiting in its
        queue as needed. Raises SchedulerError (Busy, NoCapacity) or InstanceFailed."""
        pool = target.pool
        if pool.runtime.settings_problem is not None:
            raise Misconfigured(
                f"model '{pool.runtime.name}' is not started: {pool.runtime.settings_problem}; "
                "then apply"
            )
        if keep_alive is not None:
            pool.expires_at = None  # decided again when the request is done
        begin = time.perf_counter_ns()
        evicted: list[str] = []
        if not pool.loaded:
            await self._load(pool, evicted)
        loaded = time.perf_counter_ns()
        wanted = pool.members[target.replica] if target.replica is not None else None
        member = self._free_member(pool, wanted)
        if member is not None and not priority and any(w.accepts(member) for w in pool.waiters):
            member = None  # a request queued first could take it: nothing overtakes the queue
        if member is None:
            member = await self._wait(pool, priority, wanted)  # handed over, slot counted
            how = "queued"
        else:
            how = "least_loaded" if len(pool.members) > 1 else "warm"
            member.in_flight += 1
        waited = time.perf_counter_ns()
        pool.last_used = self.clock()
        in_flight = member.in_flight - 1
        starting = member.instance.state != State.READY
        if starting:  # a ready child needs no word with its owner (two loop turns saved)
            try:
                await member.instance.ensure_ready()
            except BaseException:
                self.release(Lease(pool, member, target.adapters))
                raise
        if starting:
            how = "spawned"
        load_ns = (loaded - begin) + (time.perf_counter_ns() - waited if starting else 0)
        decision = Decision(
            how, tuple(evicted), waited - loaded, load_ns, in_flight, len(pool.members)
        )
        return Lease(pool, member, target.adapters, decision)

    @staticmethod
    def _free_member(pool: Pool, wanted: Member | None = None) -> Member | None:
        candidates = pool.members if wanted is None else [wanted]
        free = [m for m in candidates if m.in_flight < pool.runtime.slots]
        return min(free, key=lambda m: m.in_flight) if free else None

    async def _wait(self, pool: Pool, priority: bool, wanted: Member | None = None) -> Member:
        if len(pool.waiters) >= self.max_queue:
            raise Busy(
                f"model '{pool.runtime.name}' is busy: all {pool.capacity} slots are in use "
                f"and {len(pool.waiters)} requests are queued (serving.max_queue)",
                retry_after=1,
            )
        future: asyncio.Future[Member] = asyncio.get_running_loop().create_future()
        waiter = Waiter(future, wanted)
        if priority:
            pool.waiters.appendleft(waiter)
        else:
            pool.waiters.append(waiter)
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
            if waiter in pool.waiters:
                pool.waiters.remove(waiter)
            if not future.done():
                future.cancel()

    def release(self, lease: Lease, *, keep_alive: float | None = None) -> None:
        pool, member = lease.pool, lease.member
        pool.last_used = self.clock()
        for waiter in list(pool.waiters):
            if waiter.future.done():
                pool.waiters.remove(waiter)
            elif waiter.accepts(member):
                pool.waiters.remove(waiter)
                waiter.future.set_result(member)  # the slot passes to the waiter, still counted
                return
        member.in_flight -= 1
        if pool.in_flight == 0:
            self._settle(pool, keep_alive)

    def _settle(self, pool: Pool, keep_alive: float | None) -> None:
        """An idle model: unload now, expire later, or keep (pins, replicas, -1)."""
        seconds = pool.runtime.keep_alive if keep_alive is None else keep_alive
        if pool.retired:
            self._spawn(self._unload(pool))
        elif pool.sticky or seconds < 0 or not seconds < FOREVER:  # not <: NaN, inf, huge
            pool.expires_at = None
        elif seconds == 0:
            self._spawn(self._unload(pool))
        else:
            pool.expires_at = self.clock() + seconds

    # -- loading and unloading ------------------------------------------------

    async def _load(self, pool: Pool, evicted: list[str] | None = None) -> None:
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
                self.evictions[victim.runtime.name] = self.evictions.get(victim.runtime.name, 0) + 1
                if evicted is not None:
                    evicted.append(victim.runtime.name)
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
        await self._before_stop(pool)
        await asyncio.gather(*(m.instance.stop() for m in pool.members))
        if pool.retired:
            await asyncio.gather(*(m.instance.close() for m in pool.members))
            if pool in self.retired:
                self.retired.remove(pool)

    async def _before_stop(self, pool: Pool) -> None:
        """The hook, bounded in time; its failure never keeps a model loaded."""
        if self.before_stop is None:
            return
        try:
            await asyncio.wait_for(self.before_stop(pool), BEFORE_STOP_TIMEOUT)
        except Exception:
            logger.exception("saving the sessions of '%s' failed", pool.runtime.name)

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
            elif new.command != pool.runtime.command and pool.loaded and new.command:
                changes[name] = await self._roll(pool, new)
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

    async def _roll(self, pool: Pool, new: ModelRuntime) -> str:
        """Move a loaded model to another engine without losing a request: the new
        instances start and become healthy while the old ones keep serving; only then do
        requests go to the new pool and the old one drains and stops. A new instance that
        fails to start leaves the old pool serving (the next pass tries again)."""
        fresh = self._pool(new)
        try:
            await asyncio.gather(*(m.instance.ensure_ready() for m in fresh.members))
        except Exception as exc:
            await asyncio.gather(*(m.instance.close() for m in fresh.members))
            return f"kept on {pool.runtime.engine_tag}: {new.engine_tag} failed to start ({exc})"
        fresh.loaded = True
        fresh.last_used = pool.last_used
        self._settle(fresh, None)
        self._retire(pool, drain_queue=True)
        self.pools[new.name] = fresh
        return f"rolled from {pool.runtime.engine_tag} to {new.engine_tag}"

    def _retire(self, pool: Pool, *, drain_queue: bool = False) -> None:
        """Drain, then stop: in-flight requests finish on the old instances (and, with
        `drain_queue`, the queued ones too, as slots free up)."""
        pool.retired = True
        for waiter in pool.waiters if not drain_queue else ():
            if not waiter.future.done():
                waiter.future.cancel()
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
                        "lane": pool.runtime.engine_lane,
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
                        **pool.runtime.tuning.view(),  # spec mode, profile fields (tune.md)
                    }
                )
        return rows

    async def close(self) -> None:
        """Stop every child: nothing is left running when serve ends."""
        for task in list(self._tasks):
            task.cancel()
        loaded = [p for p in self._all_pools() if p.loaded and not p.in_flight]
        await asyncio.gather(*(self._before_stop(p) for p in loaded))
        members = [m for p in self._all_pools() for m in p.members]
        await asyncio.gather(*(m.instance.close() for m in members), return_exceptions=True)
