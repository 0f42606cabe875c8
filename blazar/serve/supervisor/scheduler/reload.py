"""Hot reload: new runtimes for the models served, with as few restarts as possible.

Called by the scheduler's `update` on every control-loop pass. What each model needs
is a pure function of its old and new runtime (`reload_action`): nothing, an update
in place (keep_alive, pins, adapter scales), a roll to another engine (the new
instances first, healthy, then the old ones drain), adapters added (the running
children keep serving, see `Reload.add_adapters`), or a restart (new instances; the
old ones drain and stop). A retired pool's queued requests are answered with a
retryable 503 (`Reloading`): the retry reaches the new instances, or a 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler.capacity import Capacity
from blazar.serve.supervisor.scheduler.errors import Reloading
from blazar.serve.supervisor.scheduler.pools import Pool
from blazar.serve.supervisor.scheduler.queueing import refuse_waiters


def narrowed(runtime: ModelRuntime, names: set[str]) -> ModelRuntime:
    """The runtime with only the adapters named (in its own order)."""
    return replace(runtime, adapters=tuple(a for a in runtime.adapters if a.name in names))


def adapter_names(runtime: ModelRuntime) -> set[str]:
    return {a.name for a in runtime.adapters}


def adapters_added(old: ModelRuntime, new: ModelRuntime) -> tuple[str, ...]:
    """Pure: the adapters `new` adds to `old` when that is all that changed in its
    instances' arguments and none of them is always-on (a plain request would need it);
    () otherwise."""
    before = adapter_names(old)
    if not before <= adapter_names(new) or new.instances != old.instances:
        return ()
    added = [a for a in new.adapters if a.name not in before]
    if not added or any(a.always_on for a in added):
        return ()
    if narrowed(new, before).args() != old.args() or new.command != old.command:
        return ()
    return tuple(a.name for a in added)


def reload_action(old: ModelRuntime, new: ModelRuntime | None, *, loaded: bool) -> str:
    """Pure: removed | roll | adapters | restart | update | "" (nothing to do)."""
    if new is None:
        return "removed"
    if new.command != old.command and new.command and loaded:
        return "roll"
    if new.args() != old.args() or new.command != old.command:
        return "adapters" if adapters_added(old, new) else "restart"
    return "update" if new != old else ""


class Reload:
    """Applies new runtimes to the scheduler's `pools` (by model) and `retired` list;
    `make_pool(runtime, tag)` makes a pool whose instances' names end with `tag`."""

    def __init__(
        self,
        pools: dict[str, Pool],
        retired: list[Pool],
        capacity: Capacity,
        make_pool: Callable[[ModelRuntime, str], Pool],
    ) -> None:
        self.pools, self.retired = pools, retired
        self.capacity, self.make_pool = capacity, make_pool

    async def update(self, runtimes: dict[str, ModelRuntime]) -> dict[str, str]:
        """What happened per model: added, restarted, updated, removed, rolled ..., or
        adapters added (...)."""
        changes: dict[str, str] = {}
        for name, pool in list(self.pools.items()):
            new = runtimes.get(name)
            match reload_action(pool.runtime, new, loaded=pool.loaded):
                case "removed":
                    changes[name] = "removed"
                    self.retire(pool)
                    del self.pools[name]
                case "roll" if new is not None:
                    changes[name] = await self.roll(pool, new)
                case "adapters" if new is not None:
                    changes[name] = self.add_adapters(pool, new)
                case "restart" if new is not None:
                    changes[name] = "restarted"
                    self.retire(pool)
                    self.pools[name] = self.make_pool(new, "")
                case "update" if new is not None:
                    changes[name] = "updated"
                    pool.runtime = new
                    self._keep_elder(pool, pool.elder, new)
        for name, runtime in runtimes.items():
            if name not in self.pools:
                changes[name] = "added"
                self.pools[name] = self.make_pool(runtime, "")
        return changes

    def add_adapters(self, pool: Pool, new: ModelRuntime) -> str:
        """Adapters added, none always-on: llama-server cannot load an adapter into a
        running child, and restarting it would lose its KV cache and its requests' time.
        A loaded pool becomes the model's elder: its children keep serving every request
        whose adapters they have; a request for a new adapter starts the new pool, whose
        children load every adapter (the weights are mmap'd, shared with the elder's).
        The elder is dropped the first time it unloads (keep_alive, eviction, `blazar
        stop`), so the model converges to one child per replica with every adapter."""
        added = adapters_added(pool.runtime, new)
        tag = "+" + "+".join(added)  # the new children's names: not the elder's log files
        if pool.loaded and not pool.draining:
            if pool.elder is not None:  # one elder at most: the older one drains and stops
                self.retire(pool.elder)
                pool.elder = None
            pool.runtime, pool.superseded = narrowed(new, adapter_names(pool.runtime)), True
            fresh = self.make_pool(new, tag)
            fresh.elder = pool
            self.pools[new.name] = fresh
            return (
                f"adapters added ({', '.join(added)}): the running instance keeps serving; "
                "a request for them starts one with every adapter"
            )
        elder, pool.elder = pool.elder, None
        fresh = self.make_pool(new, tag if elder is not None else "")
        self._keep_elder(fresh, elder, new)
        self.retire(pool)
        self.pools[new.name] = fresh
        return f"adapters added ({', '.join(added)})"

    def _keep_elder(self, pool: Pool, elder: Pool | None, new: ModelRuntime) -> None:
        """`elder` serves on under `pool` with `new`'s settings for its adapters, unless
        its children's arguments would differ: then it drains and stops."""
        pool.elder = None
        if elder is None:
            return
        kept = narrowed(new, adapter_names(elder.runtime))
        if kept.args() == elder.runtime.args() and kept.command == elder.runtime.command:
            elder.runtime, pool.elder = kept, elder
        else:
            self.retire(elder)

    async def roll(self, pool: Pool, new: ModelRuntime) -> str:
        """Move a loaded model to another engine without losing a request: the new
        instances start and become healthy while the old ones keep serving; only then do
        requests go to the new pool and the old one drains and stops. A new instance that
        fails to start leaves the old pool serving (the next pass tries again)."""
        fresh = self.make_pool(new, "")
        try:
            await asyncio.gather(*(m.instance.ensure_ready() for m in fresh.members))
        except Exception as exc:
            await asyncio.gather(*(m.instance.close() for m in fresh.members))
            return f"kept on {pool.runtime.engine_tag}: {new.engine_tag} failed to start ({exc})"
        fresh.loaded = True
        fresh.last_used = pool.last_used
        self.capacity.settle(fresh, None)
        self.retire(pool, drain_queue=True)
        self.pools[new.name] = fresh
        return f"rolled from {pool.runtime.engine_tag} to {new.engine_tag}"

    def retire(self, pool: Pool, *, drain_queue: bool = False) -> None:
        """Drain, then stop for good: in-flight requests finish on the old instances (and,
        with `drain_queue`, the queued ones too, as slots free up; otherwise they are
        answered `Reloading`, to retry). The pool's elder goes with it."""
        pool.retired = True
        if not drain_queue:
            refuse_waiters(
                pool,
                Reloading(
                    f"model '{pool.runtime.name}' was reloaded (its settings changed, or it "
                    "was removed) while this request waited for a slot; retry",
                    retry_after=1,
                ),
            )
        if pool not in self.retired:
            self.retired.append(pool)
        if pool.elder is not None:
            elder, pool.elder = pool.elder, None
            self.retire(elder, drain_queue=drain_queue)
        if pool.loaded:
            if pool.in_flight == 0 and not pool.waiters:
                self.capacity.begin_unload(pool)  # otherwise the last release unloads it
        elif pool.stopping is None:  # nothing runs: close its instances' owners now
            self.capacity.spawn(self._close(pool))

    async def _close(self, pool: Pool) -> None:
        await asyncio.gather(*(m.instance.close() for m in pool.members))
        if pool in self.retired:
            self.retired.remove(pool)
