"""Stopping models without holding anyone up, with stand-in instances (no processes).

The scheduler decides what to stop without an await (the victim marked so nothing
leases or picks it) and stops it in a task of its own: a session-bank hook that hangs,
or a model that takes long to stop, delays only the load that needs its room.
`blazar stop` drains: no new lease, the requests in flight finish, then it unloads.
Each scenario is ordered by events (a hook that waits on a gate, `until` turns of the
event loop), not by sleeps; `asyncio.wait_for` bounds only a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blazar.serve.supervisor.instance import State
from blazar.serve.supervisor.runtime import Adapter
from blazar.serve.supervisor.scheduler import Lease, Pool, Scheduler, reload_action
from tests.gateway_harness import runtime
from tests.test_scheduler import Clock, loaded, make
from tests.waiting import until


class Hook:
    """A `before_stop` hook that records each call and, for the models in `hang`, waits
    on `gate` (set by the test, or never)."""

    def __init__(self, *hang: str) -> None:
        self.hang, self.gate = set(hang), asyncio.Event()
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    async def __call__(self, pool: Pool) -> None:
        name = pool.runtime.name
        self.calls.append(name)
        if name in self.hang:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise


async def used(s: Scheduler, *names: str, clock: Clock | None = None) -> None:
    """Load each model by one request, in order (the first is the least recently used)."""
    for name in names:
        s.release(await s.acquire(s.resolve(name)))
        if clock is not None:
            clock.now += 1


def test_a_hanging_before_stop_hook_is_bounded_and_holds_no_other_load() -> None:
    async def scenario() -> None:
        hook = Hook("a")
        s = make(
            runtime("a"), runtime("b"), max_loaded=2, before_stop=hook, before_stop_timeout=0.05
        )
        await used(s, "a")
        stopping = asyncio.create_task(s.stop_model("a"))
        await until(lambda: hook.calls == ["a"], "the hook to start saving a's sessions")
        assert loaded(s) == []  # a is marked at once: nothing leases it any more
        lease = await asyncio.wait_for(s.acquire(s.resolve("b")), 5)  # not behind a's hook
        assert not stopping.done() and hook.cancelled == []
        s.release(lease)
        assert await asyncio.wait_for(stopping, 5) is True  # the hook's timeout ended it
        assert hook.cancelled == ["a"] and loaded(s) == ["b"]
        assert s.pools["a"].members[0].instance.state is State.STOPPED

    asyncio.run(scenario())


def test_evicting_a_model_holds_up_only_the_load_that_needs_its_room() -> None:
    """Regression: the scheduler held its capacity lock while the victim's hook ran, so
    every other cold load waited for it (up to the hook's 60 s)."""

    async def scenario() -> None:
        clock, hook = Clock(), Hook("a")
        s = make(
            runtime("a"),
            runtime("x"),
            runtime("b"),
            runtime("c"),
            max_loaded=2,
            clock=clock,
            before_stop=hook,
        )
        await used(s, "a", "x", clock=clock)
        c = asyncio.create_task(s.acquire(s.resolve("c")))  # evicts a, the oldest
        await until(lambda: hook.calls == ["a"], "a's eviction to begin")
        b = await asyncio.wait_for(s.acquire(s.resolve("b")), 5)  # evicts x meanwhile
        assert hook.calls == ["a", "x"] and b.decision.evicted == ("x",)
        assert not c.done()  # c waits for a's room, and only c
        hook.gate.set()
        lease_c = await asyncio.wait_for(c, 5)
        assert lease_c.decision.evicted == ("a",) and loaded(s) == ["b", "c"]
        assert s.evictions == {("a", "count"): 1, ("x", "count"): 1}
        s.release(b)
        s.release(lease_c)

    asyncio.run(scenario())


def test_a_request_for_a_model_being_evicted_waits_and_loads_it_again() -> None:
    async def scenario() -> None:
        clock, hook = Clock(), Hook("a")
        s = make(
            runtime("a"), runtime("x"), runtime("c"), max_loaded=2, clock=clock, before_stop=hook
        )
        await used(s, "a", "x", clock=clock)
        c = asyncio.create_task(s.acquire(s.resolve("c")))  # evicts a
        await until(lambda: hook.calls == ["a"], "a's eviction to begin")
        a = asyncio.create_task(s.acquire(s.resolve("a")))  # never a lease of the victim
        await until(lambda: not a.done() and not c.done(), "both waiting")
        hook.gate.set()
        lease_c, lease_a = await asyncio.wait_for(asyncio.gather(c, a), 5)
        assert lease_a.member.instance.starts == 2  # stopped, then loaded again
        assert lease_a.decision.evicted == ("x",) and loaded(s) == ["a", "c"]
        s.release(lease_a)
        s.release(lease_c)

    asyncio.run(scenario())


def steady(s: Scheduler, name: str, *, hold: int, done: asyncio.Event) -> asyncio.Task[int]:
    """Traffic on `name` until `done`: a new request every turn of the loop, each holding
    its slot for `hold` turns, so some request is always in flight. Returns how many were
    served; a failed request fails the task."""

    async def one() -> None:
        lease = await s.acquire(s.resolve(name))
        for _ in range(hold):
            await asyncio.sleep(0)
        s.release(lease)

    async def run() -> int:
        requests = []
        while not done.is_set():
            requests.append(asyncio.create_task(one()))
            await asyncio.sleep(0)
        await asyncio.gather(*requests)
        return len(requests)

    return asyncio.create_task(run())


def test_stop_model_under_steady_traffic_completes() -> None:
    """Regression: `stop_model` polled until no request was in flight, which never
    happens under steady traffic (ollama's keep_alive 0 calls it from a request). Now
    it drains: new requests wait for the next load, and those in flight finish."""

    async def scenario() -> None:
        s = make(runtime("m", slots=4, keep_alive=-1.0))
        pool, done = s.pools["m"], asyncio.Event()
        traffic = steady(s, "m", hold=2, done=done)
        await until(lambda: pool.in_flight >= 2, "traffic to flow")
        assert await asyncio.wait_for(s.stop_model("m"), 5) is True
        instance: Any = pool.members[0].instance
        await until(lambda: instance.starts == 2, "a request to load it again")
        done.set()
        served = await asyncio.wait_for(traffic, 5)  # none failed
        assert served > 4 and pool.in_flight == 0

    asyncio.run(scenario())


def test_stop_model_lets_queued_requests_finish_and_keeps_new_ones_waiting() -> None:
    async def scenario() -> None:
        s = make(runtime("m"), queue_timeout=5.0)
        pool = s.pools["m"]
        held = await s.acquire(s.resolve("m"))
        queued = asyncio.create_task(s.acquire(s.resolve("m")))
        await until(lambda: pool.waiters, "a request queued")
        stopping = asyncio.create_task(s.stop_model("m"))
        later = asyncio.create_task(s.acquire(s.resolve("m")))
        await until(lambda: pool.draining, "the drain to begin")
        s.release(held)
        first = await asyncio.wait_for(queued, 5)  # queued before the stop: served
        assert first.member.instance.starts == 1 and not later.done()  # type: ignore[attr-defined]
        s.release(first)
        assert await asyncio.wait_for(stopping, 5) is True
        second = await asyncio.wait_for(later, 5)  # after the stop: the model loaded again
        assert second.member.instance.starts == 2  # type: ignore[attr-defined]
        s.release(second)
        assert await s.stop_model("m") is True and await s.stop_model("m") is False

    asyncio.run(scenario())


def test_a_request_waiting_for_a_stop_longer_than_queue_timeout_is_busy() -> None:
    async def scenario() -> None:
        s = make(runtime("m"), queue_timeout=0.05)
        held = await s.acquire(s.resolve("m"))
        stopping = asyncio.create_task(s.stop_model("m"))
        await until(lambda: s.pools["m"].draining, "the drain to begin")
        with pytest.raises(Exception, match="is being stopped") as busy:
            await s.acquire(s.resolve("m"))
        assert getattr(busy.value, "status", None) == 503
        s.release(held)
        assert await asyncio.wait_for(stopping, 5) is True

    asyncio.run(scenario())


# -- adapters added while a model is loaded (docs/lora.md) --------------------------------------

FOX = Adapter("fox", "/a/fox.gguf", 1.0)
OWL = Adapter("owl", "/a/owl.gguf", 0.5)


def with_adapters(*adapters: Adapter, **fields: Any) -> dict[str, Any]:
    return {"m": runtime("m", slots=4, keep_alive=-1.0, adapters=adapters, **fields)}


def lease_of(s: Scheduler) -> Callable[[str], Any]:
    return lambda name: s.acquire(s.resolve(name))


def test_an_adapter_added_to_a_loaded_model_keeps_its_child_serving() -> None:
    async def scenario() -> None:
        s = make(*with_adapters(OWL).values())
        lease = lease_of(s)
        s.release(await lease("m"))
        child = s.pools["m"].members[0].instance
        changes = await s.update(with_adapters(OWL, FOX))
        assert changes["m"].startswith("adapters added (fox): the running instance keeps")
        assert child.state is State.READY and s.retired == []
        base, owl = await lease("m"), await lease("m+owl:0.2")
        assert base.member.instance is child and owl.member.instance is child
        assert owl.lora == [{"id": 0, "scale": 0.2}]
        fox = await lease("m+fox+owl")  # only the new child has fox
        assert fox.member.instance is not child and fox.member.instance.state is State.READY
        assert fox.lora == [{"id": 1, "scale": 1.0}, {"id": 0, "scale": 0.5}]
        rows = {(r["pid"], tuple(r["adapters"])) for r in s.snapshot()}
        assert len(rows) == 2 and {a for _, a in rows} == {("owl",), ("owl", "fox")}
        for each in (base, owl, fox):
            s.release(each)
        # scales change in place for both; the elder keeps only its own adapters
        await s.update(with_adapters(Adapter("owl", "/a/owl.gguf", 0.9), FOX))
        owl = await lease("m+owl")
        assert owl.member.instance is child and owl.lora == [{"id": 0, "scale": 0.9}]
        s.release(owl)
        # once stopped, the model comes back as one child with every adapter
        assert await asyncio.wait_for(s.stop_model("m"), 5) is True
        await until(lambda: not s.retired, "the elder to be dropped")
        again: Lease = await lease("m")
        assert again.member.instance is s.pools["m"].members[0].instance
        assert s.pools["m"].elder is None and len(s.snapshot()) == 1
        s.release(again)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"adapters": (Adapter("fox", "/a/fox.gguf", 1.0, always_on=True),)}, "restarted"),
        ({"adapters": (FOX,), "ctx": 1024}, "restarted"),  # more than adapters changed
        ({"adapters": ()}, "updated"),  # nothing to add: the same model
    ],
)
def test_other_changes_still_restart(change: dict[str, Any], expected: str) -> None:
    async def scenario() -> dict[str, str]:
        s = make(runtime("m", keep_alive=-1.0))
        s.release(await s.acquire(s.resolve("m")))
        result = await s.update({"m": runtime("m", keep_alive=-1.0, **change)})
        await s.close()
        return result

    expect = {"m": expected} if expected != "updated" else {}
    assert asyncio.run(scenario()) == expect


def test_an_adapter_added_to_a_model_not_loaded_is_just_there() -> None:
    async def scenario() -> None:
        s = make(*with_adapters().values())
        assert await s.update(with_adapters(FOX)) == {"m": "adapters added (fox)"}
        lease = await s.acquire(s.resolve("m+fox"))
        assert lease.lora == [{"id": 0, "scale": 1.0}] and s.pools["m"].elder is None
        s.release(lease)
        await s.close()

    asyncio.run(scenario())


def test_a_load_that_waited_for_its_room_serves_its_request_first() -> None:
    """Even a keep_alive 0 model, and a load whose request left while it waited
    expires like any other model."""

    async def scenario() -> None:
        clock, hook = Clock(), Hook("a")
        s = make(
            runtime("a"),
            runtime("now", keep_alive=0.0),
            runtime("b", keep_alive=10.0),
            max_loaded=1,
            clock=clock,
            before_stop=hook,
        )
        await used(s, "a", clock=clock)
        now = asyncio.create_task(s.acquire(s.resolve("now")))  # evicts a, waits for it
        await until(lambda: hook.calls == ["a"], "a's eviction to begin")
        hook.gate.set()
        lease = await asyncio.wait_for(now, 5)
        assert loaded(s) == ["now"] and lease.member.instance.starts == 1  # type: ignore[attr-defined]
        s.release(lease)  # keep_alive 0: unloaded after its request, not before
        assert loaded(s) == []
        await until(lambda: s.pools["now"].stopping is None, "now to stop")
        s.release(await s.acquire(s.resolve("a")))
        hook.gate, hook.calls = asyncio.Event(), []
        gone = asyncio.create_task(s.acquire(s.resolve("b")))  # evicts a, waits ...
        await until(lambda: hook.calls == ["a"], "a's eviction to begin")
        gone.cancel()  # ... and its client leaves
        with pytest.raises(asyncio.CancelledError):
            await gone
        hook.gate.set()
        await until(lambda: s.pools["a"].stopping is None, "a to stop")
        assert loaded(s) == ["b"] and s.pools["b"].expires_at == clock.now + 10.0
        await s.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("old", "new", "loaded", "action"),
    [
        ({}, None, True, "removed"),
        ({}, {}, True, ""),
        ({}, {"keep_alive": 60.0}, True, "update"),
        ({}, {"adapters": (FOX,)}, True, "adapters"),
        ({"adapters": (OWL,)}, {"adapters": (FOX, OWL)}, False, "adapters"),
        ({"adapters": (OWL,)}, {"adapters": (FOX,)}, True, "restart"),  # one removed
        ({}, {"adapters": (Adapter("fox", "/a/fox.gguf", 1.0, always_on=True),)}, True, "restart"),
        (
            {"adapters": (FOX,)},
            {"adapters": (Adapter("fox", "/b/fox.gguf", 1.0),)},
            True,
            "restart",
        ),
        ({}, {"adapters": (FOX,), "replicas": 2}, True, "restart"),
        ({}, {"ctx": 1024}, True, "restart"),
        ({}, {"command": ("other-server",)}, True, "roll"),
        ({}, {"command": ("other-server",)}, False, "restart"),
    ],
)
def test_reload_action_is_a_pure_table(
    old: dict[str, Any], new: dict[str, Any] | None, loaded: bool, action: str
) -> None:
    before = runtime("m", **old)
    after = None if new is None else runtime("m", **new)
    assert reload_action(before, after, loaded=loaded) == action
