"""ollama responses built from llama-server responses: whole, or one stream chunk at a time.

Part of the ollama adapter (`blazar.protocols.ollama` re-exports all of it). The
gateway passes what the engine returned for a request that `ollama.chat_request`
or `generate_request` built, plus what only it knows: the model name the client
used, the time (`created_at`, RFC 3339) and durations in nanoseconds
(`total_duration`, `load_duration`).

Streams: the gateway makes one `StreamState` per request, feeds every decoded SSE
event's JSON to `chat_chunks` / `generate_chunks` and writes each object they
return as one NDJSON line (`ndjson`); at `data: [DONE]` or end of stream it calls
`finish_stream`. It may update `state.created_at` and `state.total_duration` before
each feed; the final object reads them when it is built.

Where the statistics come from (observed with xllamacpp 2026.10.11549):
`/v1/chat/completions` puts `timings` (prompt_n, prompt_ms, predicted_n,
predicted_ms, cache_n) and `usage` at the top level of a whole response. A stream
carries `timings` on the chunk with `finish_reason`, or, when
`stream_options.include_usage` is set (the translators always set it), on the
extra last chunk with `usage` and empty `choices`, and not on the finish chunk.
`/completion` and `/infill` put `timings`, `tokens_evaluated` and `stop_type` on
their last (`stop: true`) chunk. `timings.prompt_n` excludes prompt tokens reused
from the cache, so prompt_eval_count is the whole prompt (`usage.prompt_tokens`,
or `prompt_n + cache_n`), which is what ollama documents.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols import LoadOnly
from blazar.protocols.sse import DONE

__all__ = [
    "StreamState",
    "chat_chunks",
    "chat_response",
    "embed_response",
    "embeddings_response",
    "error",
    "error_from_engine",
    "finish_stream",
    "generate_chunks",
    "generate_response",
    "load_response",
    "ndjson",
]


def error(message: str) -> dict[str, Any]:
    """ollama's error body."""
    return {"error": message}


def error_from_engine(status: int, body: Any) -> tuple[int, dict[str, Any]]:
    """An engine error response (OpenAI shape or text) -> (status, ollama error body)."""
    message = body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message", inner) if isinstance(inner, Mapping) else inner
    return status, error(str(message))


def ndjson(obj: Mapping[str, Any]) -> bytes:
    """One object as an NDJSON line, as ollama streams them."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _ns(ms: Any) -> int:
    return round(float(ms) * 1_000_000) if isinstance(ms, int | float) else 0


def _done_reason(finish_reason: Any) -> str:
    # ollama reports "length" for the token limit and "stop" for every other ending
    # (a tool call included).
    return "length" if finish_reason in ("length", "limit") else "stop"


def _stats(
    timings: Mapping[str, Any] | None,
    *,
    prompt_tokens: Any,
    eval_tokens: Any,
    total_duration: int,
    load_duration: int,
) -> dict[str, Any]:
    t = timings or {}
    if not isinstance(prompt_tokens, int):
        prompt_tokens = int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0))
    if not isinstance(eval_tokens, int):
        eval_tokens = int(t.get("predicted_n", 0))
    prompt_ns, eval_ns = _ns(t.get("prompt_ms")), _ns(t.get("predicted_ms"))
    return {
        # The gateway's clock; never less than the parts the engine measured.
        "total_duration": max(total_duration, load_duration + prompt_ns + eval_ns),
        "load_duration": load_duration,
        "prompt_eval_count": prompt_tokens,
        "prompt_eval_duration": prompt_ns,
        "eval_count": eval_tokens,
        "eval_duration": eval_ns,
    }


def _tool_calls(calls: list[tuple[str, str, str]]) -> tuple[list[dict[str, Any]], str]:
    """OpenAI tool calls (id, name, JSON arguments) -> ollama's, and text for unparsable ones.

    ollama's arguments are an object; a call whose arguments are not a JSON object
    (cut off by the token limit, say) stays in the content as text, as ollama does
    with tool-call text it cannot parse.
    """
    out: list[dict[str, Any]] = []
    leftover = ""
    for call_id, name, arguments in calls:
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            leftover += json.dumps({"name": name}).removesuffix("}") + f', "arguments": {arguments}'
            continue
        function = {"index": len(out), "name": name, "arguments": parsed}
        out.append({"id": call_id, "function": function})
    return out, leftover


def _engine_calls(message: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append((call.get("id", ""), function.get("name", ""), function.get("arguments", "")))
    return calls


def _message(content: str, thinking: Any = None, calls: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def chat_response(
    engine: Mapping[str, Any],
    *,
    model: str,
    created_at: str,
    total_duration: int = 0,
    load_duration: int = 0,
) -> dict[str, Any]:
    """A whole `/v1/chat/completions` response -> ollama's `/api/chat` response."""
    choice = engine["choices"][0]
    message = choice.get("message") or {}
    calls, leftover = _tool_calls(_engine_calls(message))
    content = (message.get("content") or "") + leftover
    usage = engine.get("usage") or {}
    return {
        "model": model,
        "created_at": created_at,
        "message": _message(content, message.get("reasoning_content"), calls),
        "done_reason": _done_reason(choice.get("finish_reason")),
        "done": True,
        **_stats(
            engine.get("timings"),
            prompt_tokens=usage.get("prompt_tokens"),
            eval_tokens=usage.get("completion_tokens"),
            total_duration=total_duration,
            load_duration=load_duration,
        ),
    }


def generate_response(
    engine: Mapping[str, Any],
    *,
    model: str,
    created_at: str,
    total_duration: int = 0,
    load_duration: int = 0,
) -> dict[str, Any]:
    """A whole engine response (chat, or native `/completion`/`/infill`) -> `/api/generate`'s."""
    if "choices" in engine:
        chat = chat_response(
            engine,
            model=model,
            created_at=created_at,
            total_duration=total_duration,
            load_duration=load_duration,
        )
        message = chat.pop("message")
        out = {"model": model, "created_at": created_at, "response": message["content"]}
        if message.get("thinking"):
            out["thinking"] = message["thinking"]
        return {**out, **{k: v for k, v in chat.items() if k not in out}}
    return {
        "model": model,
        "created_at": created_at,
        "response": engine.get("content", ""),
        "done": True,
        "done_reason": _done_reason(engine.get("stop_type")),
        **_stats(
            engine.get("timings"),
            prompt_tokens=engine.get("tokens_evaluated"),
            eval_tokens=engine.get("tokens_predicted"),
            total_duration=total_duration,
            load_duration=load_duration,
        ),
    }


@dataclass
class StreamState:
    """What a stream translation remembers between chunks (one per request)."""

    model: str
    created_at: str
    endpoint: str = "chat"  # "chat" | "generate"
    total_duration: int = 0
    load_duration: int = 0
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, args]
    done: bool = False


def _piece(
    state: StreamState, text: str, thinking: Any = None, calls: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"model": state.model, "created_at": state.created_at}
    if state.endpoint == "chat":
        out["message"] = _message(text, thinking, calls)
    else:
        out["response"] = text
        if thinking:
            out["thinking"] = thinking
    out["done"] = False
    return out


def _final(
    state: StreamState, prompt_tokens: Any = None, eval_tokens: Any = None
) -> dict[str, Any]:
    state.done = True
    usage = state.usage or {}
    out: dict[str, Any] = {"model": state.model, "created_at": state.created_at}
    if state.endpoint == "chat":
        out["message"] = _message("")
    else:
        out["response"] = ""
    out["done_reason"] = _done_reason(state.finish_reason)
    out["done"] = True
    out.update(
        _stats(
            state.timings,
            prompt_tokens=usage.get("prompt_tokens", prompt_tokens),
            eval_tokens=usage.get("completion_tokens", eval_tokens),
            total_duration=state.total_duration,
            load_duration=state.load_duration,
        )
    )
    return out


def _flush_calls(state: StreamState) -> list[dict[str, Any]]:
    if not state.calls:
        return []
    pending = [state.calls[i] for i in sorted(state.calls)]
    calls, leftover = _tool_calls([(c[0], c[1], c[2]) for c in pending])
    state.calls = {}
    return [_piece(state, leftover, calls=calls)]


def _openai_chunk(chunk: Mapping[str, Any], state: StreamState) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        text, thinking = delta.get("content") or "", delta.get("reasoning_content")
        if text or thinking:
            out.append(_piece(state, text, thinking))
        for call in delta.get("tool_calls") or []:
            slot = state.calls.setdefault(int(call.get("index", 0)), ["", "", ""])
            function = call.get("function") or {}
            slot[0] = call.get("id") or slot[0]
            slot[1] = function.get("name") or slot[1]
            slot[2] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]
            out += _flush_calls(state)
    if chunk.get("timings"):
        state.timings = dict(chunk["timings"])
    if chunk.get("usage"):
        state.usage = dict(chunk["usage"])
        if state.finish_reason is not None:
            out.append(_final(state))
    return out


def _native_chunk(chunk: Mapping[str, Any], state: StreamState) -> list[dict[str, Any]]:
    out = [_piece(state, chunk["content"])] if chunk.get("content") else []
    if chunk.get("stop"):
        state.finish_reason = chunk.get("stop_type")
        state.timings = chunk.get("timings")
        final = _final(state, chunk.get("tokens_evaluated"), chunk.get("tokens_predicted"))
        out.append(final)
    return out


def _feed(chunk: Any, state: StreamState) -> list[dict[str, Any]]:
    if chunk is None or chunk == DONE:
        return finish_stream(state)
    if state.done:
        return []
    if not isinstance(chunk, Mapping):
        return []
    if "error" in chunk:
        state.done = True
        return [error_from_engine(500, chunk)[1]]
    if "choices" in chunk:
        return _openai_chunk(chunk, state)
    return _native_chunk(chunk, state)


def chat_chunks(chunk: Any, state: StreamState) -> list[dict[str, Any]]:
    """One `/v1/chat/completions` stream chunk (or DONE) -> the `/api/chat` objects it yields."""
    return _feed(chunk, state)


def generate_chunks(chunk: Any, state: StreamState) -> list[dict[str, Any]]:
    """One engine stream chunk (chat, `/completion` or `/infill`) -> `/api/generate` objects."""
    return _feed(chunk, state)


def finish_stream(state: StreamState) -> list[dict[str, Any]]:
    """End of the engine's stream: the final `done: true` object, unless already sent."""
    if state.done:
        return []
    return [*_flush_calls(state), _final(state)]


def _normalize(vector: list[float], dimensions: int | None) -> list[float]:
    if dimensions is None or dimensions >= len(vector):
        return vector
    cut = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in cut))
    return [x / norm for x in cut] if norm else cut


def embed_response(
    engine: Mapping[str, Any],
    *,
    model: str,
    total_duration: int = 0,
    load_duration: int = 0,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """A `/v1/embeddings` response -> `/api/embed`'s (`dimensions` from the request's hints)."""
    data = sorted(engine.get("data") or [], key=lambda d: d.get("index", 0))
    usage = engine.get("usage") or {}
    return {
        "model": model,
        "embeddings": [_normalize(list(d["embedding"]), dimensions) for d in data],
        "total_duration": max(total_duration, load_duration),
        "load_duration": load_duration,
        "prompt_eval_count": usage.get("prompt_tokens", 0),
    }


def embeddings_response(engine: Mapping[str, Any]) -> dict[str, Any]:
    """A `/v1/embeddings` response -> the legacy `/api/embeddings` one."""
    data = engine.get("data") or []
    return {"embedding": list(data[0]["embedding"]) if data else []}


def load_response(
    load: LoadOnly, *, model: str, created_at: str, unloaded: bool = False
) -> dict[str, Any]:
    """What ollama answers to a request with nothing to generate, after load or unload."""
    reason = "unload" if unloaded else "load"
    if load.endpoint == "embed":
        return {"model": model, "embeddings": []}
    if load.endpoint == "embeddings":
        return {"embedding": []}
    if load.endpoint == "chat":
        return {
            "model": model,
            "created_at": created_at,
            "message": _message(""),
            "done_reason": reason,
            "done": True,
        }
    return {
        "model": model,
        "created_at": created_at,
        "response": "",
        "done": True,
        "done_reason": reason,
    }
