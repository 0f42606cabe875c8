"""The Responses API's answers (`/v1/responses`), built from `/v1/chat/completions` ones.

The other half of the Responses translator (`openai_responses` builds the chat
request; `blazar.serve.routes.responses_api` sends it and calls these):

- `response_object` builds the Response from a whole chat answer: `output` items
  (`reasoning` from `reasoning_content`, a `message` with one `output_text` part,
  a `function_call` per tool call), `usage` in the Responses names, and `status`:
  `completed`, or `incomplete` with `incomplete_details.reason` `max_output_tokens`
  when `finish_reason` is `length`.
- `ResponseStream` turns the chat stream's chunks into the Responses event
  sequence: `response.created` and `response.in_progress` (the whole response
  object, in progress), then per output item `output_item.added`,
  `content_part.added`, `output_text.delta` ... `output_text.done`,
  `content_part.done`, `output_item.done` (`reasoning_text.*` for reasoning,
  `function_call_arguments.*` for tool calls), each with `output_index`,
  `content_index` and `item_id`, every event with the next `sequence_number`;
  it ends with `response.completed`, `response.incomplete` (cut at the token
  limit), or `response.failed` (the engine's stream ended early).

The request fields a Response repeats (`instructions`, `tools`, `text`, ...) come
in as `echo` (`ResponsesRequest.echo`). Pure: the gateway passes the response id
and the time in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols.openai_responses import obj
from blazar.protocols.sse import DONE

__all__ = ["ResponseStream", "response_object"]

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, Mapping):
        return None
    cached = obj(usage.get("prompt_tokens_details")).get("cached_tokens", 0)
    prompt, completion = (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached or 0), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _skeleton(rid: str, created_at: int, model: str, echo: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "previous_response_id": None,
        "service_tier": "default",
        "store": False,  # the request's echo says whether the gateway keeps it
        "top_logprobs": 0,
        "truncation": "disabled",
        "usage": None,
        **echo,
    }


def _finish(response: dict[str, Any], finish_reason: Any, usage: Any) -> dict[str, Any]:
    reason = INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    response["status"] = "incomplete" if reason else "completed"
    response["incomplete_details"] = {"reason": reason} if reason else None
    response["usage"] = _usage(usage)
    return response


def _ids(rid: str) -> str:
    return rid.removeprefix("resp_")


def _reasoning_item(rid: str, index: int, text: str, summary: bool) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{_ids(rid)}_{index}",
        "summary": [{"type": "summary_text", "text": text}] if summary else [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": None,
        "status": "completed",
    }


def _message_item(rid: str, index: int, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": f"msg_{_ids(rid)}_{index}",
        "status": status,
        "role": "assistant",
        "content": [part] if status != "in_progress" else [],
    }


def _call_item(
    rid: str, index: int, call: Mapping[str, Any], arguments: str, status: str
) -> dict[str, Any]:
    function = obj(call.get("function"))
    return {
        "type": "function_call",
        "id": f"fc_{_ids(rid)}_{index}",
        "call_id": str(call.get("id") or f"call_{_ids(rid)}_{index}"),
        "name": str(function.get("name") or ""),
        "arguments": arguments,
        "status": status,
    }


def response_object(
    engine: Mapping[str, Any],
    *,
    response_id: str,
    created_at: int,
    model: str,
    echo: Mapping[str, Any],
) -> dict[str, Any]:
    """A whole chat answer as a Response."""
    response = _skeleton(response_id, created_at, model, echo)
    choices = engine.get("choices") or [{}]
    choice = choices[0]
    message = obj(choice.get("message"))
    response = _finish(response, choice.get("finish_reason"), engine.get("usage"))
    cut = response["status"] == "incomplete"
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        summary = echo.get("reasoning", {}).get("summary") is not None
        output.append(
            _reasoning_item(response_id, len(output), message["reasoning_content"], summary)
        )
    if message.get("content") or not message.get("tool_calls"):
        status = "incomplete" if cut else "completed"
        output.append(_message_item(response_id, len(output), message.get("content") or "", status))
    for call in message.get("tool_calls") or []:
        if isinstance(call, Mapping):
            arguments = str(obj(call.get("function")).get("arguments") or "")
            status = "incomplete" if cut else "completed"
            output.append(_call_item(response_id, len(output), call, arguments, status))
    response["output"] = output
    return response


@dataclass
class _Open:
    """The output item being streamed: its kind, index, item and text so far."""

    kind: str  # "reasoning" | "message" | "function_call"
    index: int
    item: dict[str, Any]
    text: str = ""
    call: int | None = None  # the engine's tool call index


@dataclass
class ResponseStream:
    """Chat stream chunks -> Responses events (one per request; see the module docstring)."""

    response_id: str
    created_at: int
    model: str
    echo: Mapping[str, Any]
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    open: _Open | None = None
    finish_reason: Any = None
    usage: Any = None
    ended: bool = False

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self) -> dict[str, Any]:
        return _skeleton(self.response_id, self.created_at, self.model, self.echo)

    def start(self) -> list[dict[str, Any]]:
        """The events that open the stream, before the engine's first chunk."""
        return [
            self._event("response.created", response=self._response()),
            self._event("response.in_progress", response=self._response()),
        ]

    def _close(self) -> list[dict[str, Any]]:
        opened, self.open = self.open, None
        if opened is None:
            return []
        at = {"item_id": opened.item["id"], "output_index": opened.index}
        if opened.kind == "reasoning":
            summary = self.echo.get("reasoning", {}).get("summary") is not None
            item = _reasoning_item(self.response_id, opened.index, opened.text, summary)
            done = [
                self._event("response.reasoning_text.done", **at, content_index=0, text=opened.text)
            ]
        elif opened.kind == "message":
            status = "incomplete" if self.finish_reason == "length" else "completed"
            item = _message_item(self.response_id, opened.index, opened.text, status)
            part = item["content"][0]
            done = [
                self._event(
                    "response.output_text.done",
                    **at,
                    content_index=0,
                    text=opened.text,
                    logprobs=[],
                ),
                self._event("response.content_part.done", **at, content_index=0, part=part),
            ]
        else:
            item = {**opened.item, "arguments": opened.text, "status": "completed"}
            done = [
                self._event(
                    "response.function_call_arguments.done",
                    **at,
                    name=item["name"],
                    arguments=opened.text,
                )
            ]
        self.output.append(item)
        return [
            *done,
            self._event("response.output_item.done", output_index=opened.index, item=item),
        ]

    def _open(self, kind: str, call: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        out = self._close()
        index = len(self.output)
        if kind == "reasoning":
            item = {
                **_reasoning_item(self.response_id, index, "", False),
                "content": [],
                "status": "in_progress",
            }
        elif kind == "message":
            item = _message_item(self.response_id, index, "", "in_progress")
        else:
            item = _call_item(self.response_id, index, call or {}, "", "in_progress")
        self.open = _Open(kind, index, item, call=obj(call).get("index"))
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        return out

    def _delta(self, kind: str, text: str) -> dict[str, Any]:
        assert self.open is not None
        self.open.text += text
        at = {"item_id": self.open.item["id"], "output_index": self.open.index}
        if kind == "reasoning":
            return self._event("response.reasoning_text.delta", **at, content_index=0, delta=text)
        if kind == "message":
            return self._event(
                "response.output_text.delta", **at, content_index=0, delta=text, logprobs=[]
            )
        return self._event("response.function_call_arguments.delta", **at, delta=text)

    def _choice(self, choice: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        delta = obj(choice.get("delta"))
        for kind, key in (("reasoning", "reasoning_content"), ("message", "content")):
            text = delta.get(key)
            if isinstance(text, str) and text:
                if self.open is None or self.open.kind != kind:
                    out += self._open(kind)
                out.append(self._delta(kind, text))
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            if (
                self.open is None
                or self.open.kind != "function_call"
                or self.open.call != call.get("index")
            ):
                out += self._open("function_call", call)
            arguments = obj(call.get("function")).get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(self._delta("function_call", arguments))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return out

    def feed(self, data: Any) -> list[dict[str, Any]]:
        """One decoded chunk of the engine's stream -> the events to send, in order."""
        if data == DONE or data is None:
            return self.finish()
        if not isinstance(data, Mapping) or self.ended:
            return []
        if "error" in data:
            error = (
                data["error"] if isinstance(data["error"], Mapping) else {"message": data["error"]}
            )
            return [self.error("server_error", str(error.get("message")))]
        if data.get("usage") is not None:
            self.usage = data["usage"]
        out: list[dict[str, Any]] = []
        for choice in data.get("choices") or []:
            if isinstance(choice, Mapping):
                out += self._choice(choice)
        return out

    def error(self, code: str, message: str) -> dict[str, Any]:
        """The `error` event that ends a stream the gateway could not finish."""
        self.ended = True
        return self._event("error", code=code, message=message, param=None)

    def finish(self) -> list[dict[str, Any]]:
        """The engine's stream ended: close the open item and say how the response ended."""
        if self.ended:
            return []
        self.ended = True
        out = self._close()
        response = self._response()
        response["output"] = list(self.output)
        if self.finish_reason is None:
            response["status"] = "failed"
            response["error"] = {
                "code": "server_error",
                "message": "the model's engine ended the stream early",
            }
            return [*out, self._event("response.failed", response=response)]
        response = _finish(response, self.finish_reason, self.usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=response)]
