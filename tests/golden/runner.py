"""Golden files for the protocol translators: where they live, how a case runs.

Each file `tests/golden/<protocol>/<name>.json` (ollama, anthropic, openai) is one case:

    {"translator": "chat_request", "kwargs": {...}, "input": ..., "expected": ...,
     "live": true, "note": "..."}

`input` is a client request (request translators) or what the real engine returned
(response translators: a JSON body, or a stream's SSE payloads in order, "[DONE]"
included), captured by tests/golden/capture.py from llama-server serving the tiny
test model (or Gemma 3 270M where noted). `expected` is what the translator must
produce. The tests compare; with BLAZAR_UPDATE_GOLDEN=1 they rewrite `expected`
from the current translators instead (review the diff before committing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, anthropic, ollama
from blazar.protocols.openai_completions import ReplyStream, reshape_body
from blazar.protocols.openai_requests import Reply, Shaping, shape_request
from blazar.protocols.openai_responses import responses_request
from blazar.protocols.openai_responses_stream import ResponseStream, response_object
from blazar.protocols.sse import encode

GOLDEN = Path(__file__).parent
UPDATE = os.environ.get("BLAZAR_UPDATE_GOLDEN") == "1"


def request_dict(result: EngineRequest | LoadOnly) -> dict[str, Any]:
    if isinstance(result, LoadOnly):
        return {"load_only": result.endpoint}
    return result.to_dict()


def _ollama(translator: str, case: dict[str, Any]) -> Any:
    kwargs, data = case.get("kwargs", {}), case["input"]
    if translator.endswith("_request"):
        return request_dict(getattr(ollama, translator)(data, **kwargs))
    if translator in ("chat_stream", "generate_stream"):
        state = ollama.StreamState(**kwargs)
        feed = ollama.chat_chunks if translator == "chat_stream" else ollama.generate_chunks
        out = [obj for chunk in data for obj in feed(chunk, state)]
        return out + ollama.finish_stream(state)
    if translator == "load_response":
        load = LoadOnly(data["endpoint"])
        return ollama.load_response(load, **kwargs)
    if translator in ("tags", "ps", "show"):
        model = ollama.ModelInfo.from_record(data["model"])
        if translator == "tags":
            return ollama.tags([model])
        if translator == "ps":
            return ollama.ps([ollama.RunningModel(model, **kwargs)])
        return ollama.show(model, **kwargs)
    return getattr(ollama, translator)(data, **kwargs)


def _anthropic(translator: str, case: dict[str, Any]) -> Any:
    kwargs, data = case.get("kwargs", {}), case["input"]
    if translator.endswith("_request"):
        return request_dict(getattr(anthropic, translator)(data, **kwargs))
    if translator == "stream":
        state = anthropic.StreamState(**kwargs)
        out = [e for event in data for e in anthropic.stream_events(event, state)]
        return out + anthropic.finish_stream(state)
    return getattr(anthropic, translator)(data, **kwargs)


def shaping_dict(shaping: Shaping) -> dict[str, Any]:
    out: dict[str, Any] = {"needs": list(shaping.needs), "body": shaping.body}
    reply = shaping.reply
    out["reply"] = None if reply is None else {**reply.__dict__, "echo": list(reply.echo)}
    return out


def _reply(kwargs: dict[str, Any]) -> Reply:
    return Reply(**{**kwargs, "echo": tuple(kwargs.get("echo", ()))})


def _openai(translator: str, case: dict[str, Any]) -> Any:
    """OpenAI's pass-through checks and reshaping, and the Responses translator.

    Streams are lists of SSE payloads (dicts and "[DONE]") in and out."""
    kwargs, data = case.get("kwargs", {}), case["input"]
    if translator == "shape_request":
        return shaping_dict(shape_request(data["path"], data["body"]))
    if translator == "responses_request":
        req = responses_request(data)
        return {"engine": req.engine.to_dict(), "needs": list(req.needs), "echo": req.echo}
    if translator == "reshape_body":
        return json.loads(reshape_body(json.dumps(data).encode(), _reply(kwargs)))
    if translator == "reply_stream":
        stream = ReplyStream(_reply(kwargs))
        raw = b"".join(encode(event) for event in data)
        out = stream.feed(raw) + stream.close()
        return [
            json.loads(line[6:]) if line != b"data: [DONE]" else "[DONE]"
            for line in out.split(b"\n\n")
            if line
        ]
    if translator == "response_object":
        return response_object(data, **kwargs)
    if translator == "response_stream":
        state = ResponseStream(**kwargs)
        return [*state.start(), *(e for chunk in data for e in state.feed(chunk)), *state.finish()]
    raise KeyError(translator)


def run(protocol: str, case: dict[str, Any]) -> Any:
    """What the translator named by the case produces for its input."""
    try:
        if protocol == "ollama":
            return _ollama(case["translator"], case)
        if protocol == "openai":
            return _openai(case["translator"], case)
        return _anthropic(case["translator"], case)
    except ProtocolError as exc:
        return {"protocol_error": {"status": exc.status, "message": exc.message}}


def names(protocol: str) -> list[str]:
    return sorted(p.stem for p in (GOLDEN / protocol).glob("*.json"))


def load(protocol: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / protocol / f"{name}.json").read_text())
    return data


def save(protocol: str, name: str, case: dict[str, Any]) -> None:
    path = GOLDEN / protocol / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")


def check(protocol: str, name: str) -> tuple[Any, Any]:
    """(expected, actual) for one golden; rewrites `expected` first under UPDATE."""
    case = load(protocol, name)
    actual = json.loads(json.dumps(run(protocol, case)))
    if UPDATE and case.get("expected") != actual:
        case["expected"] = actual
        save(protocol, name, case)
    return case.get("expected"), actual
