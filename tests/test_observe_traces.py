"""The pure parts of observability, second half: cache-bust detection, metrics relabelling,
rejection reasons, the trace record and its routing trail, and traces in the real store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from blazar.observe import cachebust, trail
from blazar.observe import trace_store as trace_store
from blazar.observe.metrics import rejection, relabel
from blazar.observe.trace import Trace
from blazar.store.db import Store
from tests.test_observe import CHAT

# -- cache-bust detection -------------------------------------------------------------------


def chat(system: str | None, *turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system is not None else []
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"messages": messages}


@pytest.mark.parametrize(
    ("before", "after", "tokens", "busts"),
    [
        (chat("It is 10:01", "hi"), chat("It is 10:02", "hi", "hello", "more"), (300, 10), True),
        (chat("It is 10:01", "hi"), chat("It is 10:02", "hi", "hello", "more"), (None, None), True),
        # the cache held up anyway (a long system prompt changed only at its end)
        (chat("It is 10:01", "hi"), chat("It is 10:02", "hi", "hello", "more"), (300, 250), False),
        (chat("stable", "hi"), chat("stable", "hi", "hello", "more"), (300, 10), False),
        (chat("It is 10:01", "hi"), chat("It is 10:02", "another conversation"), (300, 10), False),
        (chat(None, "hi"), chat(None, "hi", "hello", "more"), (300, 10), False),
        (
            {"system": "t=1", "messages": [{"role": "user", "content": "q"}]},
            {
                "system": "t=2",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ],
            },
            (100, 0),
            True,
        ),  # Anthropic's top-level system
        (
            {"instructions": "t=1", "input": [{"role": "user", "content": "q"}]},
            {"instructions": "t=2", "input": [{"role": "user", "content": "q"}]},
            (100, 0),
            True,
        ),
    ],
)
def test_cache_bust_detection(
    before: dict[str, Any], after: dict[str, Any], tokens: tuple[Any, Any], busts: bool
) -> None:
    previous, current = cachebust.turn(before), cachebust.turn(after)
    assert previous is not None and current is not None
    assert cachebust.busts(previous, current, *tokens) is busts


def test_a_bare_prompt_has_no_conversation() -> None:
    assert cachebust.turn({"prompt": "the quick"}) is None


def test_the_tracker_follows_each_client_and_model_on_its_own() -> None:
    tracker = cachebust.Tracker(max_clients=2)
    first = cachebust.turn(chat("t=1", "hi"))
    second = cachebust.turn(chat("t=2", "hi", "a", "b"))
    assert first is not None and second is not None
    assert not tracker.observe("ci", "m", first, 100, 0, 1.0)
    assert not tracker.observe("other", "m", second, 100, 0, 2.0)  # another client: no bust
    assert tracker.observe("ci", "m", second, 100, 0, 3.0)
    assert [(b.client, b.model, b.count) for b in tracker.busters()] == [("ci", "m", 1)]


# -- metrics --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (503, "all_slots_busy", "busy"),
        (503, "max_loaded_models", "busy"),
        (401, "invalid_api_key", "auth"),
        (403, None, "auth"),
        (429, "rate_limited", "rate"),
        (400, "context_length_exceeded", "preflight"),
        (404, "model_not_found", None),
        (200, None, None),
    ],
)
def test_rejection_reasons(status: int, code: str | None, reason: str | None) -> None:
    assert rejection(status, code) == reason


LLAMA_METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 42
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def test_children_metrics_are_relabelled_per_model_and_replica() -> None:
    families = {
        f.name: f
        for f in relabel([("a", 0, LLAMA_METRICS), ("b", 1, LLAMA_METRICS), ("c", 0, "garbage{")])
    }
    samples = {
        (s.name, s.labels["model"], s.labels["replica"]): s.value
        for s in families["llamacpp:prompt_tokens"].samples
    }
    assert samples == {
        ("llamacpp:prompt_tokens_total", "a", "0"): 42.0,
        ("llamacpp:prompt_tokens_total", "b", "1"): 42.0,
    }
    assert families["llamacpp:requests_processing"].type == "gauge"


# -- the trace and its trail ----------------------------------------------------------------


def test_pii_scrub_keeps_lengths_and_hashes_only() -> None:
    trace = Trace("t1", "openai", "/v1/chat/completions")
    trace.ended(200)
    body = chat("secret system", "my secret question")
    trace.sending("/v1/chat/completions", body)
    trace.answered(json.dumps(CHAT).encode(), 200)
    scrubbed = trace.record(scrub=True)
    kept = Trace.record(trace, scrub=False)
    assert "secret" not in json.dumps(scrubbed)
    assert scrubbed["prompt"]["chars"] == len("secret system\nmy secret question")
    assert scrubbed["prompt"]["hash"] == kept["prompt"]["hash"]
    assert kept["prompt"]["excerpt"].startswith("secret system")
    assert scrubbed["output"] == {"chars": 2, "hash": kept["output"]["hash"]}


def test_an_engine_error_is_no_answer_to_check() -> None:
    trace = Trace("t2", "openai", "/v1/chat/completions")
    trace.sending("/v1/chat/completions", {"response_format": {"type": "json_object"}})
    trace.answered(b'{"error": {"message": "Failed to initialize samplers"}}', 400)
    trace.ended(400)
    record = trace.record(scrub=False)
    assert record["sentinels"] == [] and record["error"] == "Failed to initialize samplers"


RECORD = {
    "id": "abc",
    "time": 1_796_000_000.0,
    "protocol": "openai",
    "route": "/v1/chat/completions",
    "stream": True,
    "client": "127.0.0.1",
    "key": "ci",
    "requested": "mini",
    "model": "tiny",
    "adapter": None,
    "alias": "mini",
    "instance": "tiny/1",
    "replica": 1,
    "engine": "b1-cpu",
    "decision": "least_loaded",
    "evicted": ["other"],
    "in_flight": 0,
    "replicas": 2,
    "queue_ms": 0.1,
    "load_ms": 0.0,
    "ttft_ms": 12.5,
    "duration_ms": 1500.0,
    "prompt_tokens": 40,
    "cached_tokens": 30,
    "generated_tokens": 8,
    "tokens_per_second": 55.5,
    "finish_reason": "length",
    "status": 200,
    "error": None,
    "code": None,
    "rejected": None,
    "sentinels": [{"check": "truncated", "detail": "stopped at the limit"}],
    "cache": {"finding": "cache_bust_system", "detail": "it changed", "fix": "keep it stable"},
    "prompt": None,
    "output": None,
}


def test_the_trail_reads_step_by_step() -> None:
    lines = trail.render(RECORD)
    text = "\n".join(lines)
    assert lines[0].startswith("trace abc  2026-") and "(key ci)" in lines[0]
    assert "asked for 'mini' -> model tiny (alias 'mini')" in text
    assert "routed to tiny/1 (engine b1-cpu): the least loaded of 2 replicas" in text
    assert "evicted other" in text
    assert "prompt 40 tokens, 30 cached (75% reused)" in text
    assert "first token after 12.5 ms, 8 tokens at 55.5 tokens/s, finish length" in text
    assert "status 200 in 1.50 s" in text
    assert "! sentinel truncated: stopped at the limit" in text
    assert "! cache_bust_system: it changed" in text and "fix: keep it stable" in text
    assert [line.split(".")[0].strip() for line in lines[1:8]] == [str(i) for i in range(1, 8)]
    assert "tiny" in trail.summary(RECORD) and "truncated" in trail.summary(RECORD)


# -- traces in the store --------------------------------------------------------------------


def test_traces_are_kept_found_and_pruned_by_age_and_count(tmp_path: Path) -> None:
    now = time.time()
    with Store(tmp_path / "blazar.db") as store:
        old = [{**RECORD, "id": f"old{i}", "time": now - 3600} for i in range(3)]
        new = [
            {**RECORD, "id": f"new{i}", "time": now, "model": "m" if i % 2 else "n"}
            for i in range(6)
        ]
        trace_store.write(store, old)
        trace_store.write(store, new)
        assert trace_store.count(store) == 9
        assert trace_store.find(store, "old1") == old[1]
        assert [r["id"] for r in trace_store.recent(store, model="m", limit=2)] == ["new5", "new3"]
        assert trace_store.prune(store, max_age=600, count=100, now=now) == 3
        assert trace_store.find(store, "old1") is None
        assert trace_store.prune(store, max_age=-1, count=4, now=now) == 2
        assert [r["id"] for r in trace_store.recent(store, limit=10)] == [
            f"new{i}" for i in (5, 4, 3, 2)
        ]


def test_a_repeated_request_id_finds_the_newest(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        trace_store.write(store, [{**RECORD, "status": 200}, {**RECORD, "status": 503}])
        found = trace_store.find(store, "abc")
        assert found is not None and found["status"] == 503


def test_a_passed_through_stream_is_read_wherever_its_bytes_were_cut() -> None:
    """The trace splits the bytes it kept into events itself: the same outcome whether
    the engine's writes arrived one event a chunk, cut mid-line, with CRLF, comments,
    several data lines or a last event without its blank line."""
    chunk = {"choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}
    last = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    events = [f"data: {json.dumps(chunk)}\n\n".encode()] * 3 + [
        b": keep-alive\n\n",
        f"data: {json.dumps(last)}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]
    whole = b"".join(events)
    multi_line = (
        b'event: x\ndata: {"choices": [{"index": 0,\ndata: "delta": {"content": " word"}}]}\n\n'
    )
    cuts = {
        "one event a chunk": events,
        "cut anywhere": [whole[i : i + 7] for i in range(0, len(whole), 7)],
        "crlf": [whole.replace(b"\n", b"\r\n")],
        "no final blank line": [whole.removesuffix(b"\n\n")],
    }
    for how, chunks in cuts.items():
        trace = Trace("t", "openai", "/v1/chat/completions")
        trace.sending("/v1/chat/completions", {"model": "m", "stream": True})
        for piece in chunks:
            trace.chunk(piece)
        record = trace.record(scrub=False)
        assert (record["generated_tokens"], record["finish_reason"]) == (3, "length"), how
        assert record["output"]["excerpt"] == " word word word", (how, record["output"])
    trace = Trace("t", "openai", "/v1/chat/completions")
    trace.sending("/v1/chat/completions", {"model": "m", "stream": True})
    trace.chunk(multi_line)
    assert trace.record(scrub=False)["output"]["excerpt"] == " word"
