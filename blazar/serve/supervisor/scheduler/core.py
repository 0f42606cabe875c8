"""The scheduler: which instance serves a request, and which models stay loaded.

The daemon makes one `Scheduler` and hands it every pass's runtimes (`update`); the
request path resolves a name once (`resolve`, to a `Target`: the pool, the adapters
asked for, and the replica when `model#N` addressed one), leases a slot of it
(`acquire`) and gives it back (`release`). It composes its parts: `queueing` (slots, the
queue, priority, hand-off), `capacity` (load on demand, placement and eviction by memory
with `max_loaded_models` as an extra cap, waiting for room, keep_alive, drains and
stops), `memory` (the pure placement) and `reload` (hot reload: update, roll, retire,
adapters added), honouring the manifest's groups (`groups`: a together group's
companions loaded beside a model and unloaded with it) and what else it declares
(`declared`, set each pass): the GPUs a model may use (its placement's flags are put on
its children's command lines when a load is decided), the fairness bound (`fairness`:
while a load waits for room, the busy models' new requests wait their turn once the
window has passed) and warm pegs (`pegs`: an unloaded pegged model's files held in
memory). It keeps each model's footprint:
`fit`'s estimate until a child of it was measured (its peak resident set, or its GPU
memory, when it is ready and again when it unloads), then the measure, which
`on_measured` hands to the store so that the next serve starts from it. A full queue or
an expired wait is `Busy` (503 all_slots_busy with Retry-After); nothing is dropped
silently. The instances are made by an injected factory (`make_instance`), so tests
schedule stand-ins without processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from blazar.errors import InvalidInput
from blazar.host.hardware import Device, gpu_bytes, resident_bytes, system_memory
from blazar.serve.supervisor.dialects import OPENAI, adapters_refusal
from blazar.serve.supervisor.forks import Forks
from blazar.serve.supervisor.instance import Instance, InstanceSpec, State
from blazar.serve.supervisor.runtime import ModelRuntime, name_index, resolve
from blazar.serve.supervisor.scheduler import fairness, pegs, queueing
from blazar.serve.supervisor.scheduler.capacity import (
    BEFORE_STOP_TIMEOUT,
    BeforeStop,
    Capacity,
)
from blazar.serve.supervisor.scheduler.coreside import Coreside, coreside
from blazar.serve.supervisor.scheduler.declared import Declared
from blazar.serve.supervisor.scheduler.errors import (
    Busy,
    Misconfigured,
    ModelNotFound,
    Starting,
    model_not_found,
)
from blazar.serve.supervisor.scheduler.groups import Groups
from blazar.serve.supervisor.scheduler.memory import (
    Budget,
    Footprint,
    Memory,
    budgets,
    estimate_footprint,
    footprint_of,
    view,
)
from blazar.serve.supervisor.scheduler.pools import Decision, Lease, Member, Pool, Target
from blazar.serve.supervisor.scheduler.reload import Reload
from specs.names import AdapterChoice

logger = logging.getLogger("blazar.serve")
InstanceFactory = Callable[[InstanceSpec], Instance]
# (model, sha256 of its file, device kind) -> bytes one instance was measured at
Measured = Mapping[tuple[str, str, str], int]


def estimate_footprints(runtimes: Iterable[ModelRuntime], device_kind: str) -> dict[str, Footprint]:
    """Each model's estimated footprint on a device of `device_kind` (gpu | cpu), from its
    files' sizes (the one effect: stat)."""

    def size(path: str | None) -> int:
        try:
            return os.stat(path).st_size if path else 0
        except OSError:
            return 0

    return {
        r.name: estimate_footprint(
            r,
            weights=size(r.path),
            projector=size(r.projector),
            draft=size(r.tuning.draft_path),
            on_gpu=device_kind == "gpu",
        )
        for r in runtimes
    }


def footprints(
    runtimes: Iterable[ModelRuntime], measured: Measured, device_kind: str
) -> dict[str, Footprint]:
    """Each model's footprint: measured on this kind of device once a child of it ran
    (the store keeps those), else estimated (`blazar coreside` with no serve running)."""
    found = list(runtimes)
    estimates = estimate_footprints(found, device_kind)
    return {
        r.name: footprint_of(r, estimates[r.name], measured.get((r.name, r.sha256, device_kind)))
        for r in found
    }


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
        before_stop_timeout: float = BEFORE_STOP_TIMEOUT,
        devices: Sequence[Device] | None = None,
        memory_budget: int | str | None = None,
        min_residency: float = 0.0,
        measured: Measured | None = None,
        on_measured: Callable[[ModelRuntime, str, int], None] | None = None,
    ) -> None:
        """`devices`: where models live (the daemon's: every GPU, else host RAM); None
        schedules by `max_loaded` alone (tests with stand-ins)."""
        self.devices = tuple(devices) if devices is not None else None
        self.budgets: tuple[Budget, ...] = ()
        self.memory_budget = memory_budget
        self.min_residency = min_residency
        self.measured: dict[tuple[str, str, str], int] = dict(measured or {})
        self.on_measured = on_measured
        self.estimates: dict[str, Footprint] = {}
        self.groups = Groups()  # the manifest's [groups], set on each pass
        self._declared = Declared()  # devices, warm pegs, fairness: set on each pass
        self.pegs = pegs.Pegs()  # the files of unloaded warm_peg models, held resident
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.log_dir = log_dir
        self.on_event = on_event
        self.clock = clock
        self.starting = False  # until the daemon's first pass: unknown names are 503
        self.make_instance = make_instance or self._real_instance
        self.forks = Forks()  # a wheel engine's children forked warm (serving.fork_server)
        self.runtimes = dict(runtimes)
        self._names = name_index(self.runtimes)  # every name and alias, for `resolve`
        self.pools: dict[str, Pool] = {}
        self.retired: list[Pool] = []  # replaced or removed, still draining or stopping
        self.capacity = Capacity(
            self.all_pools,
            max_loaded=max_loaded,
            clock=clock,
            on_unload=self._on_unload,
            on_stopped=self._on_stopped,
            before_stop=before_stop,
            before_stop_timeout=before_stop_timeout,
            memory=self.memory,
            room_timeout=lambda: self.queue_timeout,
            groups=lambda: self.groups,
            on_load=self._on_load,
        )
        self.reload = Reload(self.pools, self.retired, self.capacity, self._pool)
        for runtime in runtimes.values():
            self.pools[runtime.name] = self._pool(runtime)
        self._estimate()

    # -- memory ---------------------------------------------------------------------------

    @property
    def memory_budget(self) -> int | str | None:
        return self._memory_budget

    @memory_budget.setter
    def memory_budget(self, setting: int | str | None) -> None:
        """`serving.memory_budget`: each device's budget from the devices seen at start."""
        self._memory_budget = setting
        self.budgets = budgets(self.devices, setting) if self.devices is not None else ()

    @property
    def device_kind(self) -> str:
        return "gpu" if any(b.kind == "gpu" for b in self.budgets) else "cpu"

    def _estimate(self) -> None:
        self.estimates = estimate_footprints(self.runtimes.values(), self.device_kind)

    def footprint(self, runtime: ModelRuntime) -> Footprint:
        """What the model takes: measured once a child of it ran, else estimated."""
        estimated = self.estimates.get(runtime.name, Footprint(0))
        measured = self.measured.get((runtime.name, runtime.sha256, self.device_kind))
        return footprint_of(runtime, estimated, measured)

    def coreside(self, asked: Sequence[str] = ()) -> Coreside:
        """`blazar coreside`'s answer from the pools as they are; `asked`: names or
        aliases (ModelNotFound for an unknown one)."""
        names = [self.resolve(a).runtime.name for a in asked]
        memory = self.memory() or Memory(self.budgets, {}, groups=self.groups)
        runtimes = sorted(self.runtimes.values(), key=lambda r: r.name)
        answer = coreside(runtimes, self.all_pools(), memory, names, max_loaded=self.max_loaded)
        return dataclasses.replace(answer, pegged=self.pegs.sizes(), peg_budget=self.peg_budget)

    def memory(self) -> Memory | None:
        """The memory view the room decisions take (None: by count alone)."""
        if self.devices is None:
            return None
        pools = self.all_pools()
        return Memory(
            self.budgets,
            {p.runtime.name: self.footprint(p.runtime) for p in pools},
            now=self.clock(),
            min_residency=self.min_residency,
            pinned=self.declared.devices,
            groups=self.groups,
        )

    @property
    def declared(self) -> Declared:
        return self._declared

    @declared.setter
    def declared(self, declared: Declared) -> None:
        """What the manifest declares beyond the runtimes (set on each pass): pegs of
        models no longer pegged are released, the rest fit the (new) budget."""
        self._declared = declared
        self.pegs.sync(declared.pegs)
        self.pegs.fit(self.peg_budget)

    @property
    def peg_budget(self) -> int:
        """`serving.warm_peg_budget` in bytes (a share is of host RAM)."""
        setting = self.declared.peg_budget
        host = None if isinstance(setting, int) else system_memory()
        return pegs.budget_bytes(setting, host)

    def peg(self, pool: Pool) -> None:
        """A warm_peg model unloads: hold its files' pages resident (weights, projector,
        draft), within the peg budget."""
        runtime = pool.runtime
        if runtime.name not in self.declared.pegs:
            return
        if self.pegs.touch(runtime.name, pool.last_used):
            self.pegs.fit(self.peg_budget)
            return
        files = [f for f in (runtime.path, runtime.projector, runtime.tuning.draft_path) if f]
        self.capacity.spawn(self._hold(runtime.name, files, pool.last_used))

    async def _hold(self, name: str, files: list[str], used: float) -> None:
        """Map and read in the files in a thread (MAP_POPULATE of a big file whose pages
        are not cached reads it from disk: seconds the event loop must not wait), then
        keep them if the model is still pegged, within the budget."""
        held = await asyncio.to_thread(pegs.hold, files)
        if name not in self.declared.pegs or self.pegs.touch(name, used):
            held.close()  # no longer pegged, or pegged meanwhile by another unload
            return
        self.pegs.add(name, held, used)
        self.pegs.fit(self.peg_budget)

    def placement_args(self, pool: Pool) -> tuple[str, ...]:
        """The child's flags for where its load was placed (GPUs: `Placement.flags`);
        the wheel's launcher takes no --device list, so it gets the spelling it has."""
        if pool.placement is None:
            return ()
        launcher = bool(pool.runtime.command) and pool.runtime.command[-1].endswith(".py")
        return pool.placement.flags(device_list=not launcher)

    def memory_use(self) -> list[dict[str, Any]]:
        """Each device's budget, total and bytes in use (`memory.view`), for /metrics."""
        return view(self.budgets, self.all_pools())

    def measure(self, pool: Pool) -> None:
        """Record what one running instance of the pool uses (the largest of its
        instances), when /proc or NVML can tell."""
        kind = self.device_kind
        sizes = [
            gpu_bytes(pid) if kind == "gpu" else resident_bytes(pid)
            for pid in (m.instance.pid for m in pool.members)
            if pid is not None
        ]
        used = max(sizes, default=0)
        if used <= 0 or self.devices is None:
            return
        runtime = pool.runtime
        self.measured[(runtime.name, runtime.sha256, kind)] = used
        if pool.placement is not None:  # the room it holds is what it uses, not the guess
            pool.placement = pool.placement.scaled(self.footprint(runtime).bytes)
        if self.on_measured is not None:
            self.on_measured(runtime, kind, used)

    # The settings the daemon changes on each pass, kept where they are used.
    @property
    def max_loaded(self) -> int:
        return self.capacity.max_loaded

    @max_loaded.setter
    def max_loaded(self, value: int) -> None:
        self.capacity.max_loaded = value

    @property
    def before_stop(self) -> BeforeStop | None:
        return self.capacity.before_stop

    @before_stop.setter
    def before_stop(self, hook: BeforeStop | None) -> None:
        self.capacity.before_stop = hook

    @property
    def evictions(self) -> dict[tuple[str, str], int]:
        """Models unloaded for another's load, by (model, reason: memory | count | group)."""
        return self.capacity.evictions

    # -- pools ----------------------------------------------------------------------------

    def all_pools(self) -> list[Pool]:
        """Every pool: each model's, its elder's, and the retired ones still stopping."""
        current = list(self.pools.values())
        elders = [p.elder for p in current if p.elder is not None]
        return [*current, *elders, *self.retired]

    def _pool(self, runtime: ModelRuntime, tag: str = "") -> Pool:
        """A pool of new instances: `model/N` (`tag` after it: `model/N+fox` for the
        instances started beside an elder's, with logs of their own)."""
        members = [Member(self._instance(runtime, i, tag)) for i in range(runtime.instances)]
        return Pool(runtime, members)

    def _instance(self, runtime: ModelRuntime, replica: int, tag: str) -> Instance:
        safe = runtime.name.replace(":", "_")
        spec = InstanceSpec(
            key=f"{runtime.name}/{replica}{tag}",
            model=runtime.name,
            replica=replica,
            engine_tag=runtime.engine_tag,
            command=runtime.command,
            args=runtime.args(),
            log_path=self.log_dir / f"{safe}-{replica}{tag}.log",
            slots=runtime.slots,
            ctx=runtime.ctx,
        )
        return self.make_instance(spec)

    def _real_instance(self, spec: InstanceSpec) -> Instance:
        return Instance(spec, on_event=self.on_event, spawn=self.forks.spawn)

    def _on_unload(self, pool: Pool) -> None:
        """Its children still run: measure their peak once more. A warm_peg model's files
        are held resident. An elder that unloads is dropped: the model converges to its
        current pool. A model of a together group that unloads (evicted, expired,
        stopped) takes its companions with it: they drain."""
        self.measure(pool)
        self.peg(pool)
        for current in self.pools.values():
            if current.elder is pool:
                current.elder = None
                pool.retired = True
                self.retired.append(pool)
        if pool.retired or self.pools.get(pool.runtime.name) is not pool:
            return  # a reload replaces it: its group stays
        for name in sorted(self.groups.companions(pool.runtime.name)):
            mate = self.pools.get(name)
            if mate is not None and mate.loaded and mate.stopping is None:
                self.capacity.drain(mate)

    def _on_load(self, pool: Pool) -> None:
        """A load was decided: its children (not started yet) get the flags of its
        placement; a together group's companions load beside it."""
        extra = self.placement_args(pool)
        for member in pool.members:
            if not extra and not member.placed:
                continue  # host RAM (or stand-ins): nothing to add, nothing to take off
            spec = member.instance.spec
            base = spec.args[: len(spec.args) - len(member.placed)] if member.placed else spec.args
            member.instance.spec = dataclasses.replace(spec, args=base + extra)
            member.placed = extra
        for name in sorted(self.groups.companions(pool.runtime.name)):
            mate = self.pools.get(name)
            if mate is not None and not mate.loaded and mate.loading is None:
                self.capacity.spawn(self._bring(mate, pool.runtime.name))

    async def _bring(self, pool: Pool, beside: str) -> None:
        """Load a companion and start its instances; its failure is logged, never the
        failure of the request that loaded `beside`."""
        name = pool.runtime.name
        problem = pool.runtime.refusal or pool.runtime.settings_problem
        try:
            if problem is not None:
                raise InvalidInput(problem)
            if pool.stopping is not None:
                await asyncio.shield(pool.stopping)
            if not pool.loaded and pool.loading is None:
                await self.capacity.load(pool)
            elif pool.loading is not None:
                await asyncio.shield(pool.loading)
            await asyncio.gather(*(m.instance.ensure_ready() for m in pool.members))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "'%s' was not loaded beside '%s' (together group): %s", name, beside, exc
            )
            return
        self.measure(pool)
        if pool.loaded and pool.in_flight == 0 and not pool.waiters and pool.expires_at is None:
            self.capacity.settle(pool, None)  # its keep_alive counts from now

    def _on_stopped(self, pool: Pool) -> None:
        if pool.retired and pool in self.retired:
            self.retired.remove(pool)

    async def warm_up(self) -> None:
        """Start the warm replicas of every model that declares some (not while an elder
        still serves the model: the new pool loads when it is needed, docs/lora.md)."""
        for pool in list(self.pools.values()):
            if (
                pool.runtime.replicas > 0
                and not pool.loaded
                and pool.stopping is None
                and pool.elder is None
                and pool.runtime.refusal is None
                and not pool.runtime.settings_problem
            ):
                await self.capacity.load(pool)
                for member in pool.members:
                    self.capacity.spawn(self._quiet_ready(member.instance))

    @staticmethod
    async def _quiet_ready(instance: Instance) -> None:
        with contextlib.suppress(Exception):
            await instance.ensure_ready()

    # -- acquiring a slot -----------------------------------------------------------------

    def resolve(
        self, requested: str, visible: Callable[[ModelRuntime], bool] | None = None
    ) -> Target:
        """The model, adapters and replica a requested name means; ModelNotFound (404) for
        an unknown model, adapter or replica, InvalidName (400) for a malformed name.
        `visible` (an API key's view) answers a model it does not see as if it were absent,
        naming only the models it sees, before anything of the model is told."""
        try:
            runtime, asked = resolve(self.runtimes, requested, self._names)
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
        return self._target(self.pools[runtime.name], asked.adapters, asked.replica)

    @staticmethod
    def _target(
        pool: Pool, adapters: tuple[AdapterChoice, ...] | None, replica: int | None
    ) -> Target:
        runtime = pool.runtime
        if adapters and runtime.dialect == OPENAI:  # a mistralrs lane: none per request
            raise InvalidInput(adapters_refusal(runtime.name))
        for choice in adapters or ():
            if runtime.adapter_index(choice.name) is None:
                known = ", ".join(runtime.variants) or "none: `blazar lora add` declares one"
                raise ModelNotFound(
                    f"model '{runtime.name}' has no adapter '{choice.name}'; its adapters: {known}"
                )
        if replica is not None and replica >= len(pool.members):
            count = len(pool.members)
            which = "#0" if count == 1 else f"#0 to #{count - 1}"
            raise ModelNotFound(
                f"model '{runtime.name}' has no replica #{replica}: it runs {count} "
                f"instance{'s' if count != 1 else ''} ({which}; `blazar ps` lists them)"
            )
        return Target(pool, adapters, replica)

    def _serving(self, target: Target) -> tuple[Target, Pool]:
        """The target as the model is now (resolved before a reload replaced its pool:
        the new one), and the pool that serves it now (the model's, or its elder)."""
        if target.pool.retired:
            name = target.runtime.name
            current = self.pools.get(name)
            if current is None:
                raise model_not_found(name, self.runtimes)
            target = self._target(current, target.adapters, target.replica)
        return target, target.pool.serving(target.adapters)

    async def acquire(
        self,
        target: Target,
        *,
        priority: bool = False,
        keep_alive: float | None = None,
        prefer: int | None = None,
    ) -> Lease:
        """A slot on an instance of the target's model, loading it and waiting in its
        queue as needed; on replica `prefer` when it has a free slot (prefix affinity:
        `affinity`). Raises SchedulerError (Busy, NoCapacity) or InstanceFailed."""
        if target.runtime.settings_problem is not None:
            raise Misconfigured(
                f"model '{target.runtime.name}' is not started: "
                f"{target.runtime.settings_problem}; then apply"
            )
        begin = time.perf_counter_ns()
        evicted: list[str] = []
        room_s = 0.0
        turn_ns = 0
        while True:  # each check and the slot taken after it run without an await between
            target, pool = self._serving(target)
            if pool.stopping is not None:
                await self._await_stop(pool)
            elif pool.loading is not None:
                await asyncio.shield(pool.loading)
            elif not pool.loaded:
                room_s += await self.capacity.load(pool, evicted, priority=priority)
            elif self._held(pool, priority):
                turn_ns = turn_ns or time.perf_counter_ns()
                await self._wait_turn(pool, turn_ns)
            else:
                break
        if keep_alive is not None:
            pool.expires_at = None  # decided again when the request is done
        loaded = time.perf_counter_ns()
        wanted = pool.members[target.replica] if target.replica is not None else None
        preferred = None  # prefix affinity's replica, if this pool still has it
        if prefer is not None and prefer < len(pool.members):
            preferred = pool.members[prefer]
        member = queueing.take(pool, wanted, priority, preferred)
        if member is None:
            member = await queueing.wait(
                pool,
                priority=priority,
                wanted=wanted,
                max_queue=self.max_queue,
                timeout=self.queue_timeout,
                give_back=lambda m: self.release(Lease(pool, m)),
            )  # handed over, slot counted
            how = "queued"
        elif len(pool.members) == 1:
            how = "warm"
        else:
            how = "affinity" if member is preferred else "least_loaded"
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
            self.measure(pool)
        load_ns = (loaded - begin) + (time.perf_counter_ns() - waited if starting else 0)
        decision = Decision(
            how,
            tuple(evicted),
            waited - loaded,
            load_ns,
            in_flight,
            len(pool.members),
            room_ns=int(room_s * 1e9),
        )
        return Lease(pool, member, target.adapters, decision)

    def _held(self, pool: Pool, priority: bool) -> bool:
        """Whether a new request for the loaded `pool` waits for its turn (`fairness`)."""
        window = self.declared.fairness_window
        waiting = self.capacity.waiting
        if not waiting or window <= 0 or priority:
            return False
        memory = self.memory()
        wants = None
        if memory is not None:  # the devices each waiting load could get room on
            wants = fairness.wants(waiting, self.all_pools(), memory)
        return fairness.held(pool, waiting, self.clock(), window, priority=priority, wants=wants)

    async def _wait_turn(self, pool: Pool, since_ns: int) -> None:
        """Wait while another model's load takes its turn (woken when room changes, and
        looking again each second); Busy (503) after serving.queue_timeout."""
        left = self.queue_timeout - (time.perf_counter_ns() - since_ns) / 1e9
        if left <= 0:
            raise Busy(
                f"model '{pool.runtime.name}' is waiting for its turn: another model's load "
                f"has waited for its room longer than serving.fairness_window, and it did not "
                f"come back within {self.queue_timeout:g}s (serving.queue_timeout); retry",
                retry_after=max(1.0, self.queue_timeout / 2),
            )
        await self.capacity.wait_for_room(min(left, 1.0), priority=False)

    async def _await_stop(self, pool: Pool) -> None:
        """Wait for a draining or unloading pool to stop, so that it can load again."""
        assert pool.stopping is not None
        try:
            async with asyncio.timeout(self.queue_timeout):
                await asyncio.shield(pool.stopping)
        except TimeoutError:
            raise Busy(
                f"model '{pool.runtime.name}' is being stopped (`blazar stop`, or keep_alive "
                f"0) and its requests did not finish within {self.queue_timeout:g}s "
                "(serving.queue_timeout); retry",
                retry_after=max(1.0, self.queue_timeout / 2),
            ) from None

    def release(self, lease: Lease, *, keep_alive: float | None = None) -> None:
        pool, member = lease.pool, lease.member
        pool.last_used = self.clock()
        if queueing.hand_off(pool, member):
            return  # the slot passed to a waiter, still counted
        member.in_flight -= 1
        if pool.in_flight == 0 and not pool.waiters:
            self.capacity.settle(pool, keep_alive)

    # -- unloading ------------------------------------------------------------------------

    async def stop_model(self, requested: str) -> bool:
        """Unload a model now (`blazar stop`, ollama's keep_alive 0): it takes no new
        lease (those wait for the next load), its requests in flight and queued finish,
        then its children stop. False when it was not loaded."""
        pool = self.resolve(requested).pool
        pools = [p for p in (pool.elder, pool) if p is not None]
        stops = [self.capacity.drain(p) for p in pools if p.loaded or p.stopping is not None]
        if not stops:
            return False
        await asyncio.shield(asyncio.gather(*stops))
        return True

    async def reap(self) -> None:
        """Unload idle models whose keep_alive ran out."""
        await self.capacity.reap()

    # -- hot reload -----------------------------------------------------------------------

    async def update(self, runtimes: dict[str, ModelRuntime]) -> dict[str, str]:
        """Apply new runtimes: restart only models whose instance arguments changed, and
        not those that only gained adapters (`reload.Reload.add_adapters`).

        Returns what happened per model: added, restarted, updated, removed, ...
        """
        changes = await self.reload.update(runtimes)
        self.runtimes = dict(runtimes)
        self._names = name_index(self.runtimes)  # every name and alias, for `resolve`
        self._estimate()
        self.forks.keep(r.command for r in self.runtimes.values())  # an engine replaced
        await self.warm_up()
        return changes

    # -- views and shutdown ---------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        now = self.clock()
        rows = []
        for pool in self.all_pools():
            for member in pool.members:
                inst = member.instance
                if inst.state == State.STOPPED:
                    continue
                footprint = self.footprint(pool.runtime)
                expires = pool.expires_at
                remaining = None if expires is None else max(0.0, expires - now)
                rows.append(
                    {
                        "model": pool.runtime.name,
                        "replica": inst.spec.replica,
                        "engine": pool.runtime.engine_tag,
                        "lane": pool.runtime.engine_lane,
                        "route": pool.runtime.engine_route or None,
                        "pid": inst.pid,
                        "port": inst.port,
                        "slots": pool.runtime.slots,
                        "ctx": pool.runtime.slot_ctx,
                        "in_flight": member.in_flight,
                        "queued": len(pool.waiters),
                        "keep_alive_remaining": remaining,
                        "pinned": pool.runtime.pin,
                        "state": str(inst.state),
                        "retired": pool.retired,
                        "adapters": [a.name for a in pool.runtime.adapters],
                        "size": pool.runtime.facts.get("size"),
                        "footprint": footprint.bytes,
                        "footprint_source": footprint.source,
                        "devices": list(pool.placement.devices) if pool.placement else [],
                        "pegged": self.pegs.sizes().get(pool.runtime.name, 0),
                        **pool.runtime.tuning.view(),  # spec mode, profile fields (tune.md)
                    }
                )
        return rows

    async def close(self) -> None:
        """Stop every child: nothing is left running when serve ends."""
        await self.capacity.close()
        self.pegs.close()
        loaded = [p for p in self.all_pools() if p.loaded and not p.in_flight]
        await asyncio.gather(*(self.capacity.run_before_stop(p) for p in loaded))
        members = [m for p in self.all_pools() for m in p.members]
        await asyncio.gather(*(m.instance.close() for m in members), return_exceptions=True)
        await self.forks.close()
