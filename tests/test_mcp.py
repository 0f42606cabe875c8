"""MCP servers under their owner, and the tool loop's parts, with real servers.

The servers are tests/mcp_weather.py, written with the `mcp` package (the reference
SDK), over stdio (a child the owner spawns) and streamable HTTP (a process the test
runs on loopback): Blazar's own client must speak to both. Faults are the server's
own: it exits after N calls, its command does not exist.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blazar.protocols import ProtocolError, mcp
from blazar.serve.request.tool_loop import ToolLoop, names_of, offered
from blazar.serve.state.mcp import McpServers
from blazar.serve.supervisor.mcp_server import McpServer, McpSpec, McpState, McpUnavailable
from blazar.testing.ports import free_port
from specs.mcp import McpServer as Declared
from tests.serving import processes_mentioning

WEATHER = str(Path(__file__).with_name("mcp_weather.py"))


def stdio(tmp_path: Path, *args: str, name: str = "weather") -> McpSpec:
    command = (sys.executable, WEATHER, "--marker", str(tmp_path / "calls"), *args)
    return McpSpec(name, command, timeout=30, log_path=tmp_path / f"{name}.log")


def calls(tmp_path: Path) -> list[str]:
    marker = tmp_path / "calls"
    return marker.read_text().splitlines() if marker.exists() else []


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, WEATHER, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_stdio_server_is_owned_restarted_and_stopped(tmp_path: Path) -> None:
    async def main() -> None:
        server = McpServer(stdio(tmp_path, "--exit-after", "2"), backoff=(0.1, 0.2))
        await server.ensure_ready()
        first = server.pid
        assert server.state is McpState.READY and first is not None
        assert [t.name for t in server.tools] == ["get_weather", "add", "broken"]
        assert await server.call_tool("add", {"a": 2, "b": 40}) == ("42", False)
        with pytest.raises(mcp.McpProtocolError, match="closed its output"):
            await server.call_tool("get_weather", {"city": "Oslo"})  # it exits on this one
        for _ in range(400):
            await asyncio.sleep(0.02)
            if server.state is McpState.READY and server.pid != first:
                break
        assert server.state is McpState.READY and server.restarts == 1, server.last_error
        assert "exited with code 3: exiting after 2 calls" in (server.last_error or "")
        assert await server.call_tool("get_weather", {"city": "Rome"}) == ("sunny, 21C", False)
        assert calls(tmp_path)[-1].endswith("get_weather Rome")
        await server.close()
        assert server.state is McpState.STOPPED and server.pid is None
        assert processes_mentioning(str(tmp_path / "calls")) == []
        with pytest.raises(McpUnavailable):
            await server.ensure_ready()

    asyncio.run(main())


def test_a_server_that_cannot_start_says_why_and_gives_up(tmp_path: Path) -> None:
    async def main() -> None:
        spec = McpSpec(
            "nope", ("/nonexistent/mcp-server",), timeout=5, log_path=tmp_path / "nope.log"
        )
        server = McpServer(spec, backoff=(0.05,))
        with pytest.raises(McpUnavailable, match="could not run /nonexistent/mcp-server"):
            await server.ensure_ready()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if server.state is McpState.FAILED:
                break
        assert server.state is McpState.FAILED and server.restarts == 1
        with pytest.raises(McpUnavailable, match="No such file"):  # a fresh try, and its error
            await server.ensure_ready()
        await server.close()

        silent = McpSpec(
            "silent",
            (sys.executable, "-c", "import time; time.sleep(60)"),
            timeout=0.5,
            log_path=tmp_path / "silent.log",
        )
        server = McpServer(silent, backoff=())
        with pytest.raises(McpUnavailable, match=r"start failed: did not answer within 0\.5 s"):
            await server.ensure_ready()
        await server.close()
        assert processes_mentioning("time.sleep(60)") == []

    asyncio.run(main())


def test_a_streamable_http_server(http_server: str, tmp_path: Path) -> None:
    async def main() -> None:
        server = McpServer(McpSpec("remote", url=http_server, timeout=30))
        await server.ensure_ready()
        assert server.spec.transport == "http" and len(server.tools) == 3
        assert await server.call_tool("add", {"a": 1, "b": 2}) == ("3", False)
        text, failed = await server.call_tool("broken", {})
        assert failed and "broken" in text
        await server.close()

    asyncio.run(main())


def test_the_registry_follows_the_manifest(tmp_path: Path) -> None:
    async def main() -> None:
        servers = McpServers(tmp_path, backoff=(0.1,))
        command = [sys.executable, WEATHER, "--marker", str(tmp_path / "calls")]
        one = {"weather": Declared(command=command)}
        assert await servers.configure(one) == {"weather": "started"}
        weather = servers.get("weather")
        assert weather is not None
        await weather.ensure_ready()
        assert await servers.configure(one) == {}  # unchanged: not restarted
        [row] = servers.snapshot()
        assert row == {
            "name": "weather",
            "transport": "stdio",
            "state": "ready",
            "tools": 3,
            "tool_names": ["get_weather", "add", "broken"],
            "restarts": 0,
            "last_error": None,
        }
        changed = {"weather": Declared(command=[*command, "--only", "add"])}
        assert await servers.configure(changed) == {"weather": "restarted"}
        restarted = servers.get("weather")
        assert restarted is not None and restarted is not weather
        await restarted.ensure_ready()
        assert [t.name for t in restarted.tools] == ["add"]
        assert processes_mentioning(str(tmp_path / "calls")) == [restarted.pid]
        assert await servers.configure({}) == {"weather": "stopped"}
        assert servers.snapshot() == [] and processes_mentioning(str(tmp_path / "calls")) == []
        await servers.close()

    asyncio.run(main())


def test_the_loop_s_checks_and_a_tool_s_error_goes_back_as_its_result(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="no MCP server 'x' is declared; declared here: a, b"):
        names_of(["x"], ["a", "b"])
    with pytest.raises(ProtocolError, match="expected a list of MCP server names"):
        names_of("a", ["a"])
    assert names_of(["a", "a"], ["a"]) == ["a"]
    assert mcp.untitled(
        {
            "title": "T",
            "type": "object",
            "properties": {"title": {"title": "Title", "type": "string"}},
        }
    ) == {"type": "object", "properties": {"title": {"type": "string"}}}

    async def main() -> None:
        server = McpServer(stdio(tmp_path))
        await server.ensure_ready()
        own = [{"type": "function", "function": {"name": "add"}}]
        with pytest.raises(ProtocolError, match="tool 'add' is offered by MCP server 'weather'"):
            offered({"weather": server}, own)
        tools, owners = offered({"weather": server}, None)
        assert [t["function"]["name"] for t in tools] == ["get_weather", "add", "broken"]
        assert tools[0]["function"]["parameters"] == {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }
        noted: list[dict[str, Any]] = []

        def call(name: str, arguments: str) -> dict[str, Any]:
            return {
                "id": f"c-{name}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }

        replies = await asyncio.gather(
            ToolLoop._call(call("broken", "{}"), owners, noted),
            ToolLoop._call(call("add", '{"a": 1, "b": 2}'), owners, noted),
            ToolLoop._call(call("add", '{"a": 1,'), owners, noted),
        )
        assert replies[0]["tool_call_id"] == "c-broken"
        assert replies[0]["content"] == "Error executing tool broken"  # the server's words
        assert replies[1] == {"role": "tool", "tool_call_id": "c-add", "content": "3"}
        assert "the arguments are not a JSON object" in replies[2]["content"]
        assert sorted((n["tool"], n["error"]) for n in noted) == [
            ("add", False),
            ("add", True),
            ("broken", True),
        ]
        assert calls(tmp_path) and all("add 1," not in c for c in calls(tmp_path))
        await server.close()

    asyncio.run(main())
