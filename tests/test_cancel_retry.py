"""Cheap retries after a cancel: the prefix a cancelled prefill computed is reused.

The decisions by table (`scheduler.affinity`: prefix keys, the replica remembered, its
expiry; the scheduler taking the preference only when that replica has a free slot),
then the behaviour with a real child: two replicas of a tiny model, a long prompt sent
to replica 1 and abandoned by its client in the middle of its prefill, then the same
prompt retried without naming a replica. Least-in-flight routing alone sends the retry
to replica 0 (both idle: the first wins), whose cache is empty; prefix affinity sends it
back to replica 1, and the engine reports the prompt's tokens as cached: the prefix its
cancelled prefill had decoded, whole batches of `--batch-size` (256 here: one run
measured 4,608 of 6,001 tokens cached), or all of it when the cancel came too late.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import openai
import pytest

from blazar.serve.supervisor.scheduler import PrefixAffinity, Scheduler, SlotBook, prefix_keys
from blazar.serve.supervisor.scheduler.affinity import pick_slot
from blazar.testing.tiny import TINY_WORDS, write_tiny_model
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.gateway_harness import StandIn, runtime
from tests.serving import Served, engine_metric, processing, tokens_in_progress

# -- the decisions ------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " * 80  # 2,320 bytes: two whole blocks


@pytest.mark.parametrize(
    ("text", "count"),
    [(None, 0), ("", 0), ("short", 0), ("x" * 1023, 0), ("x" * 1024, 1), ("x" * 5000, 4)],
)
def test_a_prompt_has_one_key_per_whole_block(text: str | None, count: int) -> None:
    assert len(prefix_keys("m", text)) == count


def test_keys_are_shared_by_a_common_prefix_and_differ_by_model_and_text() -> None:
    one = prefix_keys("m", SYSTEM + "what is the capital of France?" * 40)
    two = prefix_keys("m", SYSTEM + "tell me a story about a fox." * 40)
    assert one[:2] == two[:2] and one[2] != two[2]  # the system prompt's blocks, then not
    assert set(prefix_keys("other", SYSTEM)).isdisjoint(one)  # another model's cache
    assert prefix_keys("m", "é" * 600) == prefix_keys("m", "é" * 600)  # bytes, not chars
    assert len(prefix_keys("m", "x" * 10 * 1024, limit=3)) == 3


def test_the_longest_prefix_seen_within_the_window_decides() -> None:
    table = PrefixAffinity(window=60)
    shared = prefix_keys("m", SYSTEM)
    long = prefix_keys("m", SYSTEM + "a question about rivers " * 100)
    assert table.choose(long, now=0) is None  # nothing seen yet
    table.remember(shared, replica=0, now=0)
    table.remember(long, replica=1, now=10)
    assert table.choose(long, now=20) == 1  # its whole prefix is on replica 1
    assert table.choose(shared, now=20) == 1  # replica 1 saw the shared part last
    other = prefix_keys("m", SYSTEM + "another question entirely " * 100)
    assert table.choose(other, now=20) == 1  # the shared blocks lead to replica 1 too
    assert table.choose(long, now=70) == 1  # 60 s after it was seen: still
    assert table.choose(long, now=70.5) is None  # then forgotten
    table.remember(shared, replica=0, now=71)
    assert table.choose(long, now=72) == 0  # the longer keys expired; the shared did not


def test_the_table_forgets_the_least_recently_seen_keys_first() -> None:
    table = PrefixAffinity(capacity=3)
    a, b = prefix_keys("m", "a" * 2048), prefix_keys("m", "b" * 2048)
    table.remember(a, 0, now=0)
    table.remember(b, 1, now=1)  # four keys: a's first one goes
    assert len(table) == 3
    assert table.choose(a[:1], now=2) is None and table.choose(a, now=2) == 0
    assert table.choose(b, now=2) == 1


def test_the_table_remembers_the_slot_with_the_replica() -> None:
    table = PrefixAffinity()
    keys = prefix_keys("m", SYSTEM)
    table.remember(keys, replica=1, now=0, slot=3)
    seen = table.seen(keys, now=1)
    assert seen is not None and (seen.replica, seen.slot) == (1, 3)
    table.remember(keys, replica=0, now=2)  # the engine's choice: no slot known
    seen = table.seen(keys, now=3)
    assert seen is not None and (seen.replica, seen.slot) == (0, None)


@pytest.mark.parametrize(
    ("slots", "held", "wanted", "used", "slot"),
    [
        (2, set(), 1, {}, 1),  # the prefix's slot, free
        (2, {1}, 1, {}, 0),  # held by another lease: the other one
        (2, {0, 1}, 1, {}, None),  # every slot held (the scheduler counts slots: rare)
        (3, set(), None, {0: 5.0, 1: 1.0, 2: 3.0}, 1),  # no prefix: used longest ago
        (3, set(), None, {0: 5.0, 2: 3.0}, 1),  # never used first
        (3, {1}, None, {0: 5.0, 2: 3.0}, 2),
        (2, set(), 7, {}, 0),  # a slot the instance no longer has
        (1, set(), None, {}, 0),
    ],
)
def test_pick_slot(
    slots: int, held: set[int], wanted: int | None, used: dict[int, float], slot: int | None
) -> None:
    assert pick_slot(slots, held, wanted, used) == slot


def test_a_slot_book_holds_what_it_gave_until_given_back() -> None:
    book = SlotBook()
    assert book.take(2, None, now=1) == 0
    assert book.take(2, None, now=2) == 1
    assert book.take(2, 0, now=3) is None  # both held
    book.held.discard(0)
    assert book.take(2, 0, now=4) == 0 and book.used == {0: 4, 1: 2}


def test_the_scheduler_takes_the_preferred_replica_only_when_it_has_a_free_slot() -> None:
    async def scenario() -> None:
        s = Scheduler(
            {"m": runtime("m", replicas=2)},
            max_loaded=2,
            max_queue=8,
            queue_timeout=5.0,
            log_dir=Path("/tmp"),
            make_instance=StandIn,
        )
        for name in ("m#0", "m#1"):  # both replicas started: no decision reads "spawned"
            s.release(await s.acquire(s.resolve(name)))
        pool = s.pools["m"]
        plain = await s.acquire(s.resolve("m"))
        assert plain.member is pool.members[0] and plain.decision.how == "least_loaded"
        s.release(plain)
        back = await s.acquire(s.resolve("m"), prefer=1)  # both idle: the preferred one
        assert back.member is pool.members[1] and back.decision.how == "affinity"
        busy = await s.acquire(s.resolve("m"), prefer=1)  # replica 1's slot is taken
        assert busy.member is pool.members[0] and busy.decision.how == "least_loaded"
        s.release(busy)
        addressed = await asyncio.wait_for(s.acquire(s.resolve("m#0"), prefer=1), 1)
        assert addressed.member is pool.members[0]  # a named replica wins over affinity
        s.release(addressed)
        gone = await s.acquire(s.resolve("m"), prefer=7)  # a replica the pool no longer has
        assert gone.member is pool.members[0]
        s.release(gone)
        s.release(back)
        await s.close()

    asyncio.run(scenario())


# -- with a real child ----------------------------------------------------------------------

WORDS = 6000  # about one token each: a prefill of 2 s or more here (attention is quadratic)


def send_and_hang_up(port: int, body: dict[str, object], child: int) -> float:
    """POST `body` to the gateway, wait until the child on port `child` is in the middle
    of its prefill, and close the connection; the time the client left."""
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + data)
        deadline = time.monotonic() + 30
        while not processing(child):
            assert time.monotonic() < deadline, "the child never started the request"
            time.sleep(0.01)
        time.sleep(0.2)
        # Still prefilling: no token yet. (A prefill this short on a faster machine
        # would fail here rather than pass without testing anything.)
        assert processing(child) and tokens_in_progress(child) == 0
        left = time.monotonic()
    return left


def test_a_retry_after_a_cancelled_prefill_goes_back_to_its_replica_and_is_cached(
    tmp_path: Path, blazar_home: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=8192)
    block = model_block("tiny", model, ctx=8192, replicas=2, args=["--batch-size", "256"])
    manifest = write_manifest(tmp_path, ENGINE + block)
    prompt = " ".join(TINY_WORDS[(i * 7) % 60] for i in range(WORDS))
    with Served(manifest, blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 30
        while len([r for r in served.ps() if r["state"] == "ready"]) < 2:
            assert time.monotonic() < deadline, served.ps()
            time.sleep(0.05)
        ports = {r["replica"]: r["port"] for r in served.ps()}
        body = {"model": "tiny#1", "prompt": prompt, "max_tokens": 8, "stream": True}
        send_and_hang_up(served.port, body, ports[1])

        retry = oai.completions.create(model="tiny", prompt=prompt, max_tokens=1)
        assert retry.usage is not None and retry.usage.prompt_tokens_details is not None
        cached = retry.usage.prompt_tokens_details.cached_tokens or 0
        # The prefix is on replica 1 only: cached tokens mean the retry went there.
        assert cached > 0, retry.usage
        assert engine_metric(ports[0], "prompt_tokens_total") == 0  # replica 0 never saw it
        # The request's trace says why (`blazar why`): written a moment after the answer.
        deadline = time.monotonic() + 10
        while '"affinity"' not in json.dumps(served.get("/api/why?limit=1")):
            assert time.monotonic() < deadline, served.get("/api/why?limit=1")
            time.sleep(0.05)


def test_with_two_slots_the_retry_goes_back_to_the_cancelled_slot(
    tmp_path: Path, blazar_home: Path
) -> None:
    """One instance of two slots: the retry arrives while the cancelled prefill may
    still run on its slot. Left to the engine it would get the other, idle slot and a
    cold prefill (measured: 1 to 3 of 6,004 tokens cached); the gateway sends it to the
    slot that holds the prefix (`id_slot`), where it waits for the cancel to land."""
    model = write_tiny_model(tmp_path / "tiny.gguf", n_ctx_train=8192)
    block = model_block("tiny", model, ctx=16384, slots=2, args=["--batch-size", "256"])
    manifest = write_manifest(tmp_path, ENGINE + block)
    prompt = " ".join(TINY_WORDS[(i * 7) % 60] for i in range(WORDS))
    with Served(manifest, blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        oai.completions.create(model="tiny", prompt="hello", max_tokens=1)  # loaded
        [row] = served.ps()
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "stream": True}
        send_and_hang_up(served.port, body, row["port"])
        retry = oai.completions.create(model="tiny", prompt=prompt, max_tokens=1)
        assert retry.usage is not None and retry.usage.prompt_tokens_details is not None
        assert (retry.usage.prompt_tokens_details.cached_tokens or 0) > 0, retry.usage
