"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over llama-server.

llama-server serves both endpoints natively (checked with xllamacpp 2026.10.11549):
it converts Anthropic messages, system prompts, tools, tool_use/tool_result blocks
and stop_sequences onto its chat machinery, and streams Anthropic's events. So the
gateway passes requests through rather than translating them to
`/v1/chat/completions`, and this module does the two jobs that leaves:

- `messages_request` / `count_tokens_request` validate a request the way
  Anthropic's API does (the engine accepts a request without `max_tokens`, answers
  image blocks with a 500, ...) and forward only the fields the engine understands;
  `metadata` is accepted and dropped. A refusal is a `ProtocolError`; `error()`
  gives Anthropic's error body for it.
- `message_response` and `stream_events` normalize what the engine returns: the
  model name the client asked for instead of the engine's file path, a `msg_` id the
  gateway makes, `stop_reason: "stop_sequence"` when a stop sequence ended the
  message (the engine says `end_turn`), the `ping` event the engine never sends,
  `content_block_stop` before the next block starts (the engine closes a text
  block only after a tool_use block has started), `input: {}` on a streamed
  tool_use start, and complete `usage` objects.

The gateway decodes the engine's SSE (`blazar.protocols.sse`), feeds each event's
JSON to `stream_events`, writes what it returns with `sse`, and calls
`finish_stream` when the engine's stream ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.sse import DONE, encode

__all__ = [
    "STATUS_TYPES",
    "StreamState",
    "count_tokens_request",
    "error",
    "error_from_engine",
    "error_type",
    "finish_stream",
    "from_protocol_error",
    "message_response",
    "messages_request",
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
# Fields llama-server's /v1/messages reads; everything else stays with the gateway.
FORWARDED = (
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "stream",
    "thinking",
)
COUNT_FORWARDED = ("model", "messages", "system", "tools", "tool_choice", "thinking")
REFUSED_FIELDS = {
    "mcp_servers": "MCP connectors run on Anthropic's servers",
    "container": "code execution containers run on Anthropic's servers",
}
USER_BLOCKS = ("text", "image", "tool_result", "document")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")


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


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


def _number(body: Mapping[str, Any], key: str, low: float, high: float | None) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{key}: Input should be a valid number")
    if value < low or (high is not None and value > high):
        bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise _bad(f"{key}: Input should be {bound}")


def _image(where: str, has_vision: bool) -> None:
    if not has_vision:
        raise _bad(
            f"{where}: image content is not supported: this model has no vision projector. "
            "Use a vision model (a GGUF with its mmproj) or send text only."
        )


def _text_blocks(value: Any, where: str, *, has_vision: bool, images: bool) -> None:
    """A string, or a list of text blocks (and image blocks where `images`)."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _bad(f"{where}: Input should be a string or a list of content blocks")
    for j, block in enumerate(value):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "image" and images:
            _image(f"{where}.{j}", has_vision)
        elif kind != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"{where}.{j}: expected a text block with a string `text`")


def _block(block: Any, role: str, where: str, has_vision: bool) -> None:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise _bad(f"{where}: Input should be a content block with a `type`")
    kind = block["type"]
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    if kind not in allowed:
        raise _bad(
            f"{where}.type: '{kind}' blocks are not supported in {role} messages "
            f"here; supported: {', '.join(allowed)}"
        )
    if kind == "text" and not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: Field required")
    elif kind == "image":
        _image(where, has_vision)
    elif kind == "document":
        raise _bad(f"{where}: document blocks (PDF, files) are not supported; send the text")
    elif kind == "tool_use":
        for key in ("id", "name"):
            if not isinstance(block.get(key), str):
                raise _bad(f"{where}.{key}: Field required")
        if not isinstance(block.get("input"), Mapping):
            raise _bad(f"{where}.input: Input should be an object")
    elif kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise _bad(f"{where}.tool_use_id: Field required")
        if block.get("content") is not None:
            _text_blocks(block["content"], f"{where}.content", has_vision=has_vision, images=True)


def _messages(messages: Any, has_vision: bool) -> None:
    if messages is None:
        raise _bad("messages: Field required")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: Input should be a non-empty list")
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(msg, Mapping):
            raise _bad(f"{where}: Input should be an object")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise _bad(f"{where}.role: Input should be 'user' or 'assistant'")
        content = msg.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}.content: Input should be a string or a list of content blocks")
        for j, block in enumerate(content):
            _block(block, role, f"{where}.content.{j}", has_vision)


def _tools(tools: Any, tool_choice: Any) -> None:
    if tools is not None:
        if not isinstance(tools, list):
            raise _bad("tools: Input should be a list")
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise _bad(f"tools.{i}: Input should be an object")
            if tool.get("type") not in (None, "custom"):
                raise _bad(
                    f"tools.{i}: server tool '{tool['type']}' is not supported; only "
                    "custom tools (name, description, input_schema) are"
                )
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise _bad(f"tools.{i}.name: Field required")
            if not isinstance(tool.get("input_schema"), Mapping):
                raise _bad(f"tools.{i}.input_schema: Field required")
    if tool_choice is not None:
        kind = tool_choice.get("type") if isinstance(tool_choice, Mapping) else None
        if kind not in ("auto", "any", "tool", "none"):
            raise _bad("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
        if kind == "tool" and not isinstance(tool_choice.get("name"), str):
            raise _bad("tool_choice.name: Field required")


def _validate(body: Mapping[str, Any], *, has_vision: bool, count: bool) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model: Field required")
    if not count:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise _bad("max_tokens: Field required")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad("max_tokens: Input should be an integer greater than or equal to 1")
    for key, why in REFUSED_FIELDS.items():
        if body.get(key):
            raise _bad(f"{key}: not supported by Blazar ({why})")
    _messages(body.get("messages"), has_vision)
    if body.get("system") is not None:
        _text_blocks(body["system"], "system", has_vision=has_vision, images=False)
    stops = body.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)
    ):
        raise _bad("stop_sequences: Input should be a list of strings")
    _number(body, "temperature", 0.0, 1.0)
    _number(body, "top_p", 0.0, 1.0)
    _number(body, "top_k", 0.0, None)
    _tools(body.get("tools"), body.get("tool_choice"))
    thinking = body.get("thinking")
    if thinking is not None and (
        not isinstance(thinking, Mapping) or thinking.get("type") not in ("enabled", "disabled")
    ):
        raise _bad("thinking.type: Input should be 'enabled' or 'disabled'")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _bad("stream: Input should be a valid boolean")


def _forward(body: Mapping[str, Any], keys: tuple[str, ...], path: str) -> EngineRequest:
    out = {k: body[k] for k in keys if body.get(k) is not None}
    ignored = sorted(k for k in body if k not in keys)
    hints = {"ignored": ignored} if ignored else {}
    return EngineRequest(path, out, bool(out.get("stream", False)), hints)


def messages_request(body: Mapping[str, Any], *, has_vision: bool = False) -> EngineRequest:
    """Validate a `/v1/messages` request; forward it to llama-server's native endpoint.

    Fields the engine does not use (`metadata`, `service_tier`, ...) are dropped and
    named in `hints["ignored"]`.
    """
    _validate(body, has_vision=has_vision, count=False)
    return _forward(body, FORWARDED, "/v1/messages")


def count_tokens_request(body: Mapping[str, Any], *, has_vision: bool = False) -> EngineRequest:
    """Validate a `/v1/messages/count_tokens` request; the engine answers `{"input_tokens": N}`."""
    _validate(body, has_vision=has_vision, count=True)
    return _forward(body, COUNT_FORWARDED, "/v1/messages/count_tokens")


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
