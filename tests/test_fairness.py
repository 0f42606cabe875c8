"""The fairness bound (issue 31): while a load waits for room that a busy model holds,
that model's new requests take slots only for `serving.fairness_window`; then they wait
their turn and the waiting model loads. `x-blazar-priority: high` is never held.

The rule is a pure function (`fairness.held`, a table); the scheduler is exercised with
stand-in instances (timing under the test's control) and once on a real serve.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.host.hardware import Device
from blazar.serve.supervisor.scheduler import Declared, NoCapacity, Pool, Scheduler
from blazar.serve.supervisor.scheduler.fairness import held, wants
from blazar.serve.supervisor.scheduler.memory import Budget, Footprint, Memory
from blazar.serve.supervisor.scheduler.pools import Placement
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.gateway_harness import StandIn, runtime
from tests.serving import Served

GIB = 1024**3


def pool(name: str, *, loaded: bool = True, **fields: Any) -> Pool:
    return Pool(runtime(name, **fields), [], loaded=loaded)


A, B = pool("a"), pool("b", loaded=False)


@pytest.mark.parametrize(
    ("resident", "waiting", "now", "window", "priority", "expected"),
    [
        (A, {}, 100.0, 10.0, False, False),  # nobody waits for room
        (A, {B: 95.0}, 100.0, 10.0, False, False),  # waited 5 s: within the window
        (A, {B: 90.0}, 100.0, 10.0, False, True),  # waited 10 s: the resident waits
        (A, {B: 50.0}, 100.0, 10.0, True, False),  # priority: never held
        (A, {B: 50.0}, 100.0, 0.0, False, False),  # no window: never held
        (A, {A: 50.0}, 100.0, 10.0, False, False),  # its own load does not hold it
        (pool("a", pin=True), {B: 50.0}, 100.0, 10.0, False, False),  # pinned: never gives room
        (pool("a", replicas=1), {B: 50.0}, 100.0, 10.0, False, False),  # warm replicas: same
        (pool("a", loaded=False), {B: 50.0}, 100.0, 10.0, False, False),  # not loaded
    ],
)
def test_held(
    resident: Pool,
    waiting: dict[Pool, float],
    now: float,
    window: float,
    priority: bool,
    expected: bool,
) -> None:
    assert held(resident, waiting, now, window, priority=priority) is expected


def test_only_the_models_on_a_device_the_waiting_load_may_use_are_held() -> None:
    on0, on1 = pool("a"), pool("c")
    on0.placement = Placement((("gpu:0", 10),))
    on1.placement = Placement((("gpu:1", 10),))
    waiting = {B: 50.0}
    wants = {B: {"gpu:1"}}  # 'b' can only go to gpu:1 (models.b.devices, or its size)
    assert not held(on0, waiting, 100.0, 10.0, wants=wants)
    assert held(on1, waiting, 100.0, 10.0, wants=wants)
    assert held(on0, waiting, 100.0, 10.0, wants={B: {"gpu:0", "gpu:1"}})


def test_the_devices_a_waiting_load_wants_leave_out_what_pins_hold() -> None:
    budgets = tuple(Budget(f"gpu:{i}", "gpu", i, 10 * GIB, 10 * GIB) for i in (0, 1))
    pinned = pool("p", pin=True)
    pinned.placement = Placement((("gpu:1", 8 * GIB),))
    busy = pool("a")
    busy.placement = Placement((("gpu:0", 8 * GIB),))
    waiting = pool("b", loaded=False)
    sizes = {"p": Footprint(8 * GIB), "a": Footprint(8 * GIB), "b": Footprint(6 * GIB)}
    memory = Memory(budgets, sizes)
    # gpu:1's room is a pin's: only gpu:0's busy model can make room for 'b'
    assert wants([waiting], [pinned, busy, waiting], memory) == {waiting: {"gpu:0"}}
    pinned_to_1 = Memory(budgets, sizes, pinned={"b": (1,)})
    assert wants([waiting], [pinned, busy, waiting], pinned_to_1) == {waiting: set()}
    assert not held(busy, {waiting: 0.0}, 100.0, 10.0, wants={waiting: set()})


def make(window: float, queue_timeout: float) -> Scheduler:
    s = Scheduler(
        {r.name: r for r in (runtime("a"), runtime("b"))},
        max_loaded=1,  # the device holds one of them (count as the extra cap)
        max_queue=8,
        queue_timeout=queue_timeout,
        log_dir=Path("/tmp"),
        make_instance=StandIn,
        devices=[Device("cpu", 0, "RAM", 64 * GIB, 64 * GIB)],
        min_residency=0.0,
    )
    s.declared = Declared(fairness_window=window)
    return s


async def keep_busy(s: Scheduler, stop: asyncio.Event, served: list[float]) -> None:
    """A client of 'a' that always has a request in flight or queued."""
    while not stop.is_set():
        lease = await s.acquire(s.resolve("a"))
        served.append(time.monotonic())
        await asyncio.sleep(0.02)
        s.release(lease)


def test_a_busy_model_gives_its_turn_after_the_window() -> None:
    async def scenario() -> tuple[float, int, int]:
        s = make(window=0.3, queue_timeout=10.0)
        stop, served = asyncio.Event(), []
        clients = [asyncio.create_task(keep_busy(s, stop, served)) for _ in range(2)]
        await asyncio.sleep(0.2)
        began = time.monotonic()
        lease = await s.acquire(s.resolve("b"))  # waits for room, then 'a' waits its turn
        took = time.monotonic() - began
        assert s.pools["b"].loaded and not s.pools["a"].loaded
        assert lease.decision.evicted == ("a",) and lease.decision.room_ns > 0.25e9
        before = len(served)
        # a priority request for 'a' is never held: it waits for room, not for a turn
        s.release(lease)  # 'b' idle: 'a' takes its place back
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*clients)
        await s.close()
        return took, before, len(served)

    took, before, after = asyncio.run(scenario())
    assert 0.3 <= took < 2.0, took  # the window, then the busy model's last request
    assert after > before  # 'a' served again once 'b' was done: no request refused


def test_without_a_window_the_waiting_load_runs_out_its_queue_timeout() -> None:
    async def scenario() -> None:
        s = make(window=0.0, queue_timeout=0.8)
        stop, served = asyncio.Event(), []
        clients = [asyncio.create_task(keep_busy(s, stop, served)) for _ in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(NoCapacity):
            await s.acquire(s.resolve("b"))
        stop.set()
        await asyncio.gather(*clients)
        await s.close()

    asyncio.run(scenario())


def test_priority_requests_are_never_held() -> None:
    async def scenario() -> None:
        s = make(window=0.1, queue_timeout=10.0)
        first = await s.acquire(s.resolve("a"))  # 'a' busy
        waiting = asyncio.create_task(s.acquire(s.resolve("b")))
        await asyncio.sleep(0.3)  # past the window: plain requests for 'a' now wait
        plain = asyncio.create_task(s.acquire(s.resolve("a")))
        urgent = asyncio.create_task(s.acquire(s.resolve("a"), priority=True))
        await asyncio.sleep(0.1)
        assert not plain.done()
        s.release(first)  # the slot passes to the priority request, queued in 'a'
        urgent_lease = await asyncio.wait_for(urgent, 1)
        assert not waiting.done()  # 'a' still busy with the priority request
        s.release(urgent_lease)
        b = await asyncio.wait_for(waiting, 2)  # then 'b' takes its turn
        s.release(b)
        s.release(await asyncio.wait_for(plain, 2))  # and 'a' comes back
        await s.close()

    asyncio.run(scenario())


def test_served_a_waiting_model_gets_its_turn_while_another_stays_busy(
    tmp_path: Path, blazar_home: Path
) -> None:
    models = write_models(tmp_path / "models", "tiny", "other")
    manifest = (
        '[serving]\nmax_loaded_models = 1\nmin_residency = "0s"\nfairness_window = "1s"\n'
        'queue_timeout = "60s"\n\n'
        + ENGINE
        + model_block("tiny", models["tiny"], ctx=1024)
        + model_block("other", models["other"], ctx=1024)
    )
    with Served(write_manifest(tmp_path, manifest), blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        stop, errors, answered = threading.Event(), [], []

        def keep_tiny_busy() -> None:
            while not stop.is_set():
                try:
                    oai.completions.create(model="tiny", prompt="a", max_tokens=400)
                    answered.append("tiny")
                except Exception as exc:  # asserted below: none
                    errors.append(exc)

        oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        # three clients: one answered, one queued, one sending: 'tiny' is never idle
        clients = [threading.Thread(target=keep_tiny_busy) for _ in range(3)]
        for each in clients:
            each.start()
        time.sleep(0.5)
        began = time.monotonic()
        raw = oai.completions.with_raw_response.create(model="other", prompt="a", max_tokens=2)
        took = time.monotonic() - began
        time.sleep(1.0)  # 'tiny' comes back once 'other' is idle
        stop.set()
        for each in clients:
            each.join(60)
        assert raw.http_response.status_code == 200 and took < 20, took
        assert errors == [] and answered.count("tiny") >= 2
        record = served.get(f"/api/why/{raw.headers['x-request-id']}?wait=10")
        assert record["waited_for_room"]["evicted"] == ["tiny"]
        assert record["waited_for_room"]["seconds"] >= 0.9  # the window, then its turn
