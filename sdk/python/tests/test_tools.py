"""The tool loop: definitions from functions, one call run, and whole loops on Gemma 3 270M.

The tiny model's word soup never calls a tool, so the loops run on Gemma with
Blazar's `chatml` template (which renders tools; llama.cpp parses its
`<tool_call>` output back into tool calls), seeded: with the pinned engine,
seed 11 calls `get_weather` for Paris and then answers with the temperature the
tool returned (seed 5 does the same with "sunny"; the test takes the first
seed that calls it, so a different CPU's rounding does not break it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, Optional

import pytest

from blazar_sdk import Client, ToolError, ToolLoopError, function_tool
from blazar_sdk.chat import _Calls, chat_body, delta
from blazar_sdk.tools import prepare_tools, run_call
from blazar_sdk.types import ToolCallDelta
from conftest import GEMMA

ASK = [
    {"role": "system", "content": "Always answer with a <tool_call>."},
    {"role": "user", "content": "Weather in paris?"},
]
SEEDS = (11, 5)
REPORT = "sunny, 21C"
SEEN = ("21", "sunny")  # what an answer that used the report says


def get_weather(city: str) -> str:
    """The weather in a city"""
    return REPORT


def test_a_function_becomes_a_tool_definition() -> None:
    def search(
        query: str,
        limit: int = 5,
        tags: list[str] | None = None,
        mode: Literal["fast", "deep"] = "fast",
        size: Optional[float] = None,  # noqa: UP045
        **extra: Any,
    ) -> list[str]:
        """Search the notes.

        Longer text that is not part of the description."""
        return []

    assert function_tool(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "mode": {"enum": ["fast", "deep"]},
                    "size": {"type": "number"},
                },
                "required": ["query"],
            },
        },
    }
    definitions, handlers = prepare_tools([get_weather, {"type": "function"}], {"x": print})
    assert definitions == [function_tool(get_weather), {"type": "function"}]
    assert handlers == {"x": print, "get_weather": get_weather}
    assert prepare_tools([{"type": "function"}], None) == ([{"type": "function"}], None)
    with pytest.raises(ValueError, match="tool_handlers without tools"):
        prepare_tools(None, {"x": print})


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_one_call_is_run_or_refused_with_what_to_do() -> None:
    handlers = {"get_weather": get_weather, "count": lambda n: {"n": n + 1}}
    assert run_call(call("get_weather", '{"city": "Paris"}'), handlers) == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": REPORT,
    }
    assert run_call(call("count", '{"n": 1}'), handlers)["content"] == '{"n": 2}'
    for bad, says in (
        (call("nope", "{}"), "which has no handler (handlers: count, get_weather)"),
        (call("count", '{"n": '), "arguments that are not JSON"),
        (call("count", "[1]"), "arguments that are not an object"),
        (call("count", '{"n": "x"}'), "tool 'count' raised TypeError"),
    ):
        with pytest.raises(ToolError) as refused:
            run_call(bad, handlers)
        assert says in str(refused.value) and refused.value.tool == bad["function"]["name"]


def test_stream_pieces_are_put_together_into_calls() -> None:
    calls = _Calls()
    for piece in (
        ToolCallDelta(0, id="a", name="get_weather"),
        ToolCallDelta(1, id="b", name="count", arguments="{}"),
        ToolCallDelta(0, arguments='{"city":'),
        ToolCallDelta(0, arguments=' "Paris"}'),
    ):
        calls.feed(piece)
    whole = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls.whole()]
    assert whole == [("a", "get_weather", '{"city": "Paris"}'), ("b", "count", "{}")]
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}
    assert delta(role, 0) is None
    usage = {"choices": [], "usage": {"total_tokens": 3}}
    assert delta(usage, 2) is not None and delta(usage, 2).usage == {"total_tokens": 3}  # type: ignore[union-attr]


def test_the_request_body() -> None:
    tools = [function_tool(get_weather)]
    body = chat_body("m", [], tools, {"max_tokens": 3}, stream=True, logprobs=True, mcp=["files"])
    assert body == {
        "model": "m",
        "messages": [],
        "max_tokens": 3,
        "tools": tools,
        "mcp": ["files"],
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with pytest.raises(TypeError, match="mcp: expected a list"):
        chat_body("m", [], None, {}, mcp="files")


def seeded(run: Any) -> Iterator[tuple[int, list[str], Any]]:
    """Run `run(seed, calls)` for each seed until the model called the tool."""
    for seed in SEEDS:
        calls: list[str] = []
        outcome = run(seed, calls)
        if calls:
            yield seed, calls, outcome
            return
    raise AssertionError(f"Gemma called get_weather with none of the seeds {SEEDS}")


def test_the_loop_runs_the_tool_and_the_model_answers_with_its_result(client: Client) -> None:
    def run(seed: int, calls: list[str]) -> Any:
        def get_weather(city: str) -> str:
            """The weather in a city"""
            calls.append(city)
            return REPORT

        return client.chat(
            GEMMA, ASK, tools=[get_weather], max_tokens=30, temperature=1.0, seed=seed
        )

    [(seed, calls, result)] = list(seeded(run))
    assert [c.lower() for c in calls] == ["paris"]
    assert result.rounds == 2 and not result.tool_calls and len(result.trace_ids) == 2
    asked, answered, sent_back = result.messages[2], result.messages[-1], result.messages[3]
    assert asked["tool_calls"][0]["function"]["name"] == "get_weather"
    assert sent_back == {
        "role": "tool",
        "tool_call_id": asked["tool_calls"][0]["id"],
        "content": REPORT,
    }
    assert answered == {"role": "assistant", "content": result.text}
    assert any(word in result.text for word in SEEN), (seed, result.text)

    # The same loop, streamed: the call arrives in pieces, the result is sent, the answer
    # streams in the second round.
    with client.chat(
        GEMMA, ASK, tools=[get_weather], stream=True, max_tokens=30, temperature=1.0, seed=seed
    ) as stream:
        deltas = list(stream)
    pieces = [p for d in deltas for p in d.tool_calls]
    assert pieces and pieces[0].name == "get_weather" and deltas[0].round == 0
    assert '"city"' in "".join(p.arguments for p in pieces)
    [results] = [d.tool_results for d in deltas if d.tool_results]
    assert results[0]["content"] == REPORT
    assert [d.round for d in deltas if d.usage] == [0, 1]
    assert stream.text == result.text and len(stream.trace_ids) == 2


def test_a_missing_or_failing_handler_and_a_loop_that_goes_on_are_clear_errors(
    client: Client,
) -> None:
    seed = SEEDS[0]
    options: dict[str, Any] = {"max_tokens": 30, "temperature": 1.0, "seed": seed}
    definition = function_tool(get_weather)

    def broken(city: str) -> str:
        raise RuntimeError("the weather service is down")

    with pytest.raises(ToolError) as missing:
        client.chat(GEMMA, ASK, tools=[definition], tool_handlers={"other": broken}, **options)
    assert "'get_weather', which has no handler (handlers: other)" in str(missing.value)
    with pytest.raises(ToolError) as failing:
        client.chat(
            GEMMA, ASK, tools=[definition], tool_handlers={"get_weather": broken}, **options
        )
    assert "tool 'get_weather' raised RuntimeError: the weather service is down" in str(
        failing.value
    )
    assert isinstance(failing.value.__cause__, RuntimeError)
    with pytest.raises(ToolLoopError) as endless:
        client.chat(GEMMA, ASK, tools=[get_weather], max_tool_rounds=0, **options)
    assert "after 0 rounds" in str(endless.value)
    assert endless.value.messages[-1]["tool_calls"]  # the call it was still making


# With the MCP server's own definition of get_weather (tests/mcp_weather.py) seed 17 calls
# it on a fresh serve; earlier requests on the slot change the numbers a little, so the
# test takes the first seed whose answer the gateway made with a call
# (tests/test_mcp_served.py checks the answer reads the report, on a serve of its own).
MCP_SEEDS = (17, 2, 12, 45, 23)


def test_the_gateway_runs_the_loop_with_mcp_tools(client: Client) -> None:
    """`mcp=["weather"]`: the gateway offers the server's tools and calls them itself; the
    SDK sees one request, the final answer, and no tool call of its own to run."""
    for seed in MCP_SEEDS:
        result = client.chat(GEMMA, ASK, mcp=["weather"], max_tokens=30, temperature=1.0, seed=seed)
        rounds = client.explain(result.trace_id)["tool_rounds"]
        if rounds[0]["calls"]:
            break
    else:
        raise AssertionError(f"Gemma called get_weather with none of the seeds {MCP_SEEDS}")
    assert result.rounds == 1 and not result.tool_calls
    assert [c["tool"] for c in rounds[0]["calls"]] == ["get_weather"]
    assert not rounds[0]["calls"][0]["error"]
    with client.chat(
        GEMMA, ASK, mcp=["weather"], stream=True, max_tokens=30, temperature=1.0, seed=seed
    ) as stream:
        streamed = "".join(d.content or "" for d in stream)
    assert streamed and len(stream.trace_ids) == 1
