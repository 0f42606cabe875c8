"""Message batches, part by part: the shapes (pure), the slot decision (a table), and the
runner's bookkeeping (cancel, expiry, a restart) on the real store.

The runner's pipeline here is a stand-in whose model has the slots a case gives it and
whose `complete` answers when the test lets it: the served tests
(tests/test_batches_served.py) run the real one; this one makes expiry and the
interleavings deterministic.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from blazar.protocols import ProtocolError
from blazar.protocols import anthropic_batches as shapes
from blazar.serve.request.asks import Ask
from blazar.serve.request.batch_store import BatchStore
from blazar.serve.request.batches import MessageBatches, may_start
from blazar.store.db import Store
from tests.waiting import until

HI = [{"role": "user", "content": "hi"}]


def request(custom_id: str, **params: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "params": {"model": "m", "max_tokens": 4, "messages": HI, **params},
    }


@pytest.mark.parametrize(
    ("in_flight", "capacity", "queued", "ours", "limit", "starts"),
    [
        (0, 2, 0, 0, 1, True),  # idle
        (1, 2, 0, 0, 1, True),  # a client uses one slot, one is free
        (1, 2, 0, 1, 1, False),  # the batches' one is running: the limit
        (1, 2, 0, 1, 2, True),  # a higher limit takes the free slot
        (2, 2, 0, 0, 1, False),  # every slot busy
        (1, 2, 1, 0, 1, False),  # someone waits in the queue: they go first
    ],
)
def test_a_batch_request_starts_only_on_a_free_slot_nobody_waits_for(
    in_flight: int, capacity: int, queued: int, ours: int, limit: int, starts: bool
) -> None:
    assert (
        may_start(in_flight=in_flight, capacity=capacity, queued=queued, ours=ours, limit=limit)
        is starts
    )


def test_requests_are_checked_whole_and_named() -> None:
    ok = shapes.batch_requests({"requests": [request("a"), request("b-2_x")]})
    assert [r.custom_id for r in ok] == ["a", "b-2_x"] and ok[0].params["max_tokens"] == 4
    for body, says in (
        ({}, "requests: a non-empty list"),
        ({"requests": []}, "requests: a non-empty list"),
        ({"requests": [request("a")], "x": 1}, "x: Extra inputs are not permitted"),
        ({"requests": [request("a b")]}, "requests[0].custom_id: 1 to 64 letters"),
        ({"requests": [request("a"), request("a")]}, "requests[1] (custom_id 'a'): custom_id"),
        ({"requests": [{**request("a"), "y": 1}]}, "(custom_id 'a'): y: Extra inputs"),
        ({"requests": [{"custom_id": "a"}]}, "(custom_id 'a').params: a Messages API request"),
        ({"requests": [request("a", stream=True)]}, "params.stream: a batch's requests"),
        ({"requests": [request("a", max_tokens=None)]}, "(custom_id 'a').params.max_tokens"),
        ({"requests": [request("a", temperature=3)]}, "(custom_id 'a').params.temperature"),
    ):
        with pytest.raises(ProtocolError) as refused:
            shapes.batch_requests(body)
        assert refused.value.status == 400 and says in refused.value.message, refused.value


def test_pages_go_both_ways_and_objects_are_anthropic_s() -> None:
    ids = ["e", "d", "c", "b", "a"]  # newest first
    assert shapes.page(ids, 2, None, None) == (["e", "d"], True)
    assert shapes.page(ids, 2, None, "d") == (["c", "b"], True)
    assert shapes.page(ids, 2, None, "b") == (["a"], False)
    assert shapes.page(ids, 2, "c", None) == (["e", "d"], False)
    assert shapes.page(ids, 1, "c", None) == (["d"], True)
    assert shapes.page(ids, 9, None, "zz") == ([], False)
    for query, says in (
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"before_id": "a", "after_id": "b"}, "both"),
    ):
        with pytest.raises(ProtocolError, match=says):
            shapes.page_bounds(query)
    body = shapes.batch_object(
        "msgbatch_1",
        shapes.ENDED,
        ["succeeded", "errored", "queued"],
        created_at=0.0,
        expires_at=86400.0,
        ended_at=5.5,
        cancel_initiated_at=None,
        base_url="http://h:1",
    )
    assert body["request_counts"] == {
        "processing": 1,
        "succeeded": 1,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    assert body["created_at"] == "1970-01-01T00:00:00Z" and body["ended_at"].endswith("5.500000Z")
    assert body["results_url"] == "http://h:1/v1/messages/batches/msgbatch_1/results"
    assert shapes.errored(503, "busy", "all_slots_busy") == {
        "type": "errored",
        "error": {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
    }


@dataclass
class StandIn:
    """A pipeline whose one model has `capacity` slots; `complete` answers when `gate` is
    set, with the request's max_tokens, or raises what `fail` holds for it."""

    capacity: int = 1
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    seen: list[int] = field(default_factory=list)
    fail: dict[int, Exception] = field(default_factory=dict)

    def resolve(self, request: Any, model: str) -> Any:
        pool = SimpleNamespace(in_flight=self.in_flight, capacity=self.capacity, waiters=deque())
        return SimpleNamespace(pool=pool, runtime=SimpleNamespace(name=model))

    async def complete(self, ask: Ask, **_: Any) -> Any:
        tokens = ask.body["max_tokens"]
        self.in_flight += 1
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        self.seen.append(tokens)
        if tokens in self.fail:
            raise self.fail[tokens]
        return {"id": f"msg_{tokens}", "type": "message"}


def runner(tmp_path: Path, pipeline: StandIn, clock: list[float]) -> MessageBatches:
    Store(tmp_path / "blazar.db").close()  # migrated
    return MessageBatches(
        BatchStore(tmp_path / "blazar.db", tmp_path / "apply.lock"),
        pipeline,  # type: ignore[arg-type]
        lambda params: Ask(params["model"], "/v1/messages", params),
        in_flight=lambda: 1,
        expiry=lambda: 100.0,
        retention=lambda: 1000.0,
        clock=lambda: clock[0],
    )


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def lines(batches: MessageBatches, batch_id: str) -> dict[str, dict[str, Any]]:
    import json

    out = {}
    async for line in batches.results(batches.batches[batch_id]):
        row = json.loads(line)
        out[row["custom_id"]] = row["result"]
    return out


def test_cancel_expiry_failures_and_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        clock = [1000.0]
        pipeline = StandIn(fail={3: ProtocolError(400, "too long for the context")})
        batches = runner(tmp_path, pipeline, clock)
        await batches.start()
        asked = shapes.batch_requests(
            {"requests": [request(f"r{i}", max_tokens=i) for i in range(1, 5)]}
        )
        first = batches.submit(asked, key="k")
        await turns()
        assert pipeline.in_flight == 1  # one at a time on a model with one slot
        pipeline.gate.set()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if first.status == shapes.ENDED:
                break
        assert first.status == shapes.ENDED and pipeline.seen == [1, 2, 3, 4]
        results = await lines(batches, first.id)
        assert results["r1"] == {"type": "succeeded", "message": {"id": "msg_1", "type": "message"}}
        refused = {"type": "invalid_request_error", "message": "too long for the context"}
        assert results["r3"]["error"]["error"] == refused
        assert batches.visible("other", keyed=True) == []

        pipeline.gate.clear()
        second = batches.submit(asked, key="k")
        third = batches.submit(asked, key="k")
        await turns()
        batches.cancel(second.id)
        assert second.status == shapes.CANCELING  # its first request still runs
        clock[0] += 101  # past expiry: third's queued requests expire
        batches.wake()  # the dispatcher's pass, now, not at its next poll (a second away)

        def expired() -> bool:
            return [i.state for i in third.items] == ["expired"] * 4

        await until(expired, "the expiry, a few turns after the wake", turns=50)
        pipeline.gate.set()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if second.status == third.status == shapes.ENDED:
                break
        assert [i.state for i in second.items] == ["succeeded", *["canceled"] * 3]
        assert [i.state for i in third.items] == ["expired"] * 4
        with pytest.raises(ProtocolError, match="cancel it"):
            fourth = batches.submit(asked, key=None)
            batches.delete(fourth.id)
        await batches.close()  # fourth stays queued, in the store

        pipeline.gate.set()
        again = runner(tmp_path, pipeline, clock)
        await again.start()
        assert set(again.batches) == {first.id, second.id, third.id, fourth.id}
        assert (await lines(again, first.id))["r1"]["message"]["id"] == "msg_1"
        for _ in range(200):
            await asyncio.sleep(0.01)
            if again.batches[fourth.id].status == shapes.ENDED:
                break
        assert again.batches[fourth.id].status == shapes.ENDED
        clock[0] += 2000
        assert sorted(again.prune()) == sorted([first.id, second.id, third.id, fourth.id])
        await again.close()
        assert runner(tmp_path, pipeline, clock).store.load().batches == []

    asyncio.run(main())
