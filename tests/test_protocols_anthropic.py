"""The Anthropic adapter: golden normalizations, validation tables, live engine checks.

Goldens (tests/golden/anthropic/*.json, see tests/golden/runner.py) pin requests in
-> engine requests out, and real llama-server `/v1/messages` output in ->
normalized Anthropic output; rewrite them with BLAZAR_UPDATE_GOLDEN=1, recapture
with `python -m tests.golden.capture`. Every normalized response and event is
parsed with the official `anthropic` package's types, and the live tests check the
engine accepts what the adapter forwards and that the normalized stream is complete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from anthropic import types as anthropic_types

from blazar.protocols import EngineRequest, ProtocolError, anthropic
from blazar.protocols.sse import DONE, SSEDecoder
from blazar.testing.tiny import write_tiny_model
from tests.golden import runner
from tests.golden.capture import ANTHROPIC_TOOL, STOP_WORDS
from tests.golden.engine import Engine, running_engine

HI = [{"role": "user", "content": "hi"}]
EVENT_ORDER = [
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


def request(**body: Any) -> EngineRequest:
    return anthropic.messages_request({"model": "m", "max_tokens": 8, "messages": HI, **body})


def normalize(events: list[Any], model: str = "m") -> list[dict[str, Any]]:
    state = anthropic.StreamState(model=model, message_id="msg_1")
    out = [e for event in events for e in anthropic.stream_events(event, state)]
    return out + anthropic.finish_stream(state)


def check_order(events: list[dict[str, Any]]) -> None:
    """Anthropic's grammar: start, (block start, deltas, block stop)+, delta, stop; one ping."""
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("ping") == 1 and kinds.index("ping") == 2
    open_block = None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_block is None, "a block started before the previous one stopped"
            open_block = event["index"]
        elif event["type"] in ("content_block_delta", "content_block_stop"):
            assert event["index"] == open_block
            if event["type"] == "content_block_stop":
                open_block = None
    assert open_block is None


def validate(events: list[dict[str, Any]]) -> None:
    adapter = pydantic.TypeAdapter(anthropic_types.RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            adapter.validate_python(event)


# --- goldens ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", runner.names("anthropic"))
def test_golden(name: str) -> None:
    expected, actual = runner.check("anthropic", name)
    assert actual == expected


def test_golden_outputs_parse_with_the_official_anthropic_client() -> None:
    for name in runner.names("anthropic"):
        case = runner.load("anthropic", name)
        if case["translator"] == "message_response":
            anthropic_types.Message.model_validate(case["expected"])
        elif case["translator"] == "stream":
            check_order(case["expected"])
            validate(case["expected"])


def test_normalizer_fixes_what_the_engine_gets_wrong() -> None:
    """Each engine quirk, as the captured goldens show it, and its fix."""
    stop = runner.load("anthropic", "message_stop_sequence_stream")
    engine_delta = next(e for e in stop["input"] if e.get("type") == "message_delta")
    assert engine_delta["delta"]["stop_reason"] == "end_turn"  # the engine's
    fixed = next(e for e in stop["expected"] if e["type"] == "message_delta")
    assert fixed["delta"]["stop_reason"] == "stop_sequence"
    assert not any(e.get("type") == "ping" for e in stop["input"])
    tools = runner.load("anthropic", "message_tool_use_stream")
    starts = [e for e in tools["input"] if e.get("type") == "content_block_start"]
    assert "input" not in starts[-1]["content_block"]  # the engine omits it
    kinds = [e["type"] for e in tools["input"] if e != DONE]
    assert kinds.index("content_block_stop") > kinds.index("content_block_start", 2)
    assert tools["input"][0]["message"]["model"].endswith(".gguf")
    assert tools["expected"][0]["message"]["model"] == "gemma3-270m"


# --- validation ---------------------------------------------------------------------------

ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"model": "m", "messages": HI}, "max_tokens: Field required"),
    ({"model": "m", "max_tokens": 0, "messages": HI}, "max_tokens: Input should be an integer"),
    ({"max_tokens": 8, "messages": HI}, "model: Field required"),
    ({"model": "m", "max_tokens": 8}, "messages: Field required"),
    ({"model": "m", "max_tokens": 8, "messages": []}, "messages: Input should be a non-empty"),
    (
        {"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
        "messages.0.role: Input should be 'user' or 'assistant'",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                            },
                        }
                    ],
                }
            ],
        },
        "messages.0.content.0: image content is not supported: this model has no vision",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "image", "source": {}}],
                        }
                    ],
                }
            ],
        },
        "messages.0.content.0.content.0: image content is not supported",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        },
        "document blocks (PDF, files) are not",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                }
            ],
        },
        "'tool_use' blocks are not supported in user messages",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
            ],
        },
        "messages.0.content.0.input",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
        },
        "tool_use_id: Field required",
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "text"}]}],
        },
        "messages.0.content.0.text: Field required",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "system": [{"type": "image"}]},
        "system.0: expected a text block",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "stop_sequences": "x"},
        "stop_sequences: Input should be a list of strings",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "temperature": 1.5},
        "temperature: Input should be between 0 and 1",
    ),
    ({"model": "m", "max_tokens": 8, "messages": HI, "top_p": -0.1}, "top_p: Input should be"),
    ({"model": "m", "max_tokens": 8, "messages": HI, "top_k": "x"}, "top_k: Input should be a"),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": HI,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "server tool 'web_search_20250305' is not supported",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "tools": [{"name": "f"}]},
        "tools.0.input_schema: Field required",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "tool_choice": {"type": "tool"}},
        "tool_choice.name: Field required",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "tool_choice": {"type": "some"}},
        "tool_choice.type: Input should be",
    ),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "thinking": {"type": "on"}},
        "thinking.type: Input should be",
    ),
    ({"model": "m", "max_tokens": 8, "messages": HI, "stream": "yes"}, "stream: Input should"),
    (
        {"model": "m", "max_tokens": 8, "messages": HI, "mcp_servers": [{"url": "x"}]},
        "mcp_servers: not supported by Blazar",
    ),
]


@pytest.mark.parametrize(("body", "fragment"), ERRORS)
def test_invalid_requests_get_anthropic_400s(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as err:
        anthropic.messages_request(body)
    assert err.value.status == 400 and fragment in err.value.message
    assert anthropic.from_protocol_error(err.value) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": err.value.message},
    }


def test_vision_models_accept_image_blocks() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}
    assert anthropic.messages_request(body, has_vision=True).body["messages"] == body["messages"]


def test_count_tokens_needs_no_max_tokens() -> None:
    req = anthropic.count_tokens_request({"model": "m", "messages": HI, "max_tokens": 5})
    assert req.path == "/v1/messages/count_tokens" and "max_tokens" not in req.body


def test_forwarded_fields_and_what_is_dropped() -> None:
    req = request(metadata={"user_id": "u"}, temperature=0.2, top_k=5, stop_sequences=["x"])
    assert req.body == {
        "model": "m",
        "max_tokens": 8,
        "messages": HI,
        "temperature": 0.2,
        "top_k": 5,
        "stop_sequences": ["x"],
    }
    assert req.hints == {"ignored": ["metadata"]} and req.stream is False
    assert request(stream=True).stream is True


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
        (418, "invalid_request_error"),
        (599, "api_error"),
    ],
)
def test_error_types_by_status(status: int, kind: str) -> None:
    body = anthropic.error(status, None, "boom")
    assert body == {"type": "error", "error": {"type": kind, "message": "boom"}}
    if kind != "request_too_large":  # documented by Anthropic, absent from the SDK's enum
        anthropic_types.ErrorResponse.model_validate(body)


def test_engine_errors_become_anthropic_errors() -> None:
    engine = {"error": {"code": 500, "message": "image input is not supported", "type": "x"}}
    status, body = anthropic.error_from_engine(500, engine)
    assert status == 500 and body["error"] == {
        "type": "api_error",
        "message": "image input is not supported",
    }


def test_a_stream_cut_short_ends_with_an_error_event() -> None:
    events = normalize([{"type": "message_start", "message": {"usage": {}}}])
    assert events[-1] == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "the model's engine ended the stream before message_stop",
        },
    }


def test_sse_encoding_names_the_event() -> None:
    assert anthropic.sse({"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'


# --- live: the engine's /v1/messages with what the adapter forwards -----------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with running_engine(model) as running:
        yield running


def test_live_engine_accepts_every_forwarded_request(engine: Engine) -> None:
    sent = 0
    for name in runner.names("anthropic"):
        case = runner.load("anthropic", name)
        if not case["translator"].endswith("_request"):
            continue
        expected = case["expected"]
        status, body = engine.send(
            EngineRequest(expected["path"], expected["body"], expected["stream"])
        )
        assert status == 200, (name, body)
        sent += 1
    assert sent == 5


def test_live_stream_is_complete_and_valid(engine: Engine) -> None:
    status, raw = engine._open("POST", "/v1/messages", request(stream=True, max_tokens=5).body)
    assert status == 200
    decoder = SSEDecoder()
    events = decoder.feed(raw) + decoder.close()
    assert all(e.event == e.data["type"] for e in events)  # `event:` names match
    out = normalize([e.data for e in events])
    kinds = [e["type"] for e in out]
    assert sorted(set(kinds), key=EVENT_ORDER.index) == EVENT_ORDER
    assert kinds.count("content_block_delta") == 5
    check_order(out)
    validate(out)
    assert out[0]["message"]["id"] == "msg_1" and out[0]["message"]["model"] == "m"
    assert out[-2]["usage"]["output_tokens"] == 5


def test_live_stop_sequences_give_stop_reason_stop_sequence(engine: Engine) -> None:
    for _ in range(5):  # the tiny model's sampling is random; a stop word comes quickly
        status, out = engine.send(request(stop_sequences=STOP_WORDS, max_tokens=60))
        assert status == 200
        message = anthropic.message_response(out, model="m", message_id="msg_1")
        if message["stop_reason"] != "max_tokens":
            break
    anthropic_types.Message.model_validate(message)
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] in STOP_WORDS
    text = "".join(b["text"] for b in message["content"])
    assert not any(word in text for word in STOP_WORDS)


def test_live_count_tokens_and_tools(engine: Engine) -> None:
    req = anthropic.count_tokens_request({"model": "m", "messages": HI})
    status, out = engine.send(req)
    assert status == 200 and out == {"input_tokens": 23}
    status, out = engine.send(request(tools=[ANTHROPIC_TOOL], tool_choice={"type": "auto"}))
    assert status == 200 and out["type"] == "message"
