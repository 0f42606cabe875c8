"""OpenAI's side of the gateway: pass-through checks, reshaped replies, the Responses translator.

Goldens (tests/golden/openai/*.json, see tests/golden/runner.py) pin real engine
output in -> what the client gets out, captured from llama-server by
`python -m tests.golden.capture` (the tiny model; Gemma 3 270M for tool calls and
JSON-schema output). Each translated answer is also fed to the official `openai`
package's own models and stream accumulator: what it accepts is what the SDK user
gets (the bug this pins: `client.responses.stream()` raised on the engine's events).
The tables pin what is refused and why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_choice import Logprobs
from openai.types.responses import Response, ResponseStreamEvent

from blazar.protocols import ProtocolError, model_lists
from blazar.protocols.openai_completions import OLD_ID, IdRenamer
from blazar.protocols.openai_requests import UNCHANGED, engine_refusal, shape_request
from blazar.protocols.openai_responses import responses_request
from blazar.serve.http import json_depth_exceeds, parse_json_object
from tests.golden import runner

HI = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("name", runner.names("openai"))
def test_golden(name: str) -> None:
    expected, actual = runner.check("openai", name)
    assert actual == expected


def _sdk_stream(events: list[dict[str, Any]]) -> ResponseStreamState[Any]:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=event))  # type: ignore[arg-type]
    return state


@pytest.mark.parametrize("name", [n for n in runner.names("openai") if n.startswith("responses")])
def test_responses_are_what_the_openai_sdk_reads(name: str) -> None:
    case = runner.load("openai", name)
    expected = case["expected"]
    if case["translator"] == "response_object":
        response = Response.model_validate(expected)  # every field the SDK requires
        assert response.output_text == "".join(
            p["text"]
            for item in expected["output"]
            if item["type"] == "message"
            for p in item["content"]
        )
        return
    numbers = [e["sequence_number"] for e in expected]
    assert numbers == list(range(len(expected)))
    state = _sdk_stream(expected)  # raised TypeError on the engine's own events
    last = expected[-1]
    Response.model_validate(last["response"])
    if last["type"] == "response.completed":
        final = state._completed_response
        assert final is not None and final.status == "completed"
        deltas = "".join(e["delta"] for e in expected if e["type"] == "response.output_text.delta")
        assert final.output_text == deltas
    else:  # cut at max_output_tokens, as OpenAI says it
        assert last["type"] == "response.incomplete"
        assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_response_cut_by_the_limit_is_incomplete_and_one_that_stopped_is_completed() -> None:
    cut = runner.load("openai", "responses_cut")["expected"]
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert runner.load("openai", "responses_stop")["expected"]["status"] == "completed"
    tool = runner.load("openai", "responses_tool_call")["expected"]
    [call] = [item for item in tool["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"] == "paris"
    schema = runner.load("openai", "responses_json_schema")["expected"]
    assert set(json.loads(Response.model_validate(schema).output_text)) == {"city", "sunny"}


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("completions_logprobs", Completion),
        ("completions_echo", Completion),
        ("chat_logprobs_without_top", ChatCompletion),
    ],
)
def test_reshaped_replies_parse_as_openai_shapes(name: str, model: Any) -> None:
    model.model_validate(runner.load("openai", name)["expected"])


def test_legacy_logprobs_and_ids() -> None:
    whole = runner.load("openai", "completions_logprobs")
    out = whole["expected"]
    assert out["id"].startswith("cmpl-") and not out["id"].startswith("cmpl-chatcmpl")
    logprobs = out["choices"][0]["logprobs"]
    tokens = logprobs["tokens"]
    assert "".join(tokens) == out["choices"][0]["text"]
    assert logprobs["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    engine = whole["input"]["choices"][0]["logprobs"]["content"]
    assert logprobs["token_logprobs"] == [e["logprob"] for e in engine]
    assert [len(t) for t in logprobs["top_logprobs"]] == [2] * len(tokens)
    chunks = runner.load("openai", "completions_logprobs_stream")["expected"]
    offsets = [
        o
        for c in chunks
        if c != "[DONE]"
        for ch in c["choices"]
        if ch["logprobs"]
        for o in ch["logprobs"]["text_offset"]
    ]
    assert offsets == sorted(offsets) and offsets[0] == 0 and len(set(offsets)) == len(offsets)
    for chunk in chunks:
        if chunk != "[DONE]":
            assert chunk["id"].startswith("cmpl-")
            for choice in chunk["choices"]:  # chunks before the last have no finish_reason
                Logprobs.model_validate(choice["logprobs"] or {})


def test_echo_puts_the_prompt_in_front() -> None:
    whole = runner.load("openai", "completions_echo")
    prompts = whole["captured"]["client_request"]["prompt"]
    for choice, engine in zip(whole["expected"]["choices"], whole["input"]["choices"], strict=True):
        assert choice["text"] == prompts[choice["index"]] + engine["text"]
    chunks = runner.load("openai", "completions_echo_stream")["expected"]
    text = "".join(c["choices"][0]["text"] for c in chunks if c != "[DONE]" and c["choices"])
    assert text.startswith("the quick ") and len(text) > len("the quick ")


def test_chat_logprobs_without_top_logprobs_have_none() -> None:
    whole = runner.load("openai", "chat_logprobs_without_top")
    content = whole["expected"]["choices"][0]["logprobs"]["content"]
    assert content and all(entry["top_logprobs"] == [] for entry in content)
    assert whole["captured"]["engine_request"]["body"]["top_logprobs"] == 1
    for chunk in runner.load("openai", "chat_logprobs_without_top_stream")["expected"]:
        if chunk != "[DONE]":
            ChatCompletionChunk.model_validate(chunk)
            for choice in chunk["choices"]:
                for entry in (choice.get("logprobs") or {}).get("content") or []:
                    assert entry["top_logprobs"] == []


# --- what the pass-through refuses and changes ---------------------------------------------

REFUSED = [
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is it?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                    ],
                }
            ]
        },
        "image_url content is not supported: this model has no vision",
    ),
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}
                    ],
                }
            ]
        },
        "input_audio content is not supported",
    ),
    (
        CHAT,
        {"messages": HI, "tools": [TOOL], "tool_choice": "required"},
        "tool_choice 'required': this engine cannot force a tool call",
    ),
    (
        CHAT,
        {
            "messages": HI,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        "tool_choice a named function",
    ),
    (CHAT, {"messages": HI, "tool_choice": 3}, "tool_choice must be"),
    (CHAT, {"messages": HI, "functions": [{"name": "f"}]}, "send tools"),
    (COMPLETIONS, {"prompt": "a", "echo": True, "logprobs": 1}, "cannot score the prompt"),
    (COMPLETIONS, {"prompt": [1, 2], "echo": True}, "echo needs the prompt as text"),
    (COMPLETIONS, {"prompt": "a", "echo": "yes"}, "echo must be true or false"),
    (COMPLETIONS, {"prompt": "a", "logprobs": -1}, "logprobs must be an integer"),
    (COMPLETIONS, {"prompt": "a", "logprobs": True}, "logprobs must be an integer"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": 0}, "max_tokens must be at least 1"),
]


@pytest.mark.parametrize(("path", "body", "fragment"), REFUSED)
def test_what_the_engine_would_ignore_is_refused(
    path: str, body: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        shape_request(path, {"model": "m", **body})
    assert err.value.status == 400 and err.value.code == "invalid_request_error"
    assert fragment in err.value.message


def test_plain_requests_travel_untouched() -> None:
    assert shape_request(CHAT, {"model": "m", "messages": HI, "max_tokens": 4}) is UNCHANGED
    assert shape_request("/v1/embeddings", {"model": "m", "input": "x"}) is UNCHANGED
    tools = shape_request(CHAT, {"model": "m", "messages": HI, "tools": [TOOL]})
    assert tools.needs == ("tools",) and tools.body is None and tools.reply is None
    off = shape_request(
        CHAT, {"model": "m", "messages": HI, "tools": [TOOL], "tool_choice": "none"}
    )
    assert off.needs == ()
    legacy = shape_request(COMPLETIONS, {"model": "m", "prompt": "a"})
    assert legacy.body is None and legacy.reply is not None and not legacy.reply.rewrites_events


def test_engine_500s_that_are_the_clients_mistake() -> None:
    parse = {"error": {"code": 500, "message": "Failed to parse messages: type must be string"}}
    assert engine_refusal(500, parse) == "the request is malformed: " + parse["error"]["message"]
    image = {"error": {"message": "image input is not supported - hint: provide the mmproj"}}
    assert "no vision or audio projector" in str(engine_refusal(500, image))
    assert engine_refusal(500, {"error": {"message": "out of memory"}}) is None
    assert engine_refusal(400, parse) is None


RESPONSES_REFUSED = [
    ({"input": "x", "previous_response_id": 7}, "previous_response_id: expected the id"),
    ({"input": "x", "conversation": "conv_1"}, "does not store conversations"),
    ({"input": "x", "background": True}, "background responses"),
    ({"input": "x", "frobnicate": 1}, "Unrecognized request argument(s): frobnicate"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "'web_search' tools run on OpenAI's"),
    (
        {"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"},
        "cannot force a tool call",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "file_id images need OpenAI's Files API",
    ),
    (
        {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input_image parts are taken in user messages only",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input_file is not supported on /v1/responses",
    ),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference' items"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format: expected"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({}, "input: Field required"),
]


@pytest.mark.parametrize(("body", "fragment"), RESPONSES_REFUSED)
def test_responses_refusals_say_why(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as err:
        responses_request({"model": "m", **body})
    assert err.value.status == 400 and fragment in err.value.message


def test_responses_input_items_become_chat_messages() -> None:
    req = responses_request(
        {
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "developer", "content": "use tools"},
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look"}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_object"}},
            "max_output_tokens": 9,
            "stream": True,
        }
    )
    body = req.engine.body
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "use tools"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "look",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    ]
    assert body["response_format"] == {"type": "json_object"} and body["max_tokens"] == 9
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "reasoning_effort": "low"}
    assert body["stream_options"] == {"include_usage": True}
    assert req.needs == ("tools", "thinking")


# --- the id rewrite, the depth check, the model pages ---------------------------------------


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_ids_are_renamed_however_the_stream_is_split(cuts: list[int]) -> None:
    events = (
        b"".join(
            b'data: {"choices":[{"text":"\\"id\\":\\"chatcmpl-x"}],"id":"chatcmpl-abc%d"}\n\n' % i
            for i in range(3)
        )
        + b"data: [DONE]\n\n"
    )
    points = sorted({min(c, len(events)) for c in cuts})
    pieces = [events[a:b] for a, b in zip([0, *points], [*points, len(events)], strict=True)]
    renamer = IdRenamer()
    out = b"".join(renamer.feed(p) for p in pieces) + renamer.close()
    assert out == events.replace(OLD_ID, b'"id":"cmpl-')
    assert out.count(b'"id":"cmpl-abc') == 3 and b'\\"id\\":\\"chatcmpl-x' in out


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=200)
@given(json_values, st.integers(min_value=0, max_value=6))
def test_the_depth_check_agrees_with_the_parsed_depth(value: Any, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert json_depth_exceeds(raw, limit) == (_depth(value) > limit)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"[" * 100_000, "nests deeper than 128 levels"),
        (b'{"a":' * 200 + b"1" + b"}" * 200, "nests deeper than 128 levels"),
        (b'{"temperature": NaN}', "NaN is not a number JSON allows"),
        (b'{"temperature": Infinity}', "Infinity is not a number JSON allows"),
        (b'{"keep_alive": 1e999}', "1e999 is out of range"),
        (b'{"a": "\xff"}', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_bodies_json_cannot_hold_safely_are_refused(raw: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_json_object(raw)
    assert err.value.status == 400 and fragment in err.value.message


def test_anthropic_model_pages() -> None:
    names = [model_lists.ServedName(n, 512) for n in ("a", "b", "c")]
    when = "2026-01-01T00:00:00Z"
    first = model_lists.anthropic_page(names, when, {"limit": "2"})
    assert [m["id"] for m in first["data"]] == ["a", "b"] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == ("a", "b")
    rest = model_lists.anthropic_page(names, when, {"limit": "2", "after_id": "b"})
    assert [m["id"] for m in rest["data"]] == ["c"] and not rest["has_more"]
    before = model_lists.anthropic_page(names, when, {"limit": "1", "before_id": "c"})
    assert [m["id"] for m in before["data"]] == ["b"] and before["has_more"]
    for bad in ({"limit": "0"}, {"limit": "x"}, {"after_id": "nope"}):
        with pytest.raises(ProtocolError):
            model_lists.anthropic_page(names, when, bad)
