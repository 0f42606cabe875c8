"""Anthropic's responses and errors, normalized from what llama-server's `/v1/messages` sends.

Part of the Anthropic adapter (`blazar.protocols.anthropic` re-exports all of it).
`message_response` and `stream_events` normalize what the engine returns: the
model name the client asked for instead of the engine's file path, a `msg_` id the
gateway makes, `stop_reason: "stop_sequence"` when a stop sequence ended the
message (the engine says `end_turn`), the `ping` event the engine never sends,
`content_block_stop` before the next block starts (the engine closes a text
block only after a tool_use block has started), `input: {}` on a streamed
tool_use start, and complete `usage` objects. `error` is Anthropic's error body.

The gateway decodes the engine's SSE (`blazar.protocols.sse`), feeds each event's
JSON to `stream_events`, writes what it returns with `sse`, and calls
`finish_stream` when the engine's stream ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols import ProtocolError
from blazar.protocols.sse import DONE, encode

__all__ = [
    "STATUS_TYPES",
    "StreamState",
    "error",
    "error_from_engine",
    "error_type",
    "finish_stream",
    "from_protocol_error",
    "message_response",
    "sse",
    "stream_events",
]

STATUS_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in STATUS_TYPES:
        return STATUS_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error(status: int, type_: str | None, message: str) -> dict[str, Any]:
    """Anthropic's error body; `type_` None takes the status mapping."""
    return {"type": "error", "error": {"type": type_ or error_type(status), "message": message}}


def from_protocol_error(exc: ProtocolError) -> dict[str, Any]:
    """Anthropic's error body for a translator's refusal."""
    return error(exc.status, exc.code, exc.message)


def error_from_engine(status: int, body: Any) -> tuple[int, dict[str, Any]]:
    """An engine error (llama-server answers in OpenAI's shape) -> Anthropic's."""
    message = body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message", inner) if isinstance(inner, Mapping) else inner
    return status, error(status, None, str(message))


def sse(event: Mapping[str, Any]) -> bytes:
    """One Anthropic stream event as SSE bytes, named by its type."""
    return encode(dict(event), str(event.get("type", "")))


def _usage(usage: Any, output_tokens: int | None = None) -> dict[str, Any]:
    u = usage if isinstance(usage, Mapping) else {}
    return {
        "input_tokens": int(u.get("input_tokens") or 0),
        "cache_creation_input_tokens": int(u.get("cache_creation_input_tokens") or 0),
        "cache_read_input_tokens": int(u.get("cache_read_input_tokens") or 0),
        "output_tokens": int(u.get("output_tokens") or 0)
        if output_tokens is None
        else output_tokens,
    }


def _stop_reason(reason: Any, stop_sequence: Any) -> Any:
    if stop_sequence and reason in (None, "end_turn"):
        return "stop_sequence"
    return reason or "end_turn"


def _content_block(block: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(block)
    if out.get("type") == "tool_use" and not isinstance(out.get("input"), Mapping):
        out["input"] = {}
    return out


def message_response(engine: Mapping[str, Any], *, model: str, message_id: str) -> dict[str, Any]:
    """A whole engine `/v1/messages` response, normalized (see the module docstring)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_content_block(b) for b in engine.get("content") or []],
        "stop_reason": _stop_reason(engine.get("stop_reason"), engine.get("stop_sequence")),
        "stop_sequence": engine.get("stop_sequence"),
        "usage": _usage(engine.get("usage")),
    }


@dataclass
class StreamState:
    """What the stream normalizer remembers between events (one per request)."""

    model: str
    message_id: str
    open_blocks: list[int] = field(default_factory=list)
    closed: set[int] = field(default_factory=set)
    usage: dict[str, Any] = field(default_factory=dict)
    pinged: bool = False
    stopped: bool = False


def _close_open(state: StreamState, keep: int | None = None) -> list[dict[str, Any]]:
    out = []
    for index in [i for i in state.open_blocks if i != keep]:
        state.open_blocks.remove(index)
        state.closed.add(index)
        out.append({"type": "content_block_stop", "index": index})
    return out


def _ping(state: StreamState) -> list[dict[str, Any]]:
    if state.pinged:
        return []
    state.pinged = True
    return [{"type": "ping"}]


def stream_events(event: Any, state: StreamState) -> list[dict[str, Any]]:
    """One engine stream event's JSON -> the normalized events to send, in order."""
    if event is None or event == DONE:
        return finish_stream(state)
    if not isinstance(event, Mapping) or state.stopped:
        return []
    kind = event.get("type")
    if "error" in event:  # an engine failure mid-stream, in OpenAI's shape or Anthropic's
        state.stopped = True
        if kind == "error":
            return [dict(event)]
        return [error_from_engine(500, event)[1]]
    if kind == "message_start":
        message = dict(event.get("message") or {})
        state.usage = _usage(message.get("usage"))
        message.update(id=state.message_id, model=state.model, usage=dict(state.usage))
        return [{"type": "message_start", "message": message}]
    if kind == "content_block_start":
        index = int(event.get("index", 0))
        out = _close_open(state)
        state.open_blocks.append(index)
        block = _content_block(event.get("content_block") or {})
        out.append({"type": "content_block_start", "index": index, "content_block": block})
        return out + _ping(state)
    if kind == "content_block_stop":
        index = int(event.get("index", 0))
        if index in state.closed:
            return []  # already closed before the next block started
        if index in state.open_blocks:
            state.open_blocks.remove(index)
        state.closed.add(index)
        return [{"type": "content_block_stop", "index": index}]
    if kind == "message_delta":
        out = _ping(state) + _close_open(state)
        delta = dict(event.get("delta") or {})
        delta["stop_reason"] = _stop_reason(delta.get("stop_reason"), delta.get("stop_sequence"))
        delta.setdefault("stop_sequence", None)
        given = event.get("usage") or {}
        output_tokens = int(given.get("output_tokens") or 0)
        counted = {k: v for k, v in given.items() if k != "output_tokens" and v}  # bridged
        usage = _usage({**state.usage, **counted}, output_tokens)
        return [*out, {"type": "message_delta", "delta": delta, "usage": usage}]
    if kind == "message_stop":
        state.stopped = True
        return [*_close_open(state), {"type": "message_stop"}]
    return [dict(event)]  # content_block_delta, ping and anything newer pass as they are


def finish_stream(state: StreamState) -> list[dict[str, Any]]:
    """The engine's stream ended: nothing more if it ended properly, else an error event."""
    if state.stopped:
        return []
    state.stopped = True
    message = "the model's engine ended the stream before message_stop"
    return [error(502, None, message)]
