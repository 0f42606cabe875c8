"""Scheduling decisions with stand-in instances (no processes): queue order, eviction, expiry.

The live behaviour is in test_serve.py; here the timing is under the test's control.
"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import (
    Busy,
    NoCapacity,
    Pool,
    Reloading,
    Room,
    Scheduler,
    choose_eviction,
    plan_room,
)
from tests.gateway_harness import StandIn, runtime
from tests.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(*runtimes: ModelRuntime, **options: Any) -> Scheduler:
    settings: dict[str, Any] = dict(
        max_loaded=2, max_queue=8, queue_timeout=5.0, log_dir=Path("/tmp"), make_instance=StandIn
    )
    settings.update(options)
    return Scheduler({r.name: r for r in runtimes}, **settings)


def loaded(s: Scheduler) -> list[str]:
    return sorted(name for name, pool in s.pools.items() if pool.loaded)


def test_priority_waiters_go_first() -> None:
    async def scenario() -> list[str]:
        s = make(runtime("m"))
        first = await s.acquire(s.resolve("m"))
        order: list[str] = []

        async def waiter(tag: str, priority: bool) -> None:
            lease = await s.acquire(s.resolve("m"), priority=priority)
            order.append(tag)
            s.release(lease)

        tasks: list[asyncio.Task[None]] = []
        for n, (tag, priority) in enumerate([("a", False), ("b", False), ("urgent", True)], 1):
            tasks.append(asyncio.create_task(waiter(tag, priority)))
            await until(lambda n=n: len(s.pools["m"].waiters) == n, f"{tag} queued")
        s.release(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["urgent", "a", "b"]


def test_full_queue_and_expired_wait_are_busy() -> None:
    async def scenario() -> None:
        s = make(runtime("m"), max_queue=1, queue_timeout=0.05)
        held = await s.acquire(s.resolve("m"))
        waiting = asyncio.create_task(s.acquire(s.resolve("m")))
        await until(lambda: s.pools["m"].waiters, "a request queued")
        with pytest.raises(Busy, match="requests are queued") as full:
            await s.acquire(s.resolve("m"))
        assert full.value.retry_after == 1
        with pytest.raises(Busy, match="no slot freed up"):
            await waiting
        s.release(held)
        assert s.pools["m"].in_flight == 0 and not s.pools["m"].waiters

    asyncio.run(scenario())


def test_lru_eviction_spares_pins_and_busy_models() -> None:
    async def scenario() -> None:
        clock = Clock()
        s = make(
            runtime("a"),
            runtime("b"),
            runtime("c"),
            runtime("p", pin=True),
            max_loaded=2,
            clock=clock,
            queue_timeout=0.2,  # the load that finds no room waits this long for one
        )
        for name in ("a", "b"):
            s.release(await s.acquire(s.resolve(name)))
            clock.now += 1
        s.release(await s.acquire(s.resolve("c")))  # a is the least recently used
        assert loaded(s) == ["b", "c"]
        clock.now += 1
        s.release(await s.acquire(s.resolve("p")))
        assert loaded(s) == ["c", "p"]
        busy = await s.acquire(s.resolve("c"))
        with pytest.raises(NoCapacity, match="pinned, kept warm or busy"):
            await s.acquire(s.resolve("a"))
        s.release(busy)
        clock.now += 1
        s.release(await s.acquire(s.resolve("a")))
        assert loaded(s) == ["a", "p"]

    asyncio.run(scenario())


def test_choose_eviction_is_pure() -> None:
    idle = [Pool(runtime(n), [], loaded=True, last_used=t) for n, t in (("x", 5), ("y", 3))]
    assert choose_eviction(idle).runtime.name == "y"  # type: ignore[union-attr]
    pinned = [Pool(runtime("z", pin=True), [], loaded=True, last_used=1)]
    assert choose_eviction(pinned) is None


def test_keep_alive_expiry_and_per_request_values() -> None:
    async def scenario() -> None:
        clock = Clock()
        s = make(runtime("m", keep_alive=10.0), clock=clock)
        s.release(await s.acquire(s.resolve("m")))
        assert s.pools["m"].expires_at == clock.now + 10
        clock.now += 11
        await s.reap()
        assert loaded(s) == []
        s.release(await s.acquire(s.resolve("m")), keep_alive=-1)  # forever
        clock.now += 10_000
        await s.reap()
        assert loaded(s) == ["m"]
        s.release(await s.acquire(s.resolve("m")), keep_alive=0)  # unload after the request
        assert loaded(s) == []  # at once: its child stops in a task of its own
        await until(lambda: s.pools["m"].stopping is None, "its child to stop")

    asyncio.run(scenario())


def test_hot_reload_restarts_only_changed_models() -> None:
    async def scenario() -> None:
        s = make(runtime("a"), runtime("b"))
        s.release(await s.acquire(s.resolve("a")))
        s.release(await s.acquire(s.resolve("b")))
        old_b = s.pools["b"]
        changes = await s.update(
            {"a": runtime("a", ctx=1024), "b": runtime("b", keep_alive=60.0), "c": runtime("c")}
        )
        assert changes == {"a": "restarted", "b": "updated", "c": "added"}
        assert s.pools["b"] is old_b and s.pools["b"].runtime.keep_alive == 60.0
        await until(lambda: not s.retired, "the old instance of a, idle, to stop at once")
        assert (await s.update({"a": runtime("a", ctx=1024)})) == {"b": "removed", "c": "removed"}
        await s.close()

    asyncio.run(scenario())


def test_model_hash_n_addresses_one_replica_and_blocks_no_one_else() -> None:
    async def scenario() -> None:
        s = make(runtime("m", replicas=2))
        pool = s.pools["m"]
        one = await s.acquire(s.resolve("m#1"))
        assert one.member is pool.members[1]  # replica 0 was free: #1 still means #1
        waiting = asyncio.create_task(s.acquire(s.resolve("m#1")))
        await until(lambda: len(pool.waiters) == 1, "m#1 queued")
        other = await asyncio.wait_for(s.acquire(s.resolve("m")), 1)  # not stuck behind it
        assert other.member is pool.members[0]
        s.release(other)  # replica 0 frees up: not what the waiter asked for
        assert pool.waiters and pool.members[0].in_flight == 0  # still waiting for #1
        s.release(one)
        second = await asyncio.wait_for(waiting, 1)
        assert second.member is pool.members[1]
        s.release(second)
        assert pool.in_flight == 0 and not pool.waiters

    asyncio.run(scenario())


# -- the queue: hand-off, cancellation, reloads -----------------------------------------------


def test_a_waiter_cancelled_after_it_was_handed_a_slot_gives_it_back() -> None:
    """Regression: Python 3.11's wait_for returned the slot handed over as its task was
    cancelled, and the request went on without its client. The hand-off and the cancel
    happen in one turn of the loop, so the waiter is resumed only with the cancellation."""

    async def scenario() -> None:
        s = make(runtime("m"))
        pool = s.pools["m"]
        held = await s.acquire(s.resolve("m"))
        first = asyncio.create_task(s.acquire(s.resolve("m")))
        second = asyncio.create_task(s.acquire(s.resolve("m")))
        await until(lambda: len(pool.waiters) == 2, "two requests queued")
        s.release(held)  # the slot goes to `first`, still counted ...
        first.cancel()  # ... whose client leaves before it runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        lease = await asyncio.wait_for(second, 1)  # the slot passed on to the next
        assert pool.in_flight == 1 and not pool.waiters
        s.release(lease)
        assert pool.in_flight == 0

    asyncio.run(scenario())


def test_queued_requests_of_a_replaced_model_are_told_to_retry() -> None:
    async def scenario() -> None:
        s = make(runtime("m"))
        held = await s.acquire(s.resolve("m"))
        waiting = asyncio.create_task(s.acquire(s.resolve("m")))
        await until(lambda: s.pools["m"].waiters, "a request queued")
        old = s.pools["m"]
        assert await s.update({"m": runtime("m", ctx=1024)}) == {"m": "restarted"}
        with pytest.raises(Reloading, match="was reloaded") as told:
            await waiting
        assert told.value.status == 503 and told.value.retry_after == 1
        assert old in s.retired  # draining: the request in flight goes on
        s.release(held)
        await until(lambda: not s.retired, "the old instance to stop")
        again = await s.acquire(s.resolve("m"))  # the retry reaches the new instance
        assert again.pool is s.pools["m"] and again.runtime.ctx == 1024
        s.release(again)

    asyncio.run(scenario())


# -- room: the pure decision --------------------------------------------------------------------


def pool(name: str, used: float = 0, **state: Any) -> Pool:
    fields = {k: state.pop(k) for k in ("pin", "replicas") if k in state}
    each = Pool(runtime(name, **fields), [], loaded=state.pop("loaded", True), last_used=used)
    for key, value in state.items():
        setattr(each, key, value)
    return each


def test_plan_room_counts_models_and_evicts_the_least_recently_used_idle_ones() -> None:
    async def scenario() -> None:
        stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        new = pool("new", loaded=False)
        a, b, pinned = pool("a", 1), pool("b", 2), pool("p", 0, pin=True)
        assert plan_room([a, b], new, 3) == Room()
        assert plan_room([a, b], new, 2) == Room(evict=(a,))
        assert plan_room([a, b, pinned], new, 2) == Room(evict=(a, b))  # lowered max: two
        assert plan_room([pinned], new, 1) is None  # a pin never goes
        busy = pool("a", 1, waiters=deque([object()]))
        assert plan_room([busy, b], new, 2) == Room(evict=(b,))
        # a model with an elder goes whole, or not at all
        elder, current = pool("a", 5), pool("a", 1)
        assert plan_room([elder, current, b], new, 2) == Room(evict=(b,))
        assert plan_room([elder, current], new, 1) == Room(evict=(elder, current))
        # a model being stopped counts until it has stopped; a load needing its room
        # claims it (and waits) rather than evicting another; one claimed is not counted
        going = pool("g", 0, loaded=False, stopping=stopping)
        assert plan_room([going, b], new, 3) == Room()
        assert plan_room([going, b], new, 2) == Room(claim=(going,))
        going.claimed = True
        assert plan_room([going, b], new, 2) == Room()
        # nothing else picks a load in progress (reserved, waiting for its room)
        loading = pool("l", 0, loading=stopping)
        assert plan_room([loading], new, 1) is None
        # the elder of the model being loaded is the same model: no room needed
        assert plan_room([pool("new", 1)], new, 1) == Room()

    asyncio.run(scenario())
