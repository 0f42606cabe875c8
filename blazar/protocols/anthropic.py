"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over llama-server.

llama-server serves both endpoints natively (checked with xllamacpp 2026.10.11549):
it converts Anthropic messages, system prompts, tools, tool_use/tool_result blocks
and stop_sequences onto its chat machinery, and streams Anthropic's events. So the
gateway passes requests through rather than translating them to
`/v1/chat/completions`, and this module does the two jobs that leaves:

- `messages_request` / `count_tokens_request` validate a request the way
  Anthropic's API does (the engine accepts a request without `max_tokens`, answers
  image blocks with a 500 when it has no projector, ...) and forward only the fields
  the engine understands; `metadata` is accepted and dropped. A refusal is a
  `ProtocolError`; `error()` gives Anthropic's error body for it.
- `anthropic_stream` (re-exported here, so `blazar.protocols.anthropic` is the whole
  adapter) normalizes what the engine returns, whole or event by event, and holds
  Anthropic's error shapes.

Validation refuses, naming the field, what Anthropic refuses and the engine would
take wrongly: a message or block field that is not Anthropic's (an OpenAI-style
`tool_calls`, which the engine reads), `tool_choice` `any`/`tool` (the engine does
not force a call), structured output (`output_config.format`, which the engine's
`/v1/messages` ignores). `needs` says which template capabilities a request needs.
For a model with a vision projector, `image_refs` lists the image blocks' sources as
URLs and `with_images` puts them back as base64 sources once the gateway has checked
and fetched them (`blazar.serve.request.images`): the engine would fetch a `url`
source itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blazar.protocols import EngineRequest, ImageRef, ProtocolError
from blazar.protocols.anthropic_stream import (
    STATUS_TYPES,
    StreamState,
    error,
    error_from_engine,
    error_type,
    finish_stream,
    from_protocol_error,
    message_response,
    sse,
    stream_events,
)

__all__ = [
    "STATUS_TYPES",
    "StreamState",
    "count_tokens_request",
    "error",
    "error_from_engine",
    "error_type",
    "finish_stream",
    "from_protocol_error",
    "image_refs",
    "message_response",
    "messages_request",
    "needs",
    "no_projector",
    "sse",
    "stream_events",
    "with_images",
]

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
# The fields of each content block (and of a message) in Anthropic's API; any other is
# refused by name, as Anthropic does: the engine would read some (OpenAI's `tool_calls`)
# and fail on others with a 500.
MESSAGE_FIELDS = frozenset({"role", "content"})
BLOCK_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "image": frozenset({"type", "source", "cache_control"}),
    "document": frozenset({"type", "source", "cache_control", "title", "context", "citations"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}


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


def no_projector(where: str) -> ProtocolError:
    """The refusal of an image block sent to a model without a vision projector."""
    return _bad(
        f"{where}: image content is not supported: this model has no vision projector. "
        "Use a vision model (a GGUF with its mmproj) or send text only."
    )


def _image(where: str, has_vision: bool, block: Mapping[str, Any]) -> None:
    if not has_vision:
        raise no_projector(where)
    source = block.get("source")
    source = source if isinstance(source, Mapping) else {}
    kind = source.get("type")
    if kind == "base64":
        for key in ("media_type", "data"):
            if not isinstance(source.get(key), str) or not source[key]:
                raise _bad(f"{where}.source.{key}: Field required")
    elif kind == "url":
        if not isinstance(source.get("url"), str) or not source["url"]:
            raise _bad(f"{where}.source.url: Field required")
    else:
        raise _bad(f"{where}.source.type: Input should be 'base64' or 'url' (files are not kept)")


def _image_blocks(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, block) of every image block of a validated body: in messages, and in the
    content of their tool results."""
    found = []
    for i, msg in enumerate(body.get("messages") or []):
        content = msg.get("content") if isinstance(msg, Mapping) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "image":
                found.append((f"messages.{i}.content.{j}", block))
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else []):
                if isinstance(part, Mapping) and part.get("type") == "image":
                    found.append((f"messages.{i}.content.{j}.content.{k}", part))
    return found


def image_refs(body: Mapping[str, Any]) -> list[ImageRef]:
    """The request's images as URLs, in order: a base64 source as a `data:` URL."""
    refs = []
    for where, block in _image_blocks(body):
        source = block.get("source") or {}
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        else:
            url = str(source.get("url") or "")
        refs.append(ImageRef(where, url))
    return refs


def with_images(body: Mapping[str, Any], urls: list[str]) -> dict[str, Any]:
    """The body with each image block's source replaced, in order, by the base64 source
    of the `data:` URL given for it (a copy: the messages that change are new)."""
    pending = iter(urls)

    def source(url: str) -> dict[str, Any]:
        head, _, data = url.partition(",")
        media = head.removeprefix("data:").split(";")[0]
        return {"type": "base64", "media_type": media, "data": data}

    def block(b: Any) -> Any:
        if not isinstance(b, Mapping):
            return b
        if b.get("type") == "image":
            return {**b, "source": source(next(pending))}
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
            return {**b, "content": [block(part) for part in b["content"]]}
        return b

    messages = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, Mapping) else None
        if isinstance(content, list):
            msg = {**msg, "content": [block(b) for b in content]}
        messages.append(msg)
    return {**body, "messages": messages}


def _extra(value: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(str(k) for k in value if k not in allowed)
    if extra:
        raise _bad(f"{where}.{extra[0]}: Extra inputs are not permitted")


def _text_blocks(value: Any, where: str, *, has_vision: bool, images: bool) -> None:
    """A string, or a list of text blocks (and image blocks where `images`)."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _bad(f"{where}: Input should be a string or a list of content blocks")
    for j, block in enumerate(value):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if isinstance(block, Mapping) and kind in BLOCK_FIELDS:
            _extra(block, BLOCK_FIELDS[kind], f"{where}.{j}")
        if kind == "image" and images:
            _image(f"{where}.{j}", has_vision, block)
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
    _extra(block, BLOCK_FIELDS[kind], where)
    if kind == "text" and not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: Field required")
    elif kind == "image":
        _image(where, has_vision, block)
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
        _extra(msg, MESSAGE_FIELDS, where)
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
        if kind in ("any", "tool"):  # the engine accepts them and then does not force a call
            raise _bad(
                f"tool_choice.type '{kind}': this engine cannot force a tool call with this "
                "model's chat template; send tool_choice 'auto' (or leave it out)"
            )


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
    config = body.get("output_config")
    structured = isinstance(config, Mapping) and config.get("format") is not None
    if structured or body.get("output_format") is not None:
        where = "output_config.format" if structured else "output_format"
        raise _bad(
            f"{where}: structured output is not supported on /v1/messages by this engine "
            "(it would answer free text); ask for JSON in the prompt, or use "
            "/v1/chat/completions with response_format"
        )
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


def needs(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The template capabilities a request needs: `tools` when it offers the model tools."""
    choice = body.get("tool_choice")
    none = isinstance(choice, Mapping) and choice.get("type") == "none"
    return ("tools",) if body.get("tools") and not none else ()


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
