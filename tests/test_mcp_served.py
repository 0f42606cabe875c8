"""`[mcp.NAME]` on a live `blazar serve`: supervised, listed, and used by the tool loop.

The MCP server is tests/mcp_weather.py (the `mcp` package's server, over stdio). The
tiny model renders tools (Blazar's `chatml` template) but never calls one, so it shows
the loop's checks and a round with no call; Gemma 3 270M with the same template and a
fixed seed does call `get_weather` (with the pinned engine, seed 17 calls it for Paris
and answers with the report, "sunny"), so the whole loop is seen as a user sees it,
through the official `openai` client: the gateway called the tool, sent its result
back, and the answer used it; the trace shows both rounds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.testing.tiny import write_tiny_model
from tests.serving import Served, processes_mentioning
from tests.test_serve import ENGINE, model_block, write_manifest

WEATHER = str(Path(__file__).with_name("mcp_weather.py"))
ASK = [
    {"role": "system", "content": "Always answer with a <tool_call>."},
    {"role": "user", "content": "Weather in paris?"},
]
SEEDS = (17,)


def mcp_block(name: str, *args: str) -> str:
    return f"[mcp.{name}]\ncommand = {json.dumps([sys.executable, WEATHER, *args])}\n\n"


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, dict(resp.headers), json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


def listing(served: Served) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in served.get("/api/mcp")["servers"]}


def wait_for(what: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_servers_are_supervised_listed_and_checked(tmp_path: Path, blazar_home: Path) -> None:
    (tmp_path / "models").mkdir()
    tiny = write_tiny_model(tmp_path / "models" / "tiny.gguf")
    marker = tmp_path / "calls"
    head = ENGINE + model_block("tiny", tiny, chat_template="chatml")
    text = head + mcp_block("weather", "--marker", str(marker))
    text += '[mcp.nope]\ncommand = ["/nonexistent/mcp-server"]\n\n'
    manifest = write_manifest(tmp_path, text)
    with Served(manifest, blazar_home) as served:
        servers = wait_for(lambda: (s := listing(served))["weather"]["state"] == "ready" and s)
        assert servers["weather"] == {
            "name": "weather",
            "transport": "stdio",
            "state": "ready",
            "tools": 3,
            "tool_names": ["get_weather", "add", "broken"],
            "restarts": 0,
            "last_error": None,
        }
        assert "could not run /nonexistent/mcp-server" in servers["nope"]["last_error"]
        assert "command" not in servers["nope"]  # the listing never shows command lines

        chat = served.url + "/v1/chat/completions"
        hi = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for body, status, says in (
            (
                {**hi, "mcp": ["x"]},
                400,
                "no MCP server 'x' is declared; declared here: nope, weather",
            ),
            ({**hi, "mcp": "weather"}, 400, "expected a list of MCP server names"),
            ({**hi, "mcp": ["nope"]}, 503, "MCP server 'nope'"),
            (
                {
                    **hi,
                    "mcp": ["weather"],
                    "tools": [
                        {
                            "type": "function",
                            "function": {"name": "add", "parameters": {"type": "object"}},
                        }
                    ],
                },
                400,
                "tool 'add' is offered by MCP server 'weather' and by the request's tools",
            ),
        ):
            got, _, answer = post(chat, body)
            assert (got, True) == (status, says in answer["error"]["message"]), answer
        got, _, answer = post(served.url + "/v1/completions", {**hi, "mcp": ["weather"]})
        assert got == 400 and "the tool loop runs on /v1/chat/completions" in str(answer)

        # The tiny model never calls a tool: one round, its answer, and the trace says so.
        got, headers, answer = post(chat, {**hi, "mcp": ["weather"]})
        assert got == 200 and headers["x-blazar-tool-rounds"] == "0", answer
        assert answer["choices"][0]["message"]["content"] and answer["model"] == "tiny"
        trace = served.get(f"/api/why/{headers['x-request-id']}")
        assert trace["tool_rounds"] == [{"finish": "length", "calls": []}]

        # A server that dies is restarted by its owner.
        [pid] = processes_mentioning(str(marker))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: (w := listing(served)["weather"])["state"] == "ready" and w["restarts"])
        assert processes_mentioning(str(marker)) not in ([], [pid])

        # Removed from the manifest: stopped, and gone from the listing.
        manifest.write_text(head)
        wait_for(lambda: not listing(served), timeout=90)
        assert processes_mentioning(str(marker)) == []
        manifest.write_text(head + mcp_block("weather", "--marker", str(marker)))
        wait_for(lambda: listing(served).get("weather", {}).get("state") == "ready", timeout=90)
    assert processes_mentioning(str(marker)) == []  # serve stopped it


def test_the_gateway_runs_the_tool_loop_on_gemma(
    tmp_path: Path, blazar_home: Path, gemma_gguf: Path
) -> None:
    marker = tmp_path / "calls"
    text = ENGINE + model_block("gemma3-270m", gemma_gguf, chat_template="chatml", ctx=2048)
    text += mcp_block("weather", "--only", "get_weather", "--marker", str(marker))
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        wait_for(lambda: listing(served)["weather"]["state"] == "ready")
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        options: dict[str, Any] = {"max_tokens": 30, "temperature": 1.0}
        for seed in SEEDS:
            raw = client.chat.completions.with_raw_response.create(
                model="gemma3-270m",
                messages=ASK,
                seed=seed,  # type: ignore[arg-type]
                extra_body={"mcp": ["weather"]},
                **options,
            )
            if marker.exists():
                break
        else:
            pytest.fail(f"Gemma called get_weather with none of the seeds {SEEDS}")
        reply = raw.parse()
        assert marker.read_text().split()[1:] == ["get_weather", "Paris"]  # the gateway called it
        assert raw.headers["x-blazar-tool-rounds"] == "1"
        text_out = reply.choices[0].message.content or ""
        assert "sunny" in text_out or "21" in text_out, text_out  # it read the tool's result
        assert not reply.choices[0].message.tool_calls
        trace = served.get(f"/api/why/{raw.headers['x-request-id']}")
        [first, last] = trace["tool_rounds"]
        assert [(c["server"], c["tool"], c["error"]) for c in first["calls"]] == [
            ("weather", "get_weather", False)
        ]
        assert last["calls"] == [] and trace["status"] == 200

        # The same, streamed: the loop runs first, then the answer comes as chunks.
        stream = client.chat.completions.create(
            model="gemma3-270m",
            messages=ASK,
            seed=seed,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            extra_body={"mcp": ["weather"]},
            **options,
        )
        chunks = list(stream)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == text_out and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens  # type: ignore[union-attr]
        assert len(marker.read_text().splitlines()) == 2
