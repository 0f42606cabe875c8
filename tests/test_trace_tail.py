"""`trace.tail_object`: the speculative header's timings read from a whole answer's end,
without parsing its text (issue 30, step 3)."""

from __future__ import annotations

import orjson

from blazar.observe.speculation import spec_header
from blazar.observe.trace import tail_object

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
