"""The pieces every protocol adapter shares: ProtocolError, the OpenAI error envelope, SSE.

Pure and fast: no engine. The SSE decoder is fed real llama-server streams from the
golden files, split at every byte boundary, to show that chunking never changes
what comes out.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.shared import ErrorObject

from blazar.protocols import EngineRequest, ProtocolError, ollama, openai
from blazar.protocols.sse import DONE, SSEDecoder, SSEEvent, encode
from tests.golden import runner


@pytest.mark.parametrize(
    ("status", "type_", "code"),
    [
        (400, "invalid_request_error", None),
        (401, "invalid_request_error", "invalid_api_key"),
        (404, "invalid_request_error", "model_not_found"),
        (413, "invalid_request_error", "request_too_large"),
        (429, "rate_limit_error", "rate_limit_exceeded"),
        (500, "server_error", None),
        (502, "server_error", "upstream_error"),
        (503, "server_error", "all_slots_busy"),
        (418, "invalid_request_error", None),
        (599, "server_error", None),
    ],
)
def test_openai_error_shape_by_status(status: int, type_: str, code: str | None) -> None:
    assert openai.error(status, "nope") == {
        "error": {"message": "nope", "type": type_, "param": None, "code": code}
    }


def test_openai_error_from_a_translator_refusal() -> None:
    exc = ProtocolError(404, "model 'x' is not pulled: run `blazar pull x`")
    body = openai.from_protocol_error(exc)
    assert body["error"]["code"] == "model_not_found" and body["error"]["message"] == exc.message
    assert openai.error(400, "m", code="context_length_exceeded")["error"]["code"] == (
        "context_length_exceeded"
    )
    ErrorObject.model_validate(body["error"])


def test_engine_request_serializes_hints_only_when_present() -> None:
    assert EngineRequest("/x", {"a": 1}, False).to_dict() == {
        "path": "/x",
        "stream": False,
        "body": {"a": 1},
    }
    assert EngineRequest("/x", {}, True, {"k": 1}).to_dict()["hints"] == {"k": 1}


def _wire(events: list[Any], named: bool) -> bytes:
    return b"".join(
        encode(e, e.get("type") if named and isinstance(e, dict) else None) for e in events
    )


@pytest.mark.parametrize(
    ("protocol", "name", "named"),
    [
        ("ollama", "chat_stream", False),
        ("ollama", "generate_raw_stream", False),
        ("anthropic", "message_tool_use_stream", True),
    ],
)
def test_sse_decoder_survives_any_split(protocol: str, name: str, named: bool) -> None:
    payloads = runner.load(protocol, name)["input"]
    wire = _wire(payloads, named)
    for size in (1, 2, 3, 7, 64, len(wire)):
        decoder = SSEDecoder()
        events: list[SSEEvent] = []
        for start in range(0, len(wire), size):
            events += decoder.feed(wire[start : start + size])
        events += decoder.close()
        assert [e.data for e in events] == payloads
        if named:
            assert [e.event for e in events] == [p["type"] for p in payloads]


def test_sse_decoder_edge_cases() -> None:
    decoder = SSEDecoder()
    text = b': keep-alive\r\n\r\ndata: {"a": 1}\r\n\r\ndata: not json\n\ndata: [DONE]\n\n'
    events = decoder.feed(text)
    assert [e.data for e in events] == [{"a": 1}, "not json", DONE]


def test_sse_decoder_flushes_an_unterminated_last_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"b": 2}') == []
    assert decoder.close() == [SSEEvent(None, {"b": 2})]


def test_ndjson_lines() -> None:
    assert ollama.ndjson({"done": True, "response": "é"}) == b'{"done":true,"response":"\\u00e9"}\n'
