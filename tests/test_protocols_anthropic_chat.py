"""Anthropic Messages over the engine's chat endpoint (for requests with adapters or defaults
the engine's /v1/messages drops), and the engine body each request gets: tables of cases,
then the normalized stream checked against the Anthropic SDK's own event types."""

from __future__ import annotations

from typing import Any

import anthropic.types as anthropic_types
import pydantic
import pytest

from blazar.protocols import EngineRequest, anthropic
from blazar.protocols.anthropic_chat import ChatEvents, chat_request, message_from_chat
from blazar.protocols.sse import DONE
from blazar.serve.request.steps import engine_body, with_defaults
from blazar.serve.supervisor.runtime import Adapter, ModelRuntime
from blazar.serve.supervisor.scheduler import Lease, Member, Pool
from specs.names import AdapterChoice
from tests.gateway_harness import runtime as harness_runtime


def test_request_converts_as_the_engine_converts_it() -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm"},
                    {"type": "text", "text": "let me look"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "rain"}],
                    },
                    {"type": "text", "text": "and now?"},
                ],
            },
        ],
        "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_k": 3,
        "thinking": {"type": "enabled", "budget_tokens": 64},
        "stream": True,
    }
    out = chat_request(EngineRequest("/v1/messages", body, True))
    assert out.path == "/v1/chat/completions" and out.stream
    assert out.body == {
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "let me look"}],
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "get", "arguments": '{"city": "Oslo"}'},
                    }
                ],
                "reasoning_content": "hmm",
            },
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
            {"role": "tool", "tool_call_id": "t1", "content": "rain"},
        ],
        "max_tokens": 9,
        "temperature": 0.5,
        "top_k": 3,
        "stream": True,
        "tools": [
            {
                "type": "function",
                "function": {"name": "get", "description": "d", "parameters": {"type": "object"}},
            }
        ],
        "tool_choice": "required",
        "stop": ["END"],
        "thinking_budget_tokens": 64,
        "stream_options": {"include_usage": True},
    }


CHAT = {
    "choices": [
        {
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "sure",
                "reasoning_content": "think",
                "tool_calls": [{"id": "c1", "function": {"name": "get", "arguments": '{"a": 1}'}}],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 30,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 20},
    },
}


def test_whole_answer_becomes_the_messages_answer() -> None:
    engine = message_from_chat(CHAT)
    reply = anthropic.message_response(engine, model="m+fox", message_id="msg_1")
    assert reply["content"] == [
        {"type": "thinking", "thinking": "think", "signature": ""},
        {"type": "text", "text": "sure"},
        {"type": "tool_use", "id": "c1", "name": "get", "input": {"a": 1}},
    ]
    assert reply["stop_reason"] == "tool_use" and reply["model"] == "m+fox"
    assert reply["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 20,
        "output_tokens": 5,
    }
    pydantic.TypeAdapter(anthropic_types.Message).validate_python(reply)


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


STREAM: list[Any] = [
    chunk({"role": "assistant", "content": None}),
    chunk({"reasoning_content": "hm"}),
    chunk({"content": " fox"}),
    chunk({"content": " fox"}),
    chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
    chunk({}, "tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 4}},
    DONE,
]


def test_stream_becomes_the_messages_stream() -> None:
    bridge, state = ChatEvents(), anthropic.StreamState(model="m+fox", message_id="msg_1")
    events = [
        e for c in STREAM for item in bridge.feed(c) for e in anthropic.stream_events(item, state)
    ]
    kinds = [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in events]
    assert kinds == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        ("ping", None, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["input_tokens"] == 12 and delta["usage"]["output_tokens"] == 4
    assert anthropic.finish_stream(state) == []  # it ended properly
    adapter = pydantic.TypeAdapter(anthropic_types.RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":  # the SDK's union leaves ping out
            adapter.validate_python(event)


def test_a_stream_cut_short_ends_in_an_error() -> None:
    bridge, state = ChatEvents(), anthropic.StreamState(model="m", message_id="msg_1")
    for c in STREAM[:3]:
        for item in bridge.feed(c):
            anthropic.stream_events(item, state)
    assert anthropic.finish_stream(state)[0]["type"] == "error"
    failed = ChatEvents().feed({"error": {"message": "boom", "code": 500}})
    assert failed == [{"error": {"message": "boom", "code": 500}}]


# --- the engine body: adapters, system prompt and parameters ------------------------------


def runtime(**fields: Any) -> ModelRuntime:
    return harness_runtime("m", **fields)


def lease(rt: ModelRuntime, adapters: tuple[AdapterChoice, ...] | None = None) -> Lease:
    member = Member(instance=None)  # type: ignore[arg-type]  # the body needs no instance
    return Lease(Pool(rt, [member]), member, adapters)


FOX, OWL = Adapter("fox", "/fox.gguf", 1.0), Adapter("owl", "/owl.gguf", 0.8, always_on=True)
CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("rt", "chosen", "body", "lora"),
    [
        (runtime(), None, CHAT_BODY, "same"),  # nothing to add: the very same object
        (runtime(adapters=(FOX,)), None, CHAT_BODY, "same"),
        (runtime(adapters=(FOX,)), (AdapterChoice("fox"),), CHAT_BODY, [{"id": 0, "scale": 1.0}]),
        (runtime(adapters=(FOX, OWL)), None, CHAT_BODY, [{"id": 1, "scale": 0.8}]),
        (runtime(adapters=(FOX, OWL)), (), CHAT_BODY, []),  # +none: every adapter off
        (
            runtime(adapters=(FOX, OWL)),
            (AdapterChoice("owl", 0.25),),
            CHAT_BODY,
            [{"id": 1, "scale": 0.25}],
        ),
        # a client's own lora field is left alone, unless the name chose adapters
        (
            runtime(adapters=(FOX, OWL)),
            None,
            {**CHAT_BODY, "lora": [{"id": 0, "scale": 2}]},
            "same",  # passed as the client sent it
        ),
        (
            runtime(adapters=(FOX,)),
            (AdapterChoice("fox"),),
            {**CHAT_BODY, "lora": [{"id": 0, "scale": 2}]},
            [{"id": 0, "scale": 1.0}],
        ),
    ],
)
def test_engine_body_lora(
    rt: ModelRuntime, chosen: tuple[AdapterChoice, ...] | None, body: dict[str, Any], lora: Any
) -> None:
    sent = engine_body(lease(rt, chosen), body, "/v1/chat/completions")
    if lora == "same":
        assert sent is body
    else:
        assert sent["lora"] == lora and sent is not body and "lora" not in CHAT_BODY


PARAMS = {"temperature": 0.1, "num_predict": 4, "stop": ["END"], "repeat_penalty": 1.3}


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
            {
                "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                "temperature": 0.1,
                "n_predict": 4,
                "stop": ["END"],
                "repeat_penalty": 1.3,
            },
        ),
        # what the request sets wins; its own limit keeps n_predict out
        (
            "/v1/chat/completions",
            {"messages": [{"role": "developer", "content": "D"}], "max_tokens": 9, "stop": []},
            {
                "messages": [{"role": "developer", "content": "D"}],
                "max_tokens": 9,
                "stop": [],
                "temperature": 0.1,
                "repeat_penalty": 1.3,
            },
        ),
        (
            "/completion",
            {"prompt": "x", "temperature": 1.0},
            {
                "prompt": "x",
                "temperature": 1.0,
                "n_predict": 4,
                "stop": ["END"],
                "repeat_penalty": 1.3,
            },
        ),
        (
            "/v1/messages",
            {"messages": [], "max_tokens": 3},
            {
                "messages": [],
                "max_tokens": 3,
                "system": "S",
                "temperature": 0.1,
                "stop_sequences": ["END"],
            },
        ),
        ("/v1/messages/count_tokens", {"messages": []}, {"messages": [], "system": "S"}),
        (
            "/v1/responses",
            {"input": "hi"},
            {
                "input": "hi",
                "instructions": "S",
                "temperature": 0.1,
                "n_predict": 4,
                "stop": ["END"],
                "repeat_penalty": 1.3,
            },
        ),
    ],
)
def test_model_defaults_fill_what_the_request_leaves_unset(
    path: str, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    out = dict(body)
    with_defaults(out, path, "S", PARAMS)
    assert out == expected
    rt = runtime(system="S", params=PARAMS)
    assert engine_body(lease(rt), dict(body), path) == expected
    assert engine_body(lease(rt), {"input": "x"}, "/v1/embeddings") == {"input": "x"}
