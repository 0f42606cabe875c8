"""What a trace keeps of a passed-through answer, and what it reads of it (issue 30).

A stream: its head until HEAD_BYTES (the excerpt), its last TAIL_BYTES (finish, usage,
timings), and of each piece between them only when it arrived and the events it ended
(`Trace.chunk`): the memory held is bounded, and the facts (tokens, finish, time to first
token, every gap) are those of reading all of it, wherever the bytes were cut, LF or CRLF,
with a tool call in the middle. A whole answer longer than WHOLE_BYTES: read at its two
ends (`outcome.from_ends`), the same record as parsing it whole but for the text, which is
its start. The reference reading is the trace's own with a JSON check asked for (it then
keeps and parses everything, up to KEEP_BYTES).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.observe import trace as trace_module
from blazar.observe.outcome import EXCERPT, from_ends, from_response
from blazar.observe.trace import HEAD_BYTES, PARTIAL_BYTES, TAIL_BYTES, WHOLE_BYTES, Trace

ENVELOPE = {
    "created": 1796042248,
    "id": "chatcmpl-HD1fyEPHhNm1kYnJCVKzeQ5iPCvOfCzL",
    "model": "tiny",
    "system_fingerprint": "b0-unknown",
    "object": "chat.completion.chunk",
}
WORDS = [" run", " snow", " case", ' "old"', " fire\n", " \\x", " été"]
TIMINGS = {"cache_n": 2, "prompt_n": 21, "prompt_ms": 3.5, "predicted_ms": 40.0}
PLAIN = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
JSON = {**PLAIN, "response_format": {"type": "json_object"}}  # read whole: the reference


def event(data: dict[str, Any]) -> bytes:
    """One event as llama-server writes it: compact JSON, its keys in its order."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


def token(text: str) -> dict[str, Any]:
    delta = {"content": text}
    return {"choices": [{"finish_reason": None, "index": 0, "delta": delta}], **ENVELOPE}


def tool_delta(arguments: str) -> dict[str, Any]:
    call = {"index": 0, "function": {"arguments": arguments}}
    delta = {"tool_calls": [call]}
    return {"choices": [{"finish_reason": None, "index": 0, "delta": delta}], **ENVELOPE}


def stream(
    texts: list[str], *, usage: bool = True, finish: str = "length", middle: tuple[Any, ...] = ()
) -> list[bytes]:
    """A chat stream as llama-server sends it, one event a piece: the role, the tokens
    (`middle`'s events halfway through), the finish, the usage chunk with its timings
    (unless not `usage`: then the trace counts the tokens itself), [DONE]."""
    role = {"role": "assistant", "content": None}
    events = [{"choices": [{"finish_reason": None, "index": 0, "delta": role}], **ENVELOPE}]
    tokens = [token(t) for t in texts]
    half = len(tokens) // 2
    events += tokens[:half] + list(middle) + tokens[half:]
    events.append({"choices": [{"finish_reason": finish, "index": 0, "delta": {}}], **ENVELOPE})
    if usage:
        n = len(texts)
        figures = {"completion_tokens": n, "prompt_tokens": 23, "total_tokens": 23 + n}
        timings = {**TIMINGS, "predicted_n": n, "predicted_per_second": 12.5}
        events.append({"choices": [], **ENVELOPE, "usage": figures, "timings": timings})
    return [event(e) for e in events] + [b"data: [DONE]\n\n"]


def texts(n: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(n)]


def read(pieces: list[bytes], body: dict[str, Any] = PLAIN) -> Trace:
    """A relayed stream's trace, each piece timed as it came (a fake clock: piece i at
    1000 * (i + 1) ns after the start), read."""
    trace = Trace("t", "openai", "/v1/chat/completions")
    trace.sending("/v1/chat/completions", body)
    started = trace.asked.started
    clock = iter(range(started + 1000, started + 1000 * (len(pieces) + 2), 1000))
    with mock.patch("time.perf_counter_ns", lambda: next(clock)):
        for piece in pieces:
            trace.chunk(piece)
    trace.record(scrub=False)
    return trace


FACTS = ("generated_tokens", "prompt_tokens", "cached_tokens", "finish_reason", "ttft_ms")


def same_facts(lean: Trace, whole: Trace, excerpt: int = EXCERPT - 10) -> None:
    """`excerpt`: the fewest characters the excerpt has (a small head holds fewer)."""
    a, b = lean.record(scrub=False), whole.record(scrub=False)
    for key in FACTS:
        assert a[key] == b[key], key
    assert lean.result.gaps == whole.result.gaps
    start, full = a["output"]["excerpt"], b["output"]["excerpt"]
    assert full.startswith(start) and len(start) >= min(len(full), excerpt)
    checks = [d.check for d in lean.result.detections or []]
    assert checks == [d.check for d in whole.result.detections or [] if d.check != "invalid_json"]


@contextmanager
def small(head: int, tail: int) -> Iterator[None]:
    """HEAD_BYTES and TAIL_BYTES made small: a short stream has a middle."""
    with (
        mock.patch.object(trace_module, "HEAD_BYTES", head),
        mock.patch.object(trace_module, "TAIL_BYTES", tail),
    ):
        yield


# -- a long stream -------------------------------------------------------------------------


def test_a_long_stream_holds_its_head_and_tail_only_and_reads_the_same_facts() -> None:
    pieces = stream(texts(20_000))
    assert sum(map(len, pieces)) > 4_000_000
    lean = read(pieces)
    held, size = lean.kept()
    biggest = max(map(len, pieces))
    # the head, the tail (up to twice TAIL_BYTES before it sheds its oldest pieces)
    assert size <= HEAD_BYTES + 2 * TAIL_BYTES + 2 * biggest
    assert held <= (HEAD_BYTES + 2 * TAIL_BYTES) // min(map(len, pieces)) + 2
    assert len(lean._counts) == len(pieces) - held  # every other piece: a count
    record = lean.record(scrub=False)
    assert (record["generated_tokens"], record["finish_reason"]) == (20_000, "length")
    assert record["prompt_tokens"] == 23 and record["cached_tokens"] == 2
    assert len(lean.result.gaps) == 19_999 and record["ttft_ms"] == 0.002  # the first token
    assert [d.check for d in lean.result.detections or []] == ["truncated"]
    assert lean.result.outcome is not None and lean.result.outcome.complete is False
    assert record["output"]["excerpt"].startswith(' run snow case "old" fire\n \\x été run')
    # The same tokens counted, not read, when the stream has no usage chunk.
    counted = read(stream(texts(20_000), usage=False)).record(scrub=False)
    assert counted["generated_tokens"] == 20_000


def test_the_facts_are_those_of_reading_it_all() -> None:
    pieces = stream(texts(3000))  # about 660 KiB: the whole reading keeps it all
    same_facts(read(pieces), read(pieces, JSON))


def test_a_tool_call_in_the_middle_is_no_empty_answer() -> None:
    """Blank text at both ends, a tool call only between them: not `empty`."""
    calls = [tool_delta('{"city":') for _ in range(3)]
    pieces = stream([" "] * 2000, middle=tuple(calls), finish="tool_calls")
    lean = read(pieces)
    assert lean.result.outcome is not None and lean.result.outcome.tool_calls >= 3
    assert "empty" not in [d.check for d in lean.result.detections or []]
    blank = read(stream([" "] * 2000, finish="stop"))  # and without one, it is
    assert [d.check for d in blank.result.detections or []] == ["empty"]


@pytest.mark.parametrize("how", ["cut every 50 bytes", "crlf", "three events a piece", "mixed"])
def test_any_framing_of_a_long_stream_reads_the_same(how: str) -> None:
    pieces = stream(texts(1200), usage=False)
    joined = b"".join(pieces)
    framed = {
        "cut every 50 bytes": [joined[i : i + 50] for i in range(0, len(joined), 50)],
        "crlf": [p.replace(b"\n", b"\r\n") for p in pieces],
        "three events a piece": [b"".join(pieces[i : i + 3]) for i in range(0, len(pieces), 3)],
        "mixed": [joined[i : i + 777].replace(b"\n", b"\r\n") for i in range(0, len(joined), 777)],
    }[how]
    with small(2048, 1024):
        lean = read(framed)
    # the head, the tail, and the start of an event cut where the tail begins
    assert lean.kept()[1] <= 2048 + 2 * 1024 + 2 * max(map(len, framed)) + PARTIAL_BYTES
    same_facts(lean, read(framed, JSON), excerpt=0)
    assert lean.record(scrub=False)["generated_tokens"] == 1200


EVENTS = st.one_of(
    st.sampled_from([*WORDS, "x"]).map(token),
    st.just(tool_delta("{}")),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(EVENTS, min_size=1, max_size=60),
    st.lists(st.integers(1, 400), max_size=40),
    st.booleans(),
    st.integers(0, 900),
    st.integers(1, 600),
)
def test_wherever_the_bytes_are_cut_the_counts_and_times_are_the_reading_of_all(
    events: list[dict[str, Any]], cuts: list[int], crlf: bool, head: int, tail: int
) -> None:
    """Hypothesis: any events, cut anywhere, LF or CRLF, head and tail of any size: the
    events that carried output, when each arrived, the tool calls and the finish are what
    reading every byte finds, when the tail holds the last events (TAIL_BYTES: the
    finish, the usage chunk, [DONE]). (An event of the middle is counted as a token, as llama-server
    sends them there: one with empty text, which it does not send, would count too.)"""
    body = b"".join(event(e) for e in events)
    final = {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], **ENVELOPE}
    body += event(final) + b"data: [DONE]\n\n"
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    bounds = sorted({0, *(c * 7 % len(body) for c in cuts), len(body)})
    pieces = [body[a:b] for a, b in pairwise(bounds)]
    tail += len(event(final)) + 20  # the tail holds the finish, as TAIL_BYTES does
    with small(head, tail):
        lean = read(pieces)
    whole = read(pieces, JSON)
    assert lean.result.first_ns == whole.result.first_ns
    assert lean.result.gaps == whole.result.gaps
    a, b = lean.result.outcome, whole.result.outcome
    assert a is not None and b is not None
    assert (a.generated_tokens, a.finish) == (b.generated_tokens, b.finish)
    assert bool(a.tool_calls) == bool(b.tool_calls)
    # The excerpt: the text's start, or with none there (no text before the middle) its end.
    assert (b.text or "").startswith(a.text or "") or (a.text or "") in (b.text or "")


# -- a whole answer ------------------------------------------------------------------------


def chat_answer(text: str, *, tool_calls: list[Any] | None = None) -> bytes:
    """A whole chat answer in llama-server's order: the finish before the message, then
    usage, id and timings last."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return orjson.dumps(
        {
            "choices": [{"finish_reason": "length", "index": 0, "message": message}],
            "created": 1796119882,
            "model": "tiny",
            "system_fingerprint": "b0-unknown",
            "object": "chat.completion",
            "usage": {
                "completion_tokens": 9000,
                "prompt_tokens": 23,
                "total_tokens": 9023,
                "prompt_tokens_details": {"cached_tokens": 22},
            },
            "id": "chatcmpl-ZYsDyPun2hgiobURQius6LJpfJgoH5oT",
            "timings": {**TIMINGS, "predicted_n": 9000, "predicted_per_second": 80.0},
        }
    )


def completion_answer(text: str) -> bytes:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
    return orjson.dumps(
        {
            "choices": [choice],
            "created": 1796119882,
            "model": "tiny",
            "system_fingerprint": "b0-unknown",
            "object": "text_completion",
            "usage": {"completion_tokens": 900, "prompt_tokens": 5, "total_tokens": 905},
            "id": "cmpl-1",
            "timings": {**TIMINGS, "predicted_n": 900, "predicted_per_second": 80.0},
        }
    )


def embeddings_answer(rows: int) -> bytes:
    vector = [0.0751563012599945, -0.09920784831047058] * 256
    return orjson.dumps(
        {
            "model": "tiny",
            "object": "list",
            "usage": {"prompt_tokens": 10 * rows, "total_tokens": 10 * rows},
            "data": [{"embedding": vector, "index": i, "object": "embedding"} for i in range(rows)],
        }
    )


LONG = "".join(texts(25_000))  # about 130 KiB of text, escapes and UTF-8 among it


def answered(path: str, payload: bytes, body: dict[str, Any] | None = None) -> Trace:
    trace = Trace("t", "openai", path)
    trace.sending(path, body or {**PLAIN, "stream": False})
    trace.answered(payload, 200)
    trace.record(scrub=False)
    return trace


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", chat_answer(LONG)),
        ("/v1/completions", completion_answer(LONG)),
        ("/v1/embeddings", embeddings_answer(60)),
    ],
)
def test_a_long_whole_answer_is_read_at_its_ends_with_the_fields_of_a_full_parse(
    path: str, payload: bytes
) -> None:
    assert len(payload) > 100 * 1024
    ends, full = from_ends(path, payload), from_response(path, orjson.loads(payload))
    assert ends is not None
    for name in ("finish", "prompt_tokens", "cached_tokens", "generated_tokens", "prompt_ms"):
        assert getattr(ends, name) == getattr(full, name), name
    assert ends.predicted_ms == full.predicted_ms
    assert ends.tokens_per_second == full.tokens_per_second
    if full.text is None:  # embeddings: usage only
        assert ends.text is None
    else:
        assert ends.text is not None and full.text.startswith(ends.text)
        assert len(ends.text) >= EXCERPT and ends.complete is False
    # And as the trace records it: the same fields, the text's start as the excerpt.
    lean = answered(path, payload).record(scrub=False)
    reference = answered(path, payload, {**JSON, "stream": False}).record(scrub=False)
    for key, value in reference.items():
        if key == "output":
            assert value is None or value["excerpt"] == lean["output"]["excerpt"]
        elif key not in ("sentinels", "time"):  # (the JSON check finds no JSON)
            assert lean[key] == value, key


def test_what_the_ends_do_not_hold_is_parsed_whole() -> None:
    long = chat_answer(LONG)
    # a small answer; a tool call with no text; two choices; a check of the whole text
    small_answer = chat_answer("short")
    assert len(small_answer) <= WHOLE_BYTES
    calls = [{"type": "function", "function": {"name": "f", "arguments": "x" * 20_000}}]
    no_text = chat_answer("", tool_calls=calls)
    assert from_ends("/v1/chat/completions", no_text) is None
    record = answered("/v1/chat/completions", no_text).record(scrub=False)
    assert record["sentinels"] == [] or "empty" not in str(record["sentinels"])
    outcome = answered("/v1/chat/completions", no_text).result.outcome
    assert outcome is not None and outcome.tool_calls == 1 and outcome.complete
    two = answered("/v1/chat/completions", long, {"model": "tiny", "n": 2}).result.outcome
    assert two is not None and two.text == LONG
    checked = answered("/v1/chat/completions", long, JSON).result.outcome
    assert checked is not None and checked.text == LONG and checked.complete
    short = answered("/v1/chat/completions", small_answer).result.outcome
    assert short is not None and short.text == "short" and short.complete
    # llama-server's native /completion: parsed whole, as before
    assert from_ends("/completion", orjson.dumps({"content": LONG})) is None
    # a text that ends inside the head: whole, so complete
    logprobs = orjson.loads(chat_answer("brief"))
    logprobs["choices"][0]["logprobs"] = {"content": [{"token": "x" * 50}] * 400}
    brief = from_ends("/v1/chat/completions", orjson.dumps(logprobs))
    assert brief is not None and brief.text == "brief" and brief.complete
