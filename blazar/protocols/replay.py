"""A cached answer, protocol-neutral, read from an engine's answer and written back as one.

The response cache (`blazar.serve.request.cache`, docs/cache.md) keeps what an answer
says, not its bytes: the text, the tool calls, the finish reason (OpenAI's words:
stop, length, tool_calls) and the token counts (`Recorded`). It reads them from the
engine's answer on each engine endpoint the gateway calls (`/v1/chat/completions`,
`/v1/completions`, llama-server's `/completion` and `/v1/messages`), whole
(`recorded`) or streamed (`Collector`, event by event), and writes a hit back in the
same endpoint's shape (`engine_whole`, `engine_stream`), so the route's own `Answer`
turns it into the client's protocol exactly as it turns a real engine answer: a
replay is whole or streamed and ends as a real answer does. Every replayed prompt
token is reported as cached (`prompt_tokens_details.cached_tokens`, Anthropic's
`cache_read_input_tokens`, llama-server's `timings.cache_n`).

Pure: no I/O, no clock (the caller passes ids and times).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

CHAT, COMPLETIONS, NATIVE, MESSAGES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/v1/messages",
)
PATHS = frozenset({CHAT, COMPLETIONS, NATIVE, MESSAGES})

_FROM_ANTHROPIC = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
_FROM_ANTHROPIC["tool_use"] = "tool_calls"
_TO_ANTHROPIC = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass
class Recorded:
    """What an answer said: its text, tool calls (OpenAI's shape: id, type, function with
    name and arguments as JSON text), finish reason and token counts."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> Recorded:
        data = orjson.loads(text)
        return cls(**data)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _finish_native(stop_type: Any) -> str:
    return "length" if stop_type == "limit" else "stop"


def recorded(path: str, payload: Any) -> Recorded | None:
    """A whole engine answer read; None when it is not one this module can replay."""
    if not isinstance(payload, dict):
        return None
    if path == CHAT:
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            return None
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            return None
        calls = message.get("tool_calls") or []
        usage = payload.get("usage") or {}
        return Recorded(
            content or "",
            [_call(c) for c in calls if isinstance(c, dict)],
            str(choice.get("finish_reason") or "stop"),
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
        )
    if path == COMPLETIONS:
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return None
        text = choices[0].get("text")
        usage = payload.get("usage") or {}
        return Recorded(
            text if isinstance(text, str) else "",
            [],
            str(choices[0].get("finish_reason") or "stop"),
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
        )
    if path == NATIVE:
        content = payload.get("content")
        if not isinstance(content, str):
            return None
        return Recorded(
            content,
            [],
            _finish_native(payload.get("stop_type")),
            _int(payload.get("tokens_evaluated")),
            _int(payload.get("tokens_predicted")),
        )
    if path == MESSAGES:
        return _messages(payload)
    return None


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {
            "name": str(function.get("name") or ""),
            "arguments": str(function.get("arguments") or ""),
        },
    }


def _messages(payload: dict[str, Any]) -> Recorded | None:
    content = payload.get("content")
    if not isinstance(content, list):
        return None
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            return None
        if block.get("type") == "text":
            text.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or ""),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
        else:  # thinking and the like: not replayed
            return None
    usage = payload.get("usage") or {}
    prompt = sum(
        _int(usage.get(k))
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    stop = payload.get("stop_reason")
    return Recorded(
        "".join(text),
        calls,
        _FROM_ANTHROPIC.get(str(stop), "stop"),
        prompt,
        _int(usage.get("output_tokens")),
    )


class Collector:
    """A streamed engine answer read event by event (`feed` each decoded event: a JSON
    object, or the text `[DONE]`); `result` is None unless the stream ended as a whole
    answer does (a finish reason seen) and held nothing this module cannot replay."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.prompt = 0
        self.completion = 0
        self.spoiled = path not in PATHS
        self._blocks: dict[int, str] = {}  # Anthropic: block index -> type

    def feed(self, data: Any) -> None:
        if self.spoiled or not isinstance(data, dict):
            return
        if "error" in data:
            self.spoiled = True
            return
        if self.path == MESSAGES:
            self._message_event(data)
            return
        if self.path == NATIVE:
            content = data.get("content")
            if isinstance(content, str):
                self.text.append(content)
            if data.get("stop"):
                self.finish = _finish_native(data.get("stop_type"))
                self.prompt = _int(data.get("tokens_evaluated"))
                self.completion = _int(data.get("tokens_predicted"))
            return
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.prompt = _int(usage.get("prompt_tokens")) or self.prompt
            self.completion = _int(usage.get("completion_tokens")) or self.completion
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        if len(choices) != 1 or not isinstance(choices[0], dict):
            self.spoiled = True
            return
        choice = choices[0]
        if self.path == COMPLETIONS:
            if isinstance(choice.get("text"), str):
                self.text.append(choice["text"])
        else:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                self._call_delta(part)
            if delta.get("reasoning_content"):
                self.spoiled = True  # thinking is not replayed
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])

    def _call_delta(self, part: Any) -> None:
        if not isinstance(part, dict):
            return
        index = _int(part.get("index"))
        call = self.calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if part.get("id"):
            call["id"] = str(part["id"])
        function = part.get("function") or {}
        if function.get("name"):
            call["function"]["name"] += str(function["name"])
        if function.get("arguments"):
            call["function"]["arguments"] += str(function["arguments"])

    def _message_event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            self.prompt = sum(
                _int(usage.get(k))
                for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            )
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            index = _int(data.get("index"))
            self._blocks[index] = str(block.get("type"))
            if block.get("type") == "tool_use":
                self.calls[index] = {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {"name": str(block.get("name") or ""), "arguments": ""},
                }
            elif block.get("type") != "text":
                self.spoiled = True
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            index = _int(data.get("index"))
            if delta.get("type") == "text_delta":
                self.text.append(str(delta.get("text") or ""))
            elif delta.get("type") == "input_json_delta" and index in self.calls:
                self.calls[index]["function"]["arguments"] += str(delta.get("partial_json") or "")
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            if delta.get("stop_reason"):
                self.finish = _FROM_ANTHROPIC.get(str(delta["stop_reason"]), "stop")
            self.completion = _int((data.get("usage") or {}).get("output_tokens"))

    def result(self) -> Recorded | None:
        if self.spoiled or self.finish is None:
            return None
        calls = [self.calls[i] for i in sorted(self.calls)]
        if self.path == MESSAGES:
            for call in calls:  # an empty input streams no delta: "{}"
                call["function"]["arguments"] = call["function"]["arguments"] or "{}"
        return Recorded("".join(self.text), calls, self.finish, self.prompt, self.completion)


# -- written back ----------------------------------------------------------------------


def _openai_usage(rec: Recorded) -> dict[str, Any]:
    return {
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "total_tokens": rec.prompt_tokens + rec.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": rec.prompt_tokens},
    }


def _timings(rec: Recorded) -> dict[str, Any]:
    return {
        "cache_n": rec.prompt_tokens,
        "prompt_n": 0,
        "prompt_ms": 0.0,
        "predicted_n": rec.completion_tokens,
        "predicted_ms": 0.0,
    }


def _anthropic_usage(rec: Recorded, output: int) -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": rec.prompt_tokens,
        "output_tokens": output,
    }


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = orjson.loads(function["arguments"] or "{}")
    except orjson.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def engine_whole(path: str, rec: Recorded, model: str, answer_id: str, created: int) -> bytes:
    """The engine's whole answer at `path` saying what `rec` says."""
    out: dict[str, Any]
    if path == CHAT:
        message: dict[str, Any] = {"role": "assistant", "content": rec.text or None}
        if rec.tool_calls:
            message["tool_calls"] = rec.tool_calls
        elif not rec.text:
            message["content"] = ""
        out = {
            "id": f"chatcmpl-{answer_id}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": rec.finish}],
            "usage": _openai_usage(rec),
            "timings": _timings(rec),
        }
    elif path == COMPLETIONS:
        out = {
            "id": f"cmpl-{answer_id}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "text": rec.text, "logprobs": None, "finish_reason": rec.finish}
            ],
            "usage": _openai_usage(rec),
            "timings": _timings(rec),
        }
    elif path == NATIVE:
        out = {
            "content": rec.text,
            "model": model,
            "stop": True,
            "stop_type": "limit" if rec.finish == "length" else "eos",
            "tokens_evaluated": rec.prompt_tokens,
            "tokens_predicted": rec.completion_tokens,
            "truncated": False,
            "timings": _timings(rec),
        }
    else:  # MESSAGES
        content: list[dict[str, Any]] = []
        if rec.text or not rec.tool_calls:
            content.append({"type": "text", "text": rec.text})
        content.extend(_tool_use(c) for c in rec.tool_calls)
        out = {
            "id": f"msg_{answer_id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": _TO_ANTHROPIC.get(rec.finish, "end_turn"),
            "stop_sequence": None,
            "usage": _anthropic_usage(rec, rec.completion_tokens),
        }
    return orjson.dumps(out)


def _data(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\n" + _data({"type": kind, **obj})


def engine_stream(path: str, rec: Recorded, model: str, answer_id: str, created: int) -> bytes:
    """The engine's stream at `path` saying what `rec` says, as server-sent events: the
    text in one delta, each tool call in one, then the finish and the usage, ending as
    the engine's own stream ends."""
    if path == MESSAGES:
        return _message_stream(rec, model, answer_id)
    if path == NATIVE:
        last = orjson.loads(engine_whole(path, rec, model, answer_id, created))
        last["content"] = ""
        return _data({"content": rec.text, "stop": False}) + _data(last)
    base: dict[str, Any] = {"created": created, "model": model}
    parts: list[bytes] = []
    if path == COMPLETIONS:
        base.update(id=f"cmpl-{answer_id}", object="text_completion")

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        parts.append(_data({**base, "choices": [choice(rec.text, None)]}))
        parts.append(_data({**base, "choices": [choice("", rec.finish)]}))
    else:
        base.update(id=f"chatcmpl-{answer_id}", object="chat.completion.chunk")

        def delta(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _data(
                {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            )

        parts.append(delta({"role": "assistant", "content": None}))
        if rec.text:
            parts.append(delta({"content": rec.text}))
        for index, call in enumerate(rec.tool_calls):
            parts.append(delta({"tool_calls": [{"index": index, **call}]}))
        parts.append(delta({}, rec.finish))
    parts.append(
        _data({**base, "choices": [], "usage": _openai_usage(rec), "timings": _timings(rec)})
    )
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _message_stream(rec: Recorded, model: str, answer_id: str) -> bytes:
    start: dict[str, Any] = {
        "id": f"msg_{answer_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _anthropic_usage(rec, 0),
    }
    parts = [_event("message_start", {"message": start})]
    index = 0
    if rec.text or not rec.tool_calls:
        block: dict[str, Any] = {"type": "text", "text": ""}
        parts.append(_event("content_block_start", {"index": 0, "content_block": block}))
        text_delta = {"type": "text_delta", "text": rec.text}
        parts.append(_event("content_block_delta", {"index": 0, "delta": text_delta}))
        parts.append(_event("content_block_stop", {"index": 0}))
        index = 1
    for call in rec.tool_calls:
        block = {**_tool_use(call), "input": {}}
        parts.append(_event("content_block_start", {"index": index, "content_block": block}))
        json_delta = {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}
        parts.append(_event("content_block_delta", {"index": index, "delta": json_delta}))
        parts.append(_event("content_block_stop", {"index": index}))
        index += 1
    stop = {"stop_reason": _TO_ANTHROPIC.get(rec.finish, "end_turn"), "stop_sequence": None}
    usage = {"output_tokens": rec.completion_tokens}
    parts.append(_event("message_delta", {"delta": stop, "usage": usage}))
    parts.append(_event("message_stop", {}))
    return b"".join(parts)
