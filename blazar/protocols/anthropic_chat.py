"""Anthropic Messages over llama-server's chat endpoint, for requests with LoRA adapters on.

llama-server's `/v1/messages` converts a request to its chat format keeping only
some fields (messages, system, tools, stop_sequences, max_tokens, temperature,
top_p, top_k, stream, thinking): a per-request `lora` list is dropped, so an
adapter would silently not apply (seen with xllamacpp 2026.10.11549). A
Messages request with adapters on is therefore sent to `/v1/chat/completions`:

- `chat_request` converts the forwarded body the way llama-server converts it
  (its `server_chat_convert_anthropic_to_oai`): system prompt, text, image,
  tool_use, tool_result and thinking blocks, tools and tool_choice;
- `message_from_chat` and `ChatEvents` turn the chat answer (whole, or chunk by
  chunk) back into the Anthropic shapes llama-server's `/v1/messages` answers
  with, so `blazar.protocols.anthropic` normalizes both paths the same way.

Pure, like every translator here: the gateway (`blazar.serve.routes.anthropic_api`)
posts what `chat_request` builds and feeds what comes back through the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols import EngineRequest
from blazar.protocols.sse import DONE

__all__ = ["ChatEvents", "chat_request", "message_from_chat"]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
PASSED = ("max_tokens", "temperature", "top_p", "top_k", "stream")


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    return "".join(b.get("text", "") for b in system or [] if b.get("type") == "text")


def _image(source: Mapping[str, Any]) -> dict[str, Any] | None:
    if source.get("type") == "base64":
        media = source.get("media_type", "image/jpeg")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
    if source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url", "")}}
    return None


def _tool_result(block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.get("type") == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif part.get("type") == "image" and (image := _image(part.get("source") or {})):
                parts.append(image)
        if all(p["type"] == "text" for p in parts):
            content = "".join(p["text"] for p in parts)
        else:
            content = parts
    elif not isinstance(content, str):
        content = ""
    return {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": content}


def _message(msg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message -> the chat messages it becomes (tool results follow it)."""
    content = msg.get("content")
    if not isinstance(content, list):
        return [dict(msg)]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append(dict(block))
        elif kind == "thinking":
            reasoning += block.get("thinking", "")
        elif kind == "image" and (image := _image(block.get("source") or {})):
            parts.append(image)
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name", ""), "arguments": arguments}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
        elif kind == "tool_result":
            results.append(_tool_result(block))
    out: list[dict[str, Any]] = []
    if parts or calls or reasoning:
        message: dict[str, Any] = {"role": msg.get("role"), "content": parts or ""}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = reasoning
        out.append(message)
    return out + results


def chat_request(req: EngineRequest) -> EngineRequest:
    """A forwarded `/v1/messages` request as the `/v1/chat/completions` request
    llama-server would make of it (usage asked for at the end of a stream)."""
    body = req.body
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _system(body["system"])})
    for msg in body.get("messages") or []:
        messages += _message(msg)
    out: dict[str, Any] = {"messages": messages}
    out.update({k: body[k] for k in PASSED if k in body})
    if body.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {},
                },
            }
            for t in body["tools"]
        ]
    choice = (body.get("tool_choice") or {}).get("type")
    if choice in ("auto", "none"):
        out["tool_choice"] = choice
    elif choice in ("any", "tool"):
        out["tool_choice"] = "required"
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        out["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    if req.stream:
        out["stream_options"] = {"include_usage": True}
    return EngineRequest("/v1/chat/completions", out, req.stream, req.hints)


def _usage(usage: Any) -> dict[str, int]:
    u = usage if isinstance(usage, Mapping) else {}
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "cache_read_input_tokens": cached,
        "input_tokens": max(0, int(u.get("prompt_tokens") or 0) - cached),
        "output_tokens": int(u.get("completion_tokens") or 0),
    }


def _input(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments or {}
    except ValueError:
        return {}


def message_from_chat(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A whole `chat.completion` -> the message `/v1/messages` would have answered."""
    choice = (payload.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        thinking = message["reasoning_content"]
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": _input(function.get("arguments")),
            }
        )
    return {
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": _usage(payload.get("usage")),
    }


@dataclass
class ChatEvents:
    """Chat stream chunks -> the events `/v1/messages` streams, one chunk at a time.

    Content, reasoning and each tool call become their own content block; the stop
    reason waits for the usage chunk that follows the last choice (or for `[DONE]`).
    """

    started: bool = False
    index: int = -1
    block: str | None = None  # "text" | "thinking" | "tool:<n>"
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    done: bool = False

    def feed(self, chunk: Any) -> list[Any]:
        if self.done:
            return []
        if chunk is None or chunk == DONE:
            return self._finish()
        if not isinstance(chunk, Mapping):
            return []
        if "error" in chunk:
            self.done = True
            return [dict(chunk)]
        out = self._start()
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                block = {"type": "thinking", "thinking": "", "signature": ""}
                out += self._open("thinking", block)
                thinking = {"type": "thinking_delta", "thinking": delta["reasoning_content"]}
                out.append(self._delta(thinking))
            if delta.get("content"):
                out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                out += self._tool(call)
            if choice.get("finish_reason"):
                self.stop_reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        if self.stop_reason is not None and chunk.get("usage"):
            out += self._finish()
        return out

    def _start(self) -> list[Any]:
        if self.started:
            return []
        self.started = True
        usage = {"cache_read_input_tokens": 0, "input_tokens": 0, "output_tokens": 0}
        message: dict[str, Any] = {
            "type": "message",
            "role": "assistant",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [{"type": "message_start", "message": message}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _open(self, block: str, content_block: dict[str, Any]) -> list[Any]:
        if self.block == block:
            return []
        out = self._close()
        self.index += 1
        self.block = block
        start = {"type": "content_block_start", "index": self.index}
        return [*out, {**start, "content_block": content_block}]

    def _close(self) -> list[Any]:
        if self.block is None:
            return []
        self.block = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _tool(self, call: Mapping[str, Any]) -> list[Any]:
        function = call.get("function") or {}
        out: list[Any] = []
        if call.get("id") or self.block != f"tool:{call.get('index', 0)}":
            block = {"type": "tool_use", "id": call.get("id", ""), "name": function.get("name", "")}
            out += self._open(f"tool:{call.get('index', 0)}", {**block, "input": {}})
        if function.get("arguments"):
            partial = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(self._delta(partial))
        return out

    def _finish(self) -> list[Any]:
        if self.done:
            return []
        self.done = True
        out = [*self._start(), *self._close()]
        delta = {"stop_reason": self.stop_reason or "end_turn", "stop_sequence": None}
        usage = self.usage or {"output_tokens": 0}
        out.append({"type": "message_delta", "delta": delta, "usage": usage})
        return [*out, {"type": "message_stop"}]
