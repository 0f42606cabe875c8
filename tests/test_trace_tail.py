"""`trace.tail_object`: the speculative header's timings read from a whole answer's end,
without parsing its text (issue 30, step 3)."""

from __future__ import annotations

import orjson

from blazar.observe.speculation import spec_header
from blazar.observe.trace import Trace, tail_object

TIMINGS = {"prompt_n": 4, "predicted_n": 40, "draft_n": 32, "draft_n_accepted": 20}


def answer(text: str, **extra: object) -> bytes:
    """A whole chat answer as llama-server writes it (keys sorted: timings before usage)."""
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "model": "m",
        "timings": TIMINGS,
        "usage": {"completion_tokens": 40, "prompt_tokens": 4, "total_tokens": 44},
        **extra,
    }
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def test_the_timings_come_from_the_end_of_a_long_answer() -> None:
    long = answer('x "timings": {"draft_n": 1} ' * 20_000)  # the text quotes the key
    assert len(long) > 500_000
    assert tail_object(long, "timings") == TIMINGS
    assert spec_header("ngram", tail_object(long, "timings")) == spec_header("ngram", TIMINGS)


def test_no_timings_or_nothing_that_parses_is_none() -> None:
    assert tail_object(orjson.dumps({"choices": []}), "timings") is None
    assert tail_object(b'{"timings": 3}', "timings") is None
    assert tail_object(b'{"timings": {"a": 1', "timings") is None
    assert tail_object(b"", "timings") is None
    nested = b'{"timings": {"a": {"b": 2}, "c": 3}}'
    assert tail_object(nested, "timings") == {"a": {"b": 2}, "c": 3}
    # The key past the window: not looked for (its mode alone goes in the header).
    far = orjson.dumps({"timings": TIMINGS, "z": "y" * 10_000}, option=orjson.OPT_SORT_KEYS)
    assert tail_object(far, "timings") is None and spec_header("ngram", None) == "ngram"


def stream(tokens: int, *, role: bool = True) -> list[bytes]:
    """A chat stream as llama-server sends it: one event a chunk, the finish, timings and
    usage at the end, then [DONE]."""
    first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}
    token = {"choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}
    final = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
        "timings": {**TIMINGS, "predicted_n": tokens, "predicted_per_second": 123.0},
    }
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": tokens}}
    events = ([first] if role else []) + [token] * tokens + [final, usage]
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def read(chunks: list[bytes], body: dict[str, object]) -> Trace:
    trace = Trace("t", "openai", "/v1/chat/completions")
    trace.sending("/v1/chat/completions", body)
    for piece in chunks:
        trace.chunk(piece)
    return trace


def test_a_long_stream_is_read_at_its_head_and_tail_with_the_same_facts() -> None:
    """The middle of a long pass-through stream is not parsed (counted, and timed, as its
    tokens); what the trace says is what reading all of it says."""
    chunks = stream(600)
    plain = {"model": "m", "stream": True}
    lean = read(chunks, plain)
    whole = read(chunks, {**plain, "response_format": {"type": "json_object"}})  # all read
    a, b = lean.record(scrub=False), whole.record(scrub=False)
    for key in ("generated_tokens", "prompt_tokens", "finish_reason", "tokens_per_second"):
        assert a[key] == b[key], key
    assert a["generated_tokens"] == 600 and a["finish_reason"] == "length"
    assert a["output"]["excerpt"] == b["output"]["excerpt"][: len(a["output"]["excerpt"])]
    assert len(a["output"]["excerpt"]) >= 195
    for trace in (lean, whole):  # the first token: the second chunk (the first says the role)
        times = trace._times
        assert trace.result.first_ns == times[1] - trace.asked.started
        assert trace.result.gaps == [times[i + 1] - times[i] for i in range(1, 600)]
    assert lean.result.outcome is not None and lean.result.outcome.complete is False
    # The sentinels that read the finish reason still do (the `length` finish).
    assert [d.check for d in lean.result.detections or []] == ["truncated"]


def test_what_is_not_plainly_one_event_a_chunk_is_read_whole() -> None:
    chunks = stream(600)
    joined = b"".join(chunks)
    cut = [joined[i : i + 50] for i in range(0, len(joined), 50)]
    for pieces in (cut, [c.replace(b"\n", b"\r\n") for c in chunks]):
        record = read(pieces, {"model": "m", "stream": True}).record(scrub=False)
        assert (record["generated_tokens"], record["finish_reason"]) == (600, "length")
    short = read(stream(3), {"model": "m", "stream": True}).record(scrub=False)
    assert short["output"]["excerpt"] == " word word word" and short["generated_tokens"] == 3
