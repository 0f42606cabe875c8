"""Scheduling decisions with stand-in instances (no processes): queue order, eviction, expiry.

The live behaviour is in test_serve.py; here the timing is under the test's control.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Busy, NoCapacity, Pool, Scheduler, choose_eviction
from tests.gateway_harness import StandIn, runtime


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

        tasks = [asyncio.create_task(waiter("a", False))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(waiter("b", False)))
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(waiter("urgent", True)))
        await asyncio.sleep(0)
        assert len(s.pools["m"].waiters) == 3
        s.release(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["urgent", "a", "b"]


def test_full_queue_and_expired_wait_are_busy() -> None:
    async def scenario() -> None:
        s = make(runtime("m"), max_queue=1, queue_timeout=0.05)
        held = await s.acquire(s.resolve("m"))
        waiting = asyncio.create_task(s.acquire(s.resolve("m")))
        await asyncio.sleep(0)
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
            runtime("a"), runtime("b"), runtime("c"), runtime("p", pin=True),
            max_loaded=2, clock=clock,
        )  # fmt: skip
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
        await asyncio.sleep(0.01)
        assert loaded(s) == []

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
        await asyncio.sleep(0.01)
        assert s.retired == []  # the old instance of a was idle: stopped at once
        assert (await s.update({"a": runtime("a", ctx=1024)})) == {"b": "removed", "c": "removed"}

    asyncio.run(scenario())


def test_model_hash_n_addresses_one_replica_and_blocks_no_one_else() -> None:
    async def scenario() -> None:
        s = make(runtime("m", replicas=2))
        pool = s.pools["m"]
        one = await s.acquire(s.resolve("m#1"))
        assert one.member is pool.members[1]  # replica 0 was free: #1 still means #1
        waiting = asyncio.create_task(s.acquire(s.resolve("m#1")))
        await asyncio.sleep(0)
        assert len(pool.waiters) == 1
        other = await asyncio.wait_for(s.acquire(s.resolve("m")), 1)  # not stuck behind it
        assert other.member is pool.members[0]
        s.release(other)  # replica 0 frees up: not what the waiter asked for
        await asyncio.sleep(0)
        assert not waiting.done()
        s.release(one)
        second = await asyncio.wait_for(waiting, 1)
        assert second.member is pool.members[1]
        s.release(second)
        assert pool.in_flight == 0 and not pool.waiters

    asyncio.run(scenario())
