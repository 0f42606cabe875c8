"""ollama's `/api/*` requests, translated into llama-server requests.

The gateway calls these with the decoded JSON body of an ollama request and sends
the `EngineRequest` they return to the model's llama-server child; it answers
`LoadOnly` itself (load or unload, nothing to generate) and turns a
`ProtocolError` into `error(message)` with its status. The response side (whole
responses, stream chunks, statistics) lives in `ollama_stream`, the model
listings (`tags`, `ps`, `show`, `version`) in `ollama_models`; both are re-exported
here, so `blazar.protocols.ollama` is the whole adapter.

Where each request goes:

- `/api/chat` -> `/v1/chat/completions` (the model's chat template applies there).
- `/api/generate` -> `/v1/chat/completions` with system + user messages; with
  `raw: true` -> native `/completion` (the prompt verbatim); with `suffix` ->
  native `/infill` (fill-in-the-middle); with `context` (the token ids an earlier
  answer returned) -> native `/completion` with those tokens and then the new
  messages rendered by the template. `hints["messages"]` carries the messages of a
  templated generate, so the gateway can render them (`/apply-template`) and
  return the conversation's tokens as `context`, as ollama does.
- `/api/embed` and `/api/embeddings` -> `/v1/embeddings`.

`keep_alive` is not forwarded: the gateway's scheduler owns it (see
`keep_alive_seconds`). `needs(body)` names the template capabilities a request
needs (`tools`, `thinking`); the gateway refuses the request, in ollama's words
(`"<model>" does not support tools`), when the model lacks them. Field-by-field
status: docs/compatibility.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from blazar.protocols import EngineRequest, ImageRef, LoadOnly
from blazar.protocols.ollama_models import (
    ModelInfo,
    RunningModel,
    parameter_size,
    ps,
    remote_tag,
    show,
    tags,
    version,
)
from blazar.protocols.ollama_options import (
    bad,
    format_fields,
    keep_alive_seconds,
    model_name,
    sampling_fields,
    think_fields,
)
from blazar.protocols.ollama_stream import (
    StreamState,
    chat_chunks,
    chat_response,
    embed_response,
    embeddings_response,
    error,
    error_from_engine,
    finish_stream,
    generate_chunks,
    generate_response,
    load_response,
    ndjson,
)

__all__ = [
    "ModelInfo",
    "RunningModel",
    "StreamState",
    "chat_chunks",
    "chat_request",
    "chat_response",
    "embed_request",
    "embed_response",
    "embeddings_request",
    "embeddings_response",
    "error",
    "error_from_engine",
    "finish_stream",
    "generate_chunks",
    "generate_request",
    "generate_response",
    "image_refs",
    "keep_alive_seconds",
    "load_response",
    "ndjson",
    "needs",
    "parameter_size",
    "ps",
    "remote_tag",
    "show",
    "tags",
    "version",
]

_IMAGE_MAGIC = {
    "iVBORw0KGgo": "image/png",
    "/9j/": "image/jpeg",
    "R0lGOD": "image/gif",
    "UklGR": "image/webp",
    "Qk": "image/bmp",
}


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{key} must be true or false, got {value!r}")
    return value


def _text(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad(f"{key} must be a string")
    return value


def _images(images: Any, where: str, has_vision: bool) -> list[dict[str, Any]]:
    if not images:
        return []
    if not has_vision:
        raise bad(
            f"{where}: this model has no vision projector, so it cannot read images. "
            "Use a vision model (a GGUF with its mmproj) or send text only."
        )
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise bad(f"{where} must be a list of base64-encoded images")
    return [{"type": "image_url", "image_url": {"url": _data_url(data)}} for data in images]


def image_refs(body: Mapping[str, Any]) -> list[ImageRef]:
    """The images of an `/api/chat` or `/api/generate` body (base64, as `data:` URLs), in
    the order the translated request carries them; checked by the gateway."""
    found: list[tuple[str, Any]] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, msg in enumerate(messages):
            images = msg.get("images") if isinstance(msg, Mapping) else None
            found += [(f"messages[{i}].images[{k}]", d) for k, d in enumerate(images or [])]
    elif isinstance(body.get("images"), list):
        found = [(f"images[{k}]", d) for k, d in enumerate(body["images"])]
    return [ImageRef(where, _data_url(data)) for where, data in found if isinstance(data, str)]


def _data_url(data: str) -> str:
    mime = next((m for magic, m in _IMAGE_MAGIC.items() if data.startswith(magic)), None)
    return f"data:{mime or 'image/jpeg'};base64,{data}"


def _content(text: str, images: Any, where: str, has_vision: bool) -> str | list[dict[str, Any]]:
    parts = _images(images, where, has_vision)
    if not parts:
        return text
    return [{"type": "text", "text": text}, *parts] if text else parts


def _tool_calls(calls: Any, where: str, index: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad(f"{where}.tool_calls[{j}] needs function.name")
        arguments = function.get("arguments") or {}
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = call.get("id") or f"call_{index}_{j}"
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return out


def _messages(messages: Any, *, has_vision: bool) -> list[dict[str, Any]]:
    """ollama messages -> OpenAI messages; tool results are matched to the calls they answer."""
    if not isinstance(messages, list):
        raise bad("messages must be a list")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, tool name) not answered yet
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise bad(f"{where} must be an object")
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where}.role must be system, user, assistant or tool; got {role!r}")
        text = _text(msg, "content")
        item: dict[str, Any] = {"role": role}
        item["content"] = _content(text, msg.get("images"), f"{where}.images", has_vision)
        if role == "assistant":
            if msg.get("thinking"):
                item["reasoning_content"] = _text(msg, "thinking")
            if msg.get("tool_calls"):
                item["tool_calls"] = _tool_calls(msg["tool_calls"], where, i)
                pending = [(c["id"], c["function"]["name"]) for c in item["tool_calls"]]
        elif role == "tool":
            name = msg.get("tool_name") or msg.get("name")
            call_id = msg.get("tool_call_id")
            if not call_id and pending:
                match = next((p for p in pending if p[1] == name), pending[0])
                call_id = match[0]
                name = name or match[1]
            pending = [p for p in pending if p[0] != call_id]
            if call_id:
                item["tool_call_id"] = call_id
            if name:
                item["name"] = name
        out.append(item)
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"tools[{i}].function.name is required")
        out.append({"type": "function", "function": dict(function)})
    return out


def needs(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The template capabilities a chat or generate request needs: tools, thinking."""
    found = []
    if body.get("tools"):
        found.append("tools")
    if body.get("think") not in (None, False):
        found.append("thinking")
    return tuple(found)


MAX_TOKEN_ID = 2**31 - 1


def _context(value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value
    ):
        raise bad("context must be the list of token ids an earlier /api/generate returned")
    return value


def _refuse_logprobs(body: Mapping[str, Any]) -> None:
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad("logprobs are not supported by Blazar's ollama API yet; use /v1/chat/completions")


def _stream(body: Mapping[str, Any], out: dict[str, Any], *, chat: bool) -> bool:
    stream = _flag(body, "stream", True)  # ollama streams unless told not to
    out["stream"] = stream
    if stream and chat:  # the usage chunk carries the total prompt tokens and timings
        out["stream_options"] = {"include_usage": True}
    return stream


def chat_request(
    body: Mapping[str, Any], *, model_ctx: int, has_vision: bool = False
) -> EngineRequest | LoadOnly:
    """An ollama `/api/chat` request -> llama-server `/v1/chat/completions`.

    No messages means "load the model" (LoadOnly). `model_ctx` is the context size
    the model's instance runs with; `has_vision` whether it has a vision projector.
    """
    model_name(body)
    messages = body.get("messages")
    if not messages:
        return LoadOnly("chat")
    _refuse_logprobs(body)
    out: dict[str, Any] = {"messages": _messages(messages, has_vision=has_vision)}
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    out.update(sampling_fields(body, model_ctx=model_ctx, limit_key="max_tokens"))
    out.update(format_fields(body, native=False))
    out.update(think_fields(body))
    stream = _stream(body, out, chat=True)
    return EngineRequest("/v1/chat/completions", out, stream)


def generate_request(
    body: Mapping[str, Any], *, model_ctx: int, has_vision: bool = False, has_infill: bool = True
) -> EngineRequest | LoadOnly:
    """An ollama `/api/generate` request -> llama-server.

    Plain prompts go through the chat template (`/v1/chat/completions`, system then
    user message); `raw: true` sends the prompt verbatim to `/completion`; `suffix`
    asks `/infill` to fill in the middle (`has_infill`: the model has FIM tokens). With
    `context`, the tokens of the conversation so far, the request goes to `/completion`
    without its `prompt`: the gateway sets it to those tokens followed by the rendered
    messages (`hints`: `context`, `messages`). An empty prompt means "load the model"
    (LoadOnly).
    """
    model_name(body)
    prompt, system, suffix = _text(body, "prompt"), _text(body, "system"), _text(body, "suffix")
    raw = _flag(body, "raw", False)
    if _text(body, "template"):
        raise bad(
            "template: per-request templates are not supported; the model's chat "
            "template applies. Send a fully formatted prompt with raw: true instead."
        )
    context = _context(body.get("context"))
    _refuse_logprobs(body)
    if not prompt and not suffix and not system and not body.get("images"):
        return LoadOnly("generate")
    if context and (suffix or raw or body.get("think") or body.get("images")):
        what = "suffix" if suffix else "raw" if raw else "think" if body.get("think") else "images"
        raise bad(
            f"context cannot be used with {what}; send the whole conversation as messages "
            "to /api/chat instead"
        )
    if suffix or raw:
        for key in ("system", "images", "think"):
            if body.get(key):
                mode = "suffix (fill-in-the-middle)" if suffix else "raw mode"
                raise bad(f"{key} cannot be used with {mode}: no chat template is applied")
        if suffix and not has_infill:
            raise bad(
                "suffix: this model has no fill-in-the-middle tokens, so it cannot "
                "complete between a prefix and a suffix; use a code model with FIM"
            )
        out: dict[str, Any] = (
            {"input_prefix": prompt, "input_suffix": suffix, "prompt": ""}
            if suffix
            else {"prompt": prompt}
        )
        out.update(sampling_fields(body, model_ctx=model_ctx, limit_key="n_predict"))
        out.update(format_fields(body, native=True))
        stream = _stream(body, out, chat=False)
        return EngineRequest("/infill" if suffix else "/completion", out, stream)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    user = _content(prompt, body.get("images"), "images", has_vision)
    messages.append({"role": "user", "content": user})
    if context:
        native: dict[str, Any] = sampling_fields(body, model_ctx=model_ctx, limit_key="n_predict")
        native.update(format_fields(body, native=True))
        stream = _stream(body, native, chat=False)
        hints = {"context": context, "messages": messages}
        return EngineRequest("/completion", native, stream, hints)
    out = {"messages": messages}
    out.update(sampling_fields(body, model_ctx=model_ctx, limit_key="max_tokens"))
    out.update(format_fields(body, native=False))
    out.update(think_fields(body))
    stream = _stream(body, out, chat=True)
    return EngineRequest("/v1/chat/completions", out, stream, {"messages": messages})


def embed_request(body: Mapping[str, Any], *, model_ctx: int) -> EngineRequest | LoadOnly:
    """An ollama `/api/embed` request (`input`: a string or a list) -> `/v1/embeddings`.

    The instance must run with `--embeddings`. `dimensions` is applied to the
    response (truncate, then re-normalize, as ollama does): it travels in `hints`.
    """
    model_name(body)
    value = body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if inputs is None or inputs == []:
        return LoadOnly("embed")
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise bad("input must be a string or a list of strings")
    _flag(body, "truncate", True)
    sampling_fields(body, model_ctx=model_ctx, limit_key="max_tokens")  # validated; none apply
    hints: dict[str, Any] = {}
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise bad(f"dimensions must be a positive integer, got {dimensions!r}")
        hints["dimensions"] = dimensions
    out = {"input": inputs, "encoding_format": "float"}
    return EngineRequest("/v1/embeddings", out, False, hints)


def embeddings_request(body: Mapping[str, Any], *, model_ctx: int) -> EngineRequest | LoadOnly:
    """The legacy `/api/embeddings` request (`prompt`) -> `/v1/embeddings`, not normalized.

    ollama's legacy endpoint returns the raw pooled vector; `embd_normalize: -1`
    asks llama-server for the same.
    """
    model_name(body)
    prompt = _text(body, "prompt")
    if not prompt:
        return LoadOnly("embeddings")
    sampling_fields(body, model_ctx=model_ctx, limit_key="max_tokens")
    out = {"input": prompt, "encoding_format": "float", "embd_normalize": -1}
    return EngineRequest("/v1/embeddings", out, False)
