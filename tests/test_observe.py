"""The pure parts of observability, first half: what an engine answered (whole and
streamed, each endpoint's shape) and the sentinels' checks. Tables of cases."""

from __future__ import annotations

from typing import Any

import pytest

from blazar.observe import sentinels
from blazar.observe.outcome import Outcome, StreamOutcome, from_response

# -- what the engine answered ---------------------------------------------------------------

CHAT = {
    "choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "hi"}}],
    "usage": {
        "prompt_tokens": 26,
        "completion_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 20},
    },
    "timings": {
        "cache_n": 20,
        "prompt_n": 6,
        "prompt_ms": 1.5,
        "predicted_n": 8,
        "predicted_ms": 4.0,
        "predicted_per_second": 2000.0,
    },
}


@pytest.mark.parametrize(
    ("path", "payload", "expected"),
    [
        (
            "/v1/chat/completions",
            CHAT,
            dict(
                text="hi",
                finish="length",
                prompt_tokens=26,
                cached_tokens=20,
                generated_tokens=8,
                tokens_per_second=2000.0,
            ),
        ),
        (
            "/v1/completions",
            {
                "choices": [{"text": "abc", "finish_reason": "stop"}],
                "timings": {"cache_n": 2, "prompt_n": 4, "predicted_n": 3},
            },
            dict(text="abc", finish="stop", prompt_tokens=6, cached_tokens=2, generated_tokens=3),
        ),
        (
            "/v1/chat/completions",
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {"content": None, "tool_calls": [{"id": "a"}]},
                    }
                ]
            },
            dict(text="", tool_calls=1, finish="tool_calls"),
        ),
        # Anthropic: input_tokens leaves out what the cache read back.
        (
            "/v1/messages",
            {
                "content": [{"type": "text", "text": "yo"}, {"type": "tool_use"}],
                "stop_reason": "max_tokens",
                "usage": {"input_tokens": 1, "cache_read_input_tokens": 30, "output_tokens": 5},
            },
            dict(
                text="yo",
                tool_calls=1,
                finish="max_tokens",
                prompt_tokens=31,
                cached_tokens=30,
                generated_tokens=5,
            ),
        ),
        ("/v1/messages/count_tokens", {"input_tokens": 12}, dict(text=None, prompt_tokens=12)),
        (
            "/completion",
            {
                "content": "raw",
                "stop_type": "limit",
                "tokens_evaluated": 9,
                "tokens_cached": 11,  # the slot's whole cache, generated tokens too: not read
                "tokens_predicted": 3,
                "timings": {"prompt_n": 5, "cache_n": 4, "predicted_n": 3},
            },
            dict(text="raw", finish="limit", prompt_tokens=9, cached_tokens=4, generated_tokens=3),
        ),
        (
            "/v1/embeddings",
            {"data": [], "usage": {"prompt_tokens": 5}},
            dict(text=None, prompt_tokens=5),
        ),
        (
            "/v1/responses",
            {
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "r"}]}],
                "usage": {
                    "input_tokens": 7,
                    "output_tokens": 2,
                    "input_tokens_details": {"cached_tokens": 3},
                },
            },
            dict(
                text="r",
                finish="max_output_tokens",
                prompt_tokens=7,
                cached_tokens=3,
                generated_tokens=2,
            ),
        ),
        ("/v1/chat/completions", "not json", dict(text=None)),
    ],
)
def test_whole_answers_are_read_in_one_meaning(
    path: str, payload: Any, expected: dict[str, Any]
) -> None:
    out = from_response(path, payload)
    for key, value in expected.items():
        assert getattr(out, key) == value, key


def sse_events(path: str) -> list[Any]:
    if path == "/v1/messages":
        return [
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 2, "cache_read_input_tokens": 10}},
            },
            {"type": "content_block_start", "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a"}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2},
            },
        ]
    if path == "/completion":
        return [
            {"content": "x", "stop": False},
            {"content": "y", "stop": False},
            {
                "content": "",
                "stop": True,
                "stop_type": "limit",
                "tokens_evaluated": 5,
                "tokens_cached": 6,  # the slot's whole cache, generated tokens too: not read
                "tokens_predicted": 2,
                "timings": {"prompt_n": 4, "cache_n": 1, "predicted_n": 2},
            },
        ]
    return [
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [{"delta": {"content": "b"}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 10},
            },
        },
        "[DONE]",
    ]


@pytest.mark.parametrize(
    ("path", "finish"),
    [("/v1/chat/completions", "stop"), ("/v1/messages", "end_turn"), ("/completion", "limit")],
)
def test_streams_are_read_event_by_event(path: str, finish: str) -> None:
    reader = StreamOutcome(path, keep_text=True)
    carried = [reader.feed(event) for event in sse_events(path)]
    out = reader.result()
    assert out.text in ("ab", "xy")
    assert out.finish == finish
    assert sum(carried) == 2  # the two events with text; the role delta carries none
    assert out.generated_tokens == 2
    assert out.prompt_tokens in (12, 5) and out.cached_tokens in (10, 1)


def test_a_long_stream_keeps_only_an_excerpt_unless_json_was_asked() -> None:
    reader = StreamOutcome("/v1/completions", keep_text=False)
    for _ in range(500):
        reader.feed({"choices": [{"text": "word "}]})
    out = reader.result()
    assert 200 <= len(out.text or "") < 300 and not out.complete
    assert out.generated_tokens == 500


# -- sentinels ------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, sentinels.Expectation()),
        ({"ignore_eos": True}, sentinels.Expectation(ends=False)),
        ({"response_format": {"type": "json_object"}}, sentinels.Expectation(json=True)),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            sentinels.Expectation(True, SCHEMA),
        ),
        (
            {"response_format": {"type": "json_object", "schema": SCHEMA}},
            sentinels.Expectation(True, SCHEMA),
        ),
        ({"json_schema": SCHEMA}, sentinels.Expectation(True, SCHEMA)),  # llama-server's own field
        ({"response_format": {"type": "text"}}, sentinels.Expectation()),
    ],
)
def test_what_a_request_expects(body: dict[str, Any], expected: sentinels.Expectation) -> None:
    assert sentinels.expectation(body) == expected


JSON = sentinels.Expectation(json=True)
SCHEMA_WANTED = sentinels.Expectation(True, SCHEMA)


@pytest.mark.parametrize(
    ("expect", "outcome", "checks"),
    [
        (sentinels.NOTHING, Outcome(text="fine", finish="stop"), []),
        (sentinels.NOTHING, Outcome(text="  \n", finish="stop"), ["empty"]),
        (sentinels.NOTHING, Outcome(text="", tool_calls=1, finish="tool_calls"), []),
        (
            sentinels.NOTHING,
            Outcome(text="cut", finish="length", generated_tokens=8),
            ["truncated"],
        ),
        (sentinels.NOTHING, Outcome(text="cut", finish="max_tokens"), ["truncated"]),
        (sentinels.Expectation(ends=False), Outcome(text="all of it", finish="length"), []),
        (JSON, Outcome(text='{"a": 1}', finish="stop"), []),
        (JSON, Outcome(text='{"a": ', finish="length"), ["truncated", "invalid_json"]),
        (JSON, Outcome(text="", finish="stop"), ["empty"]),
        (SCHEMA_WANTED, Outcome(text='{"n": 3}', finish="stop"), []),
        (SCHEMA_WANTED, Outcome(text='{"n": "three"}', finish="stop"), ["schema_mismatch"]),
        (SCHEMA_WANTED, Outcome(text="{}", finish="stop"), ["schema_mismatch"]),
        (
            sentinels.Expectation(True, {"type": 12}),
            Outcome(text="{}", finish="stop"),
            [],
        ),  # unusable schema
        (
            JSON,
            Outcome(text='{"a": ', finish="stop", complete=False),
            [],
        ),  # not kept whole: no verdict
        (sentinels.NOTHING, Outcome(text=None), []),  # embeddings, counts
    ],
)
def test_sentinel_checks(
    expect: sentinels.Expectation, outcome: Outcome, checks: list[str]
) -> None:
    found = sentinels.check(expect, outcome)
    assert [d.check for d in found] == checks
    assert all(d.detail for d in found)


def test_the_gate_message_names_each_detection() -> None:
    found = sentinels.check(JSON, Outcome(text='{"a": ', finish="length"))
    message = sentinels.gate_message(found)
    assert "truncated" in message and "invalid_json" in message
    assert "serving.sentinel_enforce" in message
