"""OpenAI's Responses API (`POST /v1/responses`) translated onto `/v1/chat/completions`.

llama-server has a native `/v1/responses`, but what it streams breaks the
official SDK (no `output_index`, `content_index` or `sequence_number`, a
`response.created` with only id/object/status, so `client.responses.stream()`
raises), and a response cut at `max_output_tokens` says `completed`. Its chat
endpoint says why a generation ended (`finish_reason`), constrains output with
`response_format`, and parses tool calls, so the gateway translates instead
(`blazar.serve.routes.responses_api`):

- `responses_request(body)` validates a request as OpenAI's API does (an unknown
  field is a 400 naming it) and builds the chat request: `input` (a string, or
  message, `function_call`, `function_call_output` and `reasoning` items) and
  `instructions` as messages, `max_output_tokens`, `temperature`, `top_p`,
  function `tools`, `tool_choice` (`auto`, `none`), `parallel_tool_calls`,
  `text.format` as `response_format`, `reasoning.effort` as the template's
  thinking switch; `previous_response_id` is the gateway's (it puts the stored
  conversation before `input`, `input_items` lists what a response was asked).
  What Blazar cannot do is refused with the reason: server-side conversations
  (`conversation`), `background`, hosted tools,
  forcing a tool call, files and audio, `top_logprobs`. A user message's
  `input_image` parts become the chat's `image_url` parts (the gateway fetches and
  checks them as it does for chat, `blazar.serve.request.images`).
- `openai_responses_stream` builds the Response object from the engine's answer,
  whole or as the Responses event sequence.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blazar.protocols import EngineRequest, ProtocolError

__all__ = ["ResponsesRequest", "check_metadata", "input_items", "obj", "responses_request"]

ACCEPTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "stream",
        "stream_options",
        "store",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "truncation",
        "include",
        "top_logprobs",
        "max_tool_calls",
        "previous_response_id",
    }
)
REFUSED = {
    "conversation": "Blazar does not store conversations; send the whole conversation as input",
    "background": "background responses need stored state, which Blazar does not keep",
    "prompt": "stored prompt templates live on OpenAI's servers; send instructions and input",
}
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")


def obj(value: Any) -> Mapping[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


@dataclass(frozen=True)
class ResponsesRequest:
    """The chat request to send, the capabilities it needs, and what the response echoes."""

    engine: EngineRequest
    needs: tuple[str, ...]
    echo: dict[str, Any]  # request fields the Response object repeats


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}: expected a string or a list of content parts")
    return "".join(_part_text(part, f"{where}[{j}]") for j, part in enumerate(content))


def _part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind == "input_image":
        raise _bad(f"{where}: input_image parts are taken in user messages only")
    if kind in MEDIA_PARTS:
        raise _bad(
            f"{where}: {kind} is not supported on /v1/responses: Blazar loads vision "
            "projectors only; send text and images (input_image parts)"
        )
    if kind not in TEXT_PARTS or not isinstance(part.get(_key(kind)), str):
        raise _bad(f"{where}: expected an input_text part with a string `text`")
    text: str = part[_key(kind)]
    return text


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or, when it holds `input_image` parts, the
    chat's content parts (`text` and `image_url`, in order)."""
    if not isinstance(content, list) or not any(
        isinstance(p, Mapping) and p.get("type") == "input_image" for p in content
    ):
        return _text(content, where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if not (isinstance(part, Mapping) and part.get("type") == "input_image"):
            parts.append({"type": "text", "text": _part_text(part, f"{where}[{j}]")})
            continue
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _bad(
                f"{where}[{j}].image_url: Field required (an http(s) or data: URL; "
                "file_id images need OpenAI's Files API, which Blazar does not have)"
            )
        image = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        parts.append({"type": "image_url", "image_url": image})
    return parts


def _key(kind: str) -> str:
    return "refusal" if kind == "refusal" else "text"


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        out.append({"role": "system", "content": _text(instructions, "instructions")})
    items = body.get("input")
    if items is None:
        raise _bad("input: Field required (a string or a list of input items)")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _bad("input: expected a string or a list of input items")
    reasoning: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(f"{where}: expected an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{where}.role: expected user, assistant, system or developer")
            read = _user_content if role == "user" else _text
            message: dict[str, Any] = {
                "role": "system" if role == "developer" else role,
                "content": read(item.get("content"), f"{where}.content"),
            }
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            out.append(message)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _bad(f"{where}.{key}: Field required (a string)")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant" and reasoning is None:
                last["tool_calls"] = [call]
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                out.append(message)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"{where}.call_id: Field required (a string)")
            output = _text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            parts = [*(item.get("content") or []), *(item.get("summary") or [])]
            texts = [p.get("text") for p in parts if isinstance(p, Mapping)]
            reasoning = "".join(t for t in texts if isinstance(t, str))
        else:
            raise _bad(
                f"{where}.type: '{kind}' items are not supported; send message, "
                "function_call, function_call_output or reasoning items"
            )
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools: expected a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise _bad(
                f"tools[{i}]: '{kind}' tools run on OpenAI's servers; only function tools "
                "(type, name, description, parameters) are supported"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{i}].name: Field required")
        function = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> None:
    if choice is None or choice in ("auto", "none"):
        return
    raise _bad(
        f"tool_choice {json.dumps(choice)}: this engine cannot force a tool call with "
        "this model's chat template; send tool_choice 'auto' (or leave it out)"
    )


def _format(text: Any) -> dict[str, Any]:
    if text is None:
        return {}
    if not isinstance(text, Mapping):
        raise _bad("text: expected an object")
    if text.get("verbosity") not in (None, "medium"):
        raise _bad("text.verbosity: only 'medium' is supported (the model's own)")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if fmt is None or kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if (
        kind == "json_schema"
        and isinstance(fmt, Mapping)
        and isinstance(fmt.get("schema"), Mapping)
    ):
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise _bad(
        "text.format: expected {type: text}, {type: json_object} or {type: json_schema, schema}"
    )


def _reasoning(reasoning: Any) -> tuple[dict[str, Any], bool]:
    """The template's thinking switch for `reasoning`, and whether it needs one."""
    if reasoning is None:
        return {}, False
    if not isinstance(reasoning, Mapping):
        raise _bad("reasoning: expected an object")
    effort = reasoning.get("effort")
    if effort is None:
        return {}, False
    if effort not in ("none", "minimal", "low", "medium", "high"):
        raise _bad("reasoning.effort: expected none, minimal, low, medium or high")
    if effort == "none":
        return {"chat_template_kwargs": {"enable_thinking": False}}, False
    return {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": effort}}, True


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(f"{key}: expected a number from {low:g} to {high:g}, got {value!r}")


def _check(body: Mapping[str, Any]) -> None:
    for key, why in REFUSED.items():
        if body.get(key) not in (None, False):
            raise _bad(f"{key}: not supported by Blazar ({why})")
    unknown = sorted(k for k in body if k not in ACCEPTED and k not in REFUSED)
    if unknown:
        raise _bad(f"Unrecognized request argument(s): {', '.join(unknown)}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _bad("model: Field required")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise _bad("previous_response_id: expected the id of a response (a string)")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad("max_output_tokens: expected an integer of at least 1")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    for key in ("stream", "store", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _bad(f"{key}: expected true or false")
    if body.get("truncation") not in (None, "disabled"):
        raise _bad("truncation: only 'disabled' is supported; shorten the input to fit")
    include = body.get("include") or []
    if not isinstance(include, list) or any(i != "reasoning.encrypted_content" for i in include):
        raise _bad(
            "include: only reasoning.encrypted_content is supported (reasoning is sent in clear)"
        )
    if body.get("top_logprobs"):
        raise _bad("top_logprobs: not supported on /v1/responses; use /v1/chat/completions")
    if body.get("max_tool_calls") is not None:
        raise _bad("max_tool_calls: not supported (no hosted tools run here)")
    if body.get("metadata") is not None:
        check_metadata(body["metadata"])


METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def check_metadata(metadata: Any) -> dict[str, str]:
    """A response's `metadata` as OpenAI bounds it: at most 16 keys of at most 64
    characters, each value a string of at most 512; a 400 naming what is wrong."""
    if not isinstance(metadata, Mapping):
        raise _bad("metadata: expected an object of strings")
    if len(metadata) > METADATA_KEYS:
        raise _bad(f"metadata: at most {METADATA_KEYS} keys, got {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            raise _bad(f"metadata: key {key[:20]!r}... is longer than {METADATA_KEY_CHARS} chars")
        if not isinstance(value, str):
            raise _bad(f"metadata.{key}: expected a string, got {type(value).__name__}")
        if len(value) > METADATA_VALUE_CHARS:
            raise _bad(f"metadata.{key}: longer than {METADATA_VALUE_CHARS} characters")
    return dict(metadata)


def responses_request(body: Mapping[str, Any]) -> ResponsesRequest:
    """Validate a `/v1/responses` request; the chat request to send for it."""
    _check(body)
    out: dict[str, Any] = {"messages": _messages(body)}
    needs: list[str] = []
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(key) is not None:
            out[key] = body[key]
    _tool_choice(body.get("tool_choice"))
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        if body.get("tool_choice") != "none":
            needs.append("tools")
        if body.get("tool_choice") is not None:
            out["tool_choice"] = body["tool_choice"]
    out.update(_format(body.get("text")))
    thinking, needs_thinking = _reasoning(body.get("reasoning"))
    out.update(thinking)
    if needs_thinking:
        needs.append("thinking")
    stream = bool(body.get("stream"))
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}
    engine = EngineRequest("/v1/chat/completions", out, stream)
    return ResponsesRequest(engine, tuple(needs), _echo(body))


def input_items(body: Mapping[str, Any], new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """A valid request's `input` as the items `GET /v1/responses/{id}/input_items` lists
    and a later `previous_response_id` continues: a string is one user message, a
    message's string content one text part, and each item has an id (`new_id(prefix)`)."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        kind = item.get("type", "message")
        made = {"type": kind, **item}
        if kind == "message" and isinstance(made.get("content"), str):
            part = "output_text" if made.get("role") == "assistant" else "input_text"
            made["content"] = [{"type": part, "text": made["content"]}]
        if not isinstance(made.get("id"), str):
            made["id"] = new_id(ITEM_PREFIX.get(kind, "item"))
        out.append(made)
    return out


ITEM_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def _echo(body: Mapping[str, Any]) -> dict[str, Any]:
    text, reasoning = obj(body.get("text")), obj(body.get("reasoning"))
    return {
        "store": body.get("store") is not False,  # kept for GET /v1/responses/{id} unless false
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": dict(body.get("metadata") or {}),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "top_p": body.get("top_p", 1.0),
        "user": body.get("user"),
    }
