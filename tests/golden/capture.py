"""Write the protocol golden files, capturing engine output from the real llama-server.

Run from the repository root (it takes about a minute, most of it retrying Gemma
until it emits a tool call):

    .venv/bin/python -m tests.golden.capture            # every case
    .venv/bin/python -m tests.golden.capture chat_stream  # only the cases named

Request cases are pure: the client request is the input, the translator's output
the expectation. Response cases send the translated request to a real engine and
save what it answered (the JSON body, or every SSE payload of a stream) as the
input. Engines: the tiny test model (`blazar.testing.tiny`, ChatML template, served
with --embeddings so one engine does chat and embeddings) and, for tool calls and
JSON-schema output, Gemma 3 270M from its PyPI package with a tools-aware ChatML
template (`engine.TOOLS_TEMPLATE`): the tiny model's word soup never calls a tool,
and this engine cannot build a grammar sampler over the tiny vocabulary.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from blazar.models.gguf import inspect_gguf
from blazar.protocols import EngineRequest, LoadOnly, anthropic, ollama
from blazar.protocols.openai_requests import shape_request
from blazar.protocols.openai_responses import responses_request
from blazar.testing.tiny import write_tiny_model
from tests.fixtures import ENGINE_VERSION, write_gemma
from tests.golden import runner
from tests.golden.engine import TOOLS_TEMPLATE, Engine, running_engine

WHEN = "2026-01-02T03:04:05.000000Z"
DURATIONS = {"total_duration": 123456789, "load_duration": 1000000}
STOP_WORDS = [" the", " a", " and", " of", " to", " in", " is", " it", " for", " on", " was"]
HI = [{"role": "user", "content": "hi"}]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}},
    "required": ["city"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["paris", "rome"]},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "sunny"],
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Get the weather in a city",
    "input_schema": WEATHER_PARAMS,
}
CTX = {"model_ctx": 1024}
IMAGE = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

# name -> (translator, kwargs, client request, live note)
OLLAMA_REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str | None]] = {
    "req_chat_basic": ("chat_request", CTX, {"model": "tiny", "messages": HI}, None),
    "req_chat_options": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "messages": HI,
            "stream": False,
            "keep_alive": "10m",
            "options": {
                "num_predict": 8,
                "num_ctx": 512,
                "temperature": 0.3,
                "top_k": 7,
                "top_p": 0.8,
                "min_p": 0.1,
                "typical_p": 0.9,
                "seed": 42,
                "stop": ["zzz"],
                "repeat_penalty": 1.2,
                "repeat_last_n": 33,
                "presence_penalty": 0.5,
                "frequency_penalty": 0.25,
                "mirostat": 0,
                "mirostat_tau": 5.0,
                "mirostat_eta": 0.1,
                "num_keep": 4,
                "num_thread": 2,
                "num_gpu": 0,
                "use_mmap": True,
                "tfs_z": 1.0,
                "penalize_newline": False,
            },
        },
        None,
    ),
    "req_chat_history": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "stream": False,
            "options": {"num_predict": 4},
            "messages": [
                {"role": "system", "content": "be brief"},
                *HI,
                {"role": "assistant", "content": "hello", "thinking": "greet back"},
                {"role": "user", "content": "how are you"},
            ],
        },
        None,
    ),
    "req_chat_tools": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "stream": False,
            "options": {"num_predict": 4},
            "tools": [WEATHER_TOOL],
            "messages": [
                {"role": "user", "content": "weather in paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "paris"}}}
                    ],
                },
                {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
            ],
        },
        None,
    ),
    "req_chat_format_json": (
        "chat_request",
        CTX,
        {"model": "tiny", "messages": HI, "stream": False, "format": "json"},
        "a grammar sampler cannot be built over the tiny vocabulary; Gemma checks it live",
    ),
    "req_chat_format_schema": (
        "chat_request",
        CTX,
        {"model": "tiny", "messages": HI, "stream": False, "format": CITY_SCHEMA},
        "a grammar sampler cannot be built over the tiny vocabulary; Gemma checks it live",
    ),
    "req_chat_think_true": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "messages": HI,
            "think": True,
            "stream": False,
            "options": {"num_predict": 3},
        },
        None,
    ),
    "req_chat_think_false": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "messages": HI,
            "think": False,
            "stream": False,
            "options": {"num_predict": 3},
        },
        None,
    ),
    "req_chat_think_level": (
        "chat_request",
        CTX,
        {
            "model": "tiny",
            "messages": HI,
            "think": "high",
            "stream": False,
            "options": {"num_predict": 3},
        },
        None,
    ),
    "req_chat_images_vision": (
        "chat_request",
        {**CTX, "has_vision": True},
        {
            "model": "llava",
            "stream": False,
            "messages": [{"role": "user", "content": "what is this?", "images": [IMAGE]}],
        },
        "the tiny model has no vision projector",
    ),
    "req_chat_load_only": (
        "chat_request",
        CTX,
        {"model": "tiny", "messages": [], "keep_alive": 0},
        None,
    ),
    "req_generate_basic": (
        "generate_request",
        CTX,
        {
            "model": "tiny",
            "prompt": "hi",
            "system": "be brief",
            "stream": False,
            "options": {"num_predict": 5},
        },
        None,
    ),
    "req_generate_stream": (
        "generate_request",
        CTX,
        {"model": "tiny", "prompt": "hi", "options": {"num_predict": 3}},
        None,
    ),
    "req_generate_raw": (
        "generate_request",
        CTX,
        {
            "model": "tiny",
            "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "raw": True,
            "stream": False,
            "options": {"num_predict": 5, "stop": ["zzz"]},
        },
        None,
    ),
    "req_generate_raw_format": (
        "generate_request",
        CTX,
        {
            "model": "tiny",
            "prompt": "a city:",
            "raw": True,
            "stream": False,
            "format": CITY_SCHEMA,
            "options": {"num_predict": 16},
        },
        None,
    ),
    "req_generate_suffix": (
        "generate_request",
        CTX,
        {
            "model": "coder",
            "prompt": "def add(a, b):\n",
            "suffix": "\n    return c\n",
            "stream": False,
            "options": {"temperature": 0},
        },
        "the tiny model has no fill-in-the-middle tokens (the engine answers 501)",
    ),
    "req_generate_unlimited": (
        "generate_request",
        CTX,
        {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": -1}},
        None,
    ),
    "req_generate_load_only": ("generate_request", CTX, {"model": "tiny"}, None),
    "req_generate_context": (
        "generate_request",
        CTX,
        {
            "model": "tiny",
            "prompt": "and then?",
            "context": [3, 346, 344, 4],
            "stream": False,
            "options": {"num_predict": 5},
        },
        "the gateway sets the prompt: the context tokens, then the rendered messages",
    ),
    "req_embed_list": (
        "embed_request",
        CTX,
        {"model": "tiny", "input": ["hello world", "the cat"], "dimensions": 8, "truncate": True},
        None,
    ),
    "req_embed_load_only": ("embed_request", CTX, {"model": "tiny", "input": []}, None),
    "req_embeddings_legacy": (
        "embeddings_request",
        CTX,
        {"model": "tiny", "prompt": "hello world"},
        None,
    ),
}

ANTHROPIC_REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str | None]] = {
    "req_basic": ("messages_request", {}, {"model": "tiny", "max_tokens": 8, "messages": HI}, None),
    "req_full": (
        "messages_request",
        {},
        {
            "model": "tiny",
            "max_tokens": 8,
            "stream": True,
            "system": [
                {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop_sequences": ["zzz"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "metadata": {"user_id": "u-1"},
            "service_tier": "auto",
        },
        None,
    ),
    "req_tools": (
        "messages_request",
        {},
        {
            "model": "tiny",
            "max_tokens": 8,
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": "weather in paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "let me look"},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "and tomorrow?"},
                    ],
                },
            ],
        },
        None,
    ),
    "req_thinking": (
        "messages_request",
        {},
        {
            "model": "tiny",
            "max_tokens": 8,
            "messages": HI,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        None,
    ),
    "req_count_tokens": (
        "count_tokens_request",
        {},
        {"model": "tiny", "messages": HI, "system": "be brief"},
        None,
    ),
}

Want = Callable[[Any], bool]


def _any(_: Any) -> bool:
    return True


def _finished_by_stop(out: Any) -> bool:
    chunks = out if isinstance(out, list) else [out]
    return any(
        c.get("choices") and c["choices"][0].get("finish_reason") == "stop"
        for c in chunks
        if isinstance(c, dict)
    )


def _has_tool_calls(out: Any) -> bool:
    return "tool_calls" in json.dumps(out)


def _whole_tool_call(out: Any) -> bool:
    """A tool call whose arguments are whole JSON (not cut by the token limit)."""
    chunks = out if isinstance(out, list) else [out]
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
            message = choice.get("message") or choice.get("delta") or {}
            for call in message.get("tool_calls") or []:
                index = call.get("index", 0)
                arguments[index] = arguments.get(index, "") + call["function"].get("arguments", "")
    try:
        return bool(arguments) and all(isinstance(json.loads(a), dict) for a in arguments.values())
    except ValueError:
        return False


def _anthropic_stop(out: Any) -> bool:
    return '"stop_sequence": "' in json.dumps(out)


def _tool_use_after_text(out: Any) -> bool:
    text = json.dumps(out)
    return '"tool_use"' in text and text.index('"text_delta"') < text.index('"tool_use"')


def _tool_use(out: Any) -> bool:
    return '"tool_use"' in json.dumps(out)


# name -> (engine, translator, request translator, client request, response kwargs, want)
OLLAMA_RESPONSES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any], Want]] = {
    "chat_response": (
        "tiny",
        "chat_response",
        "chat_request",
        {"model": "tiny", "messages": HI, "stream": False, "options": {"num_predict": 6}},
        {"model": "tiny", "created_at": WHEN, **DURATIONS},
        _any,
    ),
    "chat_stream": (
        "tiny",
        "chat_stream",
        "chat_request",
        {"model": "tiny", "messages": HI, "options": {"num_predict": 4}},
        {"model": "tiny", "created_at": WHEN, **DURATIONS},
        _any,
    ),
    "chat_stream_stop": (
        "tiny",
        "chat_stream",
        "chat_request",
        {"model": "tiny", "messages": HI, "options": {"num_predict": 40, "stop": STOP_WORDS}},
        {"model": "tiny", "created_at": WHEN, **DURATIONS},
        _finished_by_stop,
    ),
    "generate_response": (
        "tiny",
        "generate_response",
        "generate_request",
        {
            "model": "tiny",
            "prompt": "hi",
            "system": "be brief",
            "stream": False,
            "options": {"num_predict": 5},
        },
        {"model": "tiny", "created_at": WHEN, **DURATIONS},
        _any,
    ),
    "generate_stream": (
        "tiny",
        "generate_stream",
        "generate_request",
        {"model": "tiny", "prompt": "hi", "options": {"num_predict": 3}},
        {"model": "tiny", "created_at": WHEN, "endpoint": "generate", **DURATIONS},
        _any,
    ),
    "generate_raw_response": (
        "tiny",
        "generate_response",
        "generate_request",
        {
            "model": "tiny",
            "prompt": "hello",
            "raw": True,
            "stream": False,
            "options": {"num_predict": 4},
        },
        {"model": "tiny", "created_at": WHEN, **DURATIONS},
        _any,
    ),
    "generate_raw_stream": (
        "tiny",
        "generate_stream",
        "generate_request",
        {"model": "tiny", "prompt": "hello", "raw": True, "options": {"num_predict": 3}},
        {"model": "tiny", "created_at": WHEN, "endpoint": "generate", **DURATIONS},
        _any,
    ),
    "embed_response": (
        "tiny",
        "embed_response",
        "embed_request",
        {"model": "tiny", "input": ["hello world", "the cat"], "dimensions": 4},
        {"model": "tiny", **DURATIONS},
        _any,
    ),
    "embeddings_response": (
        "tiny",
        "embeddings_response",
        "embeddings_request",
        {"model": "tiny", "prompt": "hello world"},
        {},
        _any,
    ),
    "chat_tool_calls_response": (
        "gemma",
        "chat_response",
        "chat_request",
        {
            "model": "gemma3-270m",
            "stream": False,
            "tools": [WEATHER_TOOL],
            "messages": [{"role": "user", "content": "weather in paris?"}],
            "options": {"num_predict": 40},
        },
        {"model": "gemma3-270m", "created_at": WHEN, **DURATIONS},
        _has_tool_calls,
    ),
    "chat_tool_calls_stream": (
        "gemma",
        "chat_stream",
        "chat_request",
        {
            "model": "gemma3-270m",
            "tools": [WEATHER_TOOL],
            "messages": [{"role": "user", "content": "weather in paris?"}],
            "options": {"num_predict": 40},
        },
        {"model": "gemma3-270m", "created_at": WHEN, **DURATIONS},
        _has_tool_calls,
    ),
    "chat_format_schema_response": (
        "gemma",
        "chat_response",
        "chat_request",
        {
            "model": "gemma3-270m",
            "stream": False,
            "format": CITY_SCHEMA,
            "messages": [{"role": "user", "content": "Is it sunny in Paris? Answer in JSON."}],
            "options": {"num_predict": 40, "temperature": 0},
        },
        {"model": "gemma3-270m", "created_at": WHEN, **DURATIONS},
        _any,
    ),
}

MSG = {"model": "tiny", "message_id": "msg_blazar_0001"}
ANTHROPIC_RESPONSES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any], Want]] = {
    "message_response": (
        "tiny",
        "message_response",
        "messages_request",
        {"model": "tiny", "max_tokens": 6, "messages": HI},
        MSG,
        _any,
    ),
    "message_stream": (
        "tiny",
        "stream",
        "messages_request",
        {"model": "tiny", "max_tokens": 4, "messages": HI, "stream": True},
        MSG,
        _any,
    ),
    "message_stop_sequence": (
        "tiny",
        "message_response",
        "messages_request",
        {"model": "tiny", "max_tokens": 40, "messages": HI, "stop_sequences": STOP_WORDS},
        MSG,
        _anthropic_stop,
    ),
    "message_stop_sequence_stream": (
        "tiny",
        "stream",
        "messages_request",
        {
            "model": "tiny",
            "max_tokens": 40,
            "messages": HI,
            "stop_sequences": STOP_WORDS,
            "stream": True,
        },
        MSG,
        _anthropic_stop,
    ),
    "message_tool_use": (
        "gemma",
        "message_response",
        "messages_request",
        {
            "model": "gemma3-270m",
            "max_tokens": 40,
            "tools": [ANTHROPIC_TOOL],
            "messages": [{"role": "user", "content": "weather in paris?"}],
        },
        {**MSG, "model": "gemma3-270m"},
        _tool_use,
    ),
    "message_tool_use_stream": (
        "gemma",
        "stream",
        "messages_request",
        {
            "model": "gemma3-270m",
            "max_tokens": 40,
            "tools": [ANTHROPIC_TOOL],
            "stream": True,
            "messages": [{"role": "user", "content": "weather in paris?"}],
        },
        {**MSG, "model": "gemma3-270m"},
        _tool_use_after_text,
    ),
}


RESPONSE_ID = "resp_blazar0001"
CREATED = 1767323045  # WHEN, in seconds
# The Responses API has no `stop`; these engine requests get one so that the tiny model,
# which never chooses its end-of-sequence token, ends by itself (a `completed` answer).
STOPPED = {"stop": STOP_WORDS, "max_tokens": 40}
RESPONSES_INPUT = "hi"
# name -> (engine, translator, kind of client request, client request, engine body extra, want)
OPENAI_RESPONSES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any], Want]] = {
    "responses_cut": (
        "tiny",
        "response_object",
        "responses",
        {"model": "tiny", "input": RESPONSES_INPUT, "max_output_tokens": 5},
        {},
        _any,
    ),
    "responses_cut_stream": (
        "tiny",
        "response_stream",
        "responses",
        {"model": "tiny", "input": RESPONSES_INPUT, "max_output_tokens": 4, "stream": True},
        {},
        _any,
    ),
    "responses_stop": (
        "tiny",
        "response_object",
        "responses",
        {"model": "tiny", "input": RESPONSES_INPUT},
        STOPPED,
        _finished_by_stop,
    ),
    "responses_stop_stream": (
        "tiny",
        "response_stream",
        "responses",
        {"model": "tiny", "input": RESPONSES_INPUT, "stream": True},
        STOPPED,
        _finished_by_stop,
    ),
    "responses_tool_call": (
        "gemma",
        "response_object",
        "responses",
        {
            "model": "gemma3-270m",
            "input": "weather in paris?",
            "max_output_tokens": 60,
            "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
        },
        {},
        _whole_tool_call,
    ),
    "responses_tool_call_stream": (
        "gemma",
        "response_stream",
        "responses",
        {
            "model": "gemma3-270m",
            "input": "weather in paris?",
            "max_output_tokens": 60,
            "stream": True,
            "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
        },
        {},
        _whole_tool_call,
    ),
    "responses_json_schema": (
        "gemma",
        "response_object",
        "responses",
        {
            "model": "gemma3-270m",
            "input": "Is it sunny in Paris? Answer in JSON.",
            "max_output_tokens": 40,
            "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA}},
        },
        {},
        _any,
    ),
    "completions_logprobs": (
        "tiny",
        "reshape_body",
        "completions",
        {"model": "tiny", "prompt": "the quick", "max_tokens": 3, "logprobs": 2},
        {},
        _any,
    ),
    "completions_logprobs_stream": (
        "tiny",
        "reply_stream",
        "completions",
        {"model": "tiny", "prompt": "the quick", "max_tokens": 3, "logprobs": 2, "stream": True},
        {},
        _any,
    ),
    "completions_echo": (
        "tiny",
        "reshape_body",
        "completions",
        {"model": "tiny", "prompt": ["the quick", "a"], "max_tokens": 2, "echo": True},
        {},
        _any,
    ),
    "completions_echo_stream": (
        "tiny",
        "reply_stream",
        "completions",
        {"model": "tiny", "prompt": "the quick", "max_tokens": 2, "echo": True, "stream": True},
        {},
        _any,
    ),
    "chat_logprobs_without_top": (
        "tiny",
        "reshape_body",
        "chat",
        {"model": "tiny", "messages": HI, "max_tokens": 2, "logprobs": True},
        {},
        _any,
    ),
    "chat_logprobs_without_top_stream": (
        "tiny",
        "reply_stream",
        "chat",
        {"model": "tiny", "messages": HI, "max_tokens": 2, "logprobs": True, "stream": True},
        {},
        _any,
    ),
}
OPENAI_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _openai_case(engines: dict[str, Engine], name: str, spec: tuple[Any, ...]) -> dict[str, Any]:
    engine, translator, kind, request, extra, want = spec
    if kind == "responses":
        translated = responses_request(request)
        engine_request = translated.engine
        kwargs: dict[str, Any] = {
            "response_id": RESPONSE_ID,
            "created_at": CREATED,
            "model": request["model"],
            "echo": translated.echo,
        }
    else:
        shaping = shape_request(OPENAI_PATHS[kind], request)
        body = shaping.body if shaping.body is not None else dict(request)
        engine_request = EngineRequest(OPENAI_PATHS[kind], body, bool(body.get("stream")))
        assert shaping.reply is not None, name
        kwargs = {**shaping.reply.__dict__, "echo": list(shaping.reply.echo)}
    if extra:
        body = {**engine_request.body, **extra}
        engine_request = EngineRequest(engine_request.path, body, engine_request.stream)
    attempts = 60 if engine == "gemma" else 20
    captured = _capture(engines[engine], engine_request, want, attempts)
    model = "Gemma 3 270M (tools-aware ChatML template)" if engine == "gemma" else "tiny"
    case = {
        "translator": translator,
        "kwargs": kwargs,
        "input": captured,
        "captured": {
            "engine": f"xllamacpp {ENGINE_VERSION}, {model}",
            "client_request": request,
            "engine_request": engine_request.to_dict(),
        },
    }
    case["expected"] = runner.run("openai", case)
    return case


def _engines(stack: ExitStack, tmp: Path, wanted: set[str]) -> dict[str, Engine]:
    engines: dict[str, Engine] = {}
    if "tiny" in wanted:
        tiny = write_tiny_model(tmp / "tiny.gguf")
        engines["tiny"] = stack.enter_context(
            running_engine(tiny, "--embeddings", "--pooling", "mean")
        )
    if "gemma" in wanted:
        path = write_gemma(tmp)
        engines["gemma"] = stack.enter_context(
            running_engine(path, "--chat-template", TOOLS_TEMPLATE, ctx=2048)
        )
    return engines


def _translate(protocol: str, translator: str, request: dict[str, Any]) -> EngineRequest:
    module: Any = ollama if protocol == "ollama" else anthropic
    kwargs = CTX if protocol == "ollama" else {}
    out: EngineRequest | LoadOnly = getattr(module, translator)(request, **kwargs)
    assert not isinstance(out, LoadOnly)
    return out


def _capture(engine: Engine, request: EngineRequest, want: Want, attempts: int) -> Any:
    for _ in range(attempts):
        status, out = engine.send(request)
        assert status == 200, (request, status, out)
        if want(out):
            return out
    raise RuntimeError(f"no engine answer matched after {attempts} attempts: {request}")


def _requests(protocol: str, table: dict[str, Any], only: set[str]) -> Iterator[str]:
    for name, (translator, kwargs, request, not_live) in table.items():
        if only and name not in only:
            continue
        case = {
            "translator": translator,
            "kwargs": kwargs,
            "input": request,
            "live": not_live is None,
        }
        if not_live:
            case["note"] = f"not sent to the engine in tests: {not_live}"
        case["expected"] = runner.run(protocol, case)
        runner.save(protocol, name, case)
        yield name


def _model_builders(tiny: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    record = {
        "name": "tiny",
        "tag": "latest",
        "size": tiny.stat().st_size,
        "sha256": "ab" * 32,
        "added_at": WHEN,
        "facts": inspect_gguf(tiny).to_dict(),
    }
    yield "tags", {"translator": "tags", "kwargs": {}, "input": {"model": record}}
    yield (
        "ps",
        {
            "translator": "ps",
            "kwargs": {"expires_at": "2026-01-02T03:09:05Z", "context_length": 1024},
            "input": {"model": record},
        },
    )
    yield (
        "show",
        {"translator": "show", "kwargs": {"context_length": 1024}, "input": {"model": record}},
    )
    for endpoint, unloaded in (("generate", False), ("chat", True), ("embed", False)):
        kwargs: dict[str, Any] = {"model": "tiny", "created_at": WHEN, "unloaded": unloaded}
        name = f"load_{endpoint}{'_unloaded' if unloaded else ''}"
        yield (
            name,
            {"translator": "load_response", "kwargs": kwargs, "input": {"endpoint": endpoint}},
        )


def main(argv: list[str]) -> None:
    only = set(argv)
    done = [*_requests("ollama", OLLAMA_REQUESTS, only)]
    done += [*_requests("anthropic", ANTHROPIC_REQUESTS, only)]
    responses = [("ollama", n, c) for n, c in OLLAMA_RESPONSES.items()]
    responses += [("anthropic", n, c) for n, c in ANTHROPIC_RESPONSES.items()]
    responses = [r for r in responses if not only or r[1] in only]
    openai_cases = {n: c for n, c in OPENAI_RESPONSES.items() if not only or n in only}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        wanted = {c[0] for _, _, c in responses} | {c[0] for c in openai_cases.values()}
        engines = _engines(stack, Path(tmp), wanted | {"tiny"})
        for name, spec in openai_cases.items():
            runner.save("openai", name, _openai_case(engines, name, spec))
            done.append(name)
        for name, case in _model_builders(Path(tmp) / "tiny.gguf"):
            if not only or name in only:
                case["expected"] = runner.run("ollama", case)
                runner.save("ollama", name, case)
                done.append(name)
        for protocol, name, (
            engine,
            translator,
            req_translator,
            request,
            kwargs,
            want,
        ) in responses:
            engine_request = _translate(protocol, req_translator, request)
            attempts = 60 if engine == "gemma" else 20
            captured = _capture(engines[engine], engine_request, want, attempts)
            if engine_request.hints.get("dimensions"):
                kwargs = {**kwargs, "dimensions": engine_request.hints["dimensions"]}
            model = "Gemma 3 270M (tools-aware ChatML template)" if engine == "gemma" else "tiny"
            case = {
                "translator": translator,
                "kwargs": kwargs,
                "input": captured,
                "captured": {
                    "engine": f"xllamacpp {ENGINE_VERSION}, {model}",
                    "client_request": request,
                    "engine_request": engine_request.to_dict(),
                },
            }
            case["expected"] = runner.run(protocol, case)
            runner.save(protocol, name, case)
            done.append(name)
    print(f"wrote {len(done)} golden files: {', '.join(done)}")


if __name__ == "__main__":
    main(sys.argv[1:])
