"""The SDK's exceptions: one class per kind of failure, each carrying what the gateway said.

`from_response` (called by `blazar_sdk._transport` for every answer with an
error status, and for an error event in a stream) picks the class by HTTP
status and reads the message out of whichever protocol's envelope the gateway
used on that path: OpenAI's `{"error": {"message", "type", "code"}}` on
`/v1/*`, ollama's `{"error": "..."}` on `/api/*`, Anthropic's `{"type":
"error", "error": {"type", "message"}}` on `/v1/messages*`. Every `APIError`
keeps the whole body and the trace id (`x-request-id`), which `blazar why ID`
and `Client.explain(ID)` look up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BlazarError",
    "BusyError",
    "ConflictError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RealtimeError",
    "ServerError",
    "ToolError",
    "ToolLoopError",
    "UpstreamError",
    "from_response",
]


class BlazarError(Exception):
    """Every error this SDK raises."""


class APIConnectionError(BlazarError):
    """The gateway could not be reached (nothing listening, refused, TLS, DNS)."""


class APITimeoutError(APIConnectionError):
    """The gateway did not answer within the client's timeout."""


class APIError(BlazarError):
    """The gateway answered with an error status.

    `status`: the HTTP status; `message`: what the gateway said; `code`: the
    envelope's code or type (`all_slots_busy`, `not_found_error`, ...) when it
    has one; `body`: the whole decoded body (a dict, or the text when it was not
    JSON); `trace_id`: the answer's `x-request-id`.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        body: Any = None,
        trace_id: str | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.body = body
        self.trace_id = trace_id
        trace = f" (trace {trace_id}: `blazar why {trace_id}`)" if trace_id else ""
        super().__init__(f"{status}: {message}{trace}")


class BadRequestError(APIError):
    """400, 413, 422: the request was wrong; the message says what to change."""


class AuthenticationError(APIError):
    """401: no key, or a key the gateway does not know (set BLAZAR_API_KEY)."""


class PermissionDeniedError(APIError):
    """403: the key's scope or model list does not cover this call, or a refused Origin."""


class NotFoundError(APIError):
    """404: no such model, route, trace, session, remote or stored response."""


class ConflictError(APIError):
    """409: the call would break something that depends on the current state."""


class _RetryAfter(APIError):
    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class RateLimitError(_RetryAfter):
    """429: the key is past its requests per minute; `retry_after` seconds until it is not."""


class BusyError(_RetryAfter):
    """503: every slot is busy and the queue is full (`all_slots_busy`), or the gateway is
    starting; `retry_after` is the gateway's `Retry-After` in seconds."""


class UpstreamError(APIError):
    """502, 504: the model's engine (or a remote) failed or timed out while answering."""


class ServerError(APIError):
    """500 and the other 5xx: a fault in the gateway."""


class ToolError(BlazarError):
    """The tool loop could not run a call the model made: no handler for its name, the
    handler raised (the handler's exception is `__cause__`), or arguments that are not
    a JSON object. `tool` is the name the model called, `arguments` what it sent."""

    def __init__(self, message: str, *, tool: str, arguments: Any = None) -> None:
        super().__init__(message)
        self.tool = tool
        self.arguments = arguments


class ToolLoopError(BlazarError):
    """The model was still calling tools after `max_tool_rounds` rounds; `messages` holds
    the conversation so far (tool calls and their results included)."""

    def __init__(self, message: str, *, messages: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.messages = messages


class RealtimeError(BlazarError):
    """A realtime WebSocket failed: a bad handshake, a protocol violation, or a close
    (`close_code`, `close_reason` when the peer sent them)."""

    def __init__(
        self, message: str, *, close_code: int | None = None, close_reason: str = ""
    ) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.close_reason = close_reason


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
    502: UpstreamError,
    503: BusyError,
    504: UpstreamError,
}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None  # an HTTP date: not sent by Blazar
    return None


def _trace(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == "x-request-id":
            return value
    return None


def describe(body: Any) -> tuple[str | None, str | None]:
    """(message, code) from any of the three envelopes; (None, None) when it is none."""
    if not isinstance(body, Mapping):
        return None, None
    inner = body.get("error")
    if isinstance(inner, str):  # ollama
        return inner, None
    if isinstance(inner, Mapping):  # OpenAI, Anthropic
        message = inner.get("message")
        code = inner.get("code")
        code = code if isinstance(code, str) else inner.get("type")
        return (
            str(message) if message is not None else None,
            str(code) if code is not None else None,
        )
    return None, None


def from_response(status: int, payload: bytes, headers: Mapping[str, str]) -> APIError:
    """The exception for an error answer: its class by status, its message from the body."""
    text = payload.decode("utf-8", errors="replace")
    body: Any
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = text
    message, code = describe(body)
    if message is None:
        message = text.strip()[:500] or f"HTTP {status} with no body"
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    trace = _trace(headers)
    if issubclass(kind, _RetryAfter):
        return kind(
            status, message, code=code, body=body, trace_id=trace, retry_after=_retry_after(headers)
        )
    return kind(status, message, code=code, body=body, trace_id=trace)


# A stream's error event has no status of its own: the gateway's code says what failed.
_STREAM_STATUS = {"upstream_error": 502, "upstream_timeout": 504, "all_slots_busy": 503}


def from_event(event: Mapping[str, Any], trace_id: str | None) -> APIError:
    """The exception for an error event that ended a stream (its headers were already 200)."""
    message, code = describe(event)
    status = _STREAM_STATUS.get(code or "", 500)
    kind = _BY_STATUS.get(status, ServerError)
    return kind(
        status,
        message or "the stream ended with an error",
        code=code,
        body=dict(event),
        trace_id=trace_id,
    )
