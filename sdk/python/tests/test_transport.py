"""The parsing under every call: error envelopes into typed exceptions, SSE, JSON Lines.

Tables of what the gateway sends on each protocol's paths (the bodies are the
shapes of `blazar/serve/request/envelopes.py`), decoded by
`blazar_sdk.errors.from_response` and `blazar_sdk._transport`; the same
exceptions against the real gateway are in test_client.py.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from blazar_sdk import (
    APIError,
    AuthenticationError,
    BadRequestError,
    BusyError,
    NotFoundError,
    RateLimitError,
    ServerError,
    UpstreamError,
)
from blazar_sdk._transport import json_lines, sse_events
from blazar_sdk.errors import from_response

OPENAI = {
    "error": {"message": "m", "type": "server_error", "param": None, "code": "all_slots_busy"}
}
ANTHROPIC = {"type": "error", "error": {"type": "not_found_error", "message": "m"}}


@pytest.mark.parametrize(
    ("status", "body", "headers", "kind", "code"),
    [
        (503, OPENAI, {"Retry-After": "2"}, BusyError, "all_slots_busy"),
        (404, ANTHROPIC, {}, NotFoundError, "not_found_error"),
        (400, {"error": "m"}, {}, BadRequestError, None),  # ollama's
        (
            401,
            {"error": {"message": "m", "type": "authentication_error", "code": 401}},
            {},
            AuthenticationError,
            "authentication_error",
        ),  # llama-server's int code: the type
        (429, {"error": {"message": "m"}}, {"retry-after": "7"}, RateLimitError, None),
        (
            502,
            {"error": {"message": "m", "code": "upstream_error"}},
            {},
            UpstreamError,
            "upstream_error",
        ),
        (500, {"error": {"message": "m"}}, {}, ServerError, None),
        (418, {"error": {"message": "m"}}, {}, APIError, None),
    ],
)
def test_error_answers_become_typed_exceptions(
    status: int, body: Any, headers: dict[str, str], kind: type[APIError], code: str | None
) -> None:
    error = from_response(status, json.dumps(body).encode(), {**headers, "x-request-id": "t1"})
    assert type(error) is kind and (error.status, error.message, error.code) == (status, "m", code)
    assert error.body == body and error.trace_id == "t1" and "blazar why t1" in str(error)
    if isinstance(error, (BusyError, RateLimitError)):
        assert error.retry_after == float(headers.get("Retry-After") or headers["retry-after"])


def test_a_body_that_is_not_json_is_the_message() -> None:
    error = from_response(502, b"<html>Bad Gateway</html>\n", {})
    assert isinstance(error, UpstreamError) and error.message == "<html>Bad Gateway</html>"
    assert from_response(500, b"", {}).message == "HTTP 500 with no body"


class Answer(io.BytesIO):
    """What `sse_events` reads: `readline()` and `headers` (an HTTPResponse has both)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.headers = {"x-request-id": "t2"}


def test_server_sent_events() -> None:
    stream = (
        b': a comment\r\nevent: message\r\ndata: {"a": 1}\r\n\r\n'
        b'data: {"b":\ndata: 2}\n\n'  # one event over two data lines
        b'data: {"c": 3}'  # the last event without its blank line
    )
    assert list(sse_events(Answer(stream))) == [{"a": 1}, {"b": 2}, {"c": 3}]  # type: ignore[arg-type]
    done = b'data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"late": 1}\n\n'
    assert list(sse_events(Answer(done))) == [{"a": 1}]  # type: ignore[arg-type]
    failed = b'data: {"a": 1}\n\ndata: {"error": {"message": "gone", "code": "upstream_error"}}\n\n'
    events = sse_events(Answer(failed))  # type: ignore[arg-type]
    assert next(events) == {"a": 1}
    with pytest.raises(UpstreamError) as error:
        next(events)
    assert (error.value.status, error.value.message, error.value.trace_id) == (502, "gone", "t2")


def test_json_lines() -> None:
    lines = b'{"custom_id": "a"}\n\n{"custom_id": "b"}\r\n'
    assert list(json_lines(Answer(lines))) == [{"custom_id": "a"}, {"custom_id": "b"}]  # type: ignore[arg-type]
