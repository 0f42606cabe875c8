"""The gateway's tool loop: a chat request's `mcp` field, carried out with MCP tools.

A `/v1/chat/completions` request with `"mcp": ["NAME", ...]` names `[mcp.NAME]`
servers (`blazar.serve.state.mcp`). The route's `Ask` comes here instead of to
`Pipeline.serve` (`blazar.serve.routes.services.PipelineRoute`), and:

1. the names are checked (declared, each READY or started now: a server that is not
   is a 503 naming what went wrong), the model resolved with the request's key (this
   host's models only), the servers' tools added to the request's own (a name offered
   twice is a 400);
2. each round is a whole engine request on the one request path
   (`Pipeline.complete`, with the request's priority and keep_alive; the trace notes
   each exchange), and when the model's answer calls MCP tools, the gateway calls them
   (at once, each within its server's timeout), appends the assistant's message and
   one `tool` message per call, and asks again. A tool's error, a call that fails or
   arguments that are not JSON go back to the model as that tool's result;
3. the loop ends when the model answers without calling tools, calls a tool of the
   client's own (the answer goes back as it is, for the client to run it), or after
   MAX_ROUNDS rounds of calls (the last answer, its calls unrun). The client gets that
   answer (usage summed over the rounds; `x-blazar-tool-rounds` says how many rounds
   ran), whole or, when it asked for a stream, as chat.completion.chunk events once
   the loop is done. The trace records each round (`Trace.tool_round`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from blazar.observe.trace import current
from blazar.protocols import ProtocolError, mcp
from blazar.serve.http import wants_priority
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.state.mcp import McpServers
from blazar.serve.state.remotes import Forward
from blazar.serve.supervisor.mcp_server import McpServer, McpUnavailable

MAX_ROUNDS = 8  # rounds of tool calls before the model's last answer is returned as is
ROUTES = ("/v1/chat/completions",)
ROUNDS = "x-blazar-tool-rounds"


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, f"mcp: {message}", "invalid_request_error")


def names_of(value: Any, declared: list[str]) -> list[str]:
    """The request's `mcp` field: a list of declared servers' names."""
    known = ", ".join(declared) or "none ([mcp.NAME] in the manifest declares one)"
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise _bad(f"expected a list of MCP server names; declared here: {known}")
    for name in value:
        if name not in declared:
            raise _bad(f"no MCP server '{name}' is declared; declared here: {known}")
    return list(dict.fromkeys(value))


def offered(
    servers: dict[str, McpServer], own: Any
) -> tuple[list[dict[str, Any]], dict[str, McpServer]]:
    """The request's tools with the servers' added, and which server has each tool."""
    tools = list(own) if isinstance(own, list) else []
    taken = {
        t.get("function", {}).get("name"): "the request's tools"
        for t in tools
        if isinstance(t, dict)
    }
    owners: dict[str, McpServer] = {}
    for name, server in servers.items():
        for tool in server.tools:
            if tool.name in taken:
                raise _bad(
                    f"tool '{tool.name}' is offered by MCP server '{name}' and by "
                    f"{taken[tool.name]}; name fewer servers, or rename the tool"
                )
            taken[tool.name] = f"MCP server '{name}'"
            owners[tool.name] = server
            tools.append(mcp.function_tool(tool))
    return tools, owners


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return total
    if total is None:
        return dict(usage)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if isinstance(usage.get(key), int):
            total[key] = int(total.get(key) or 0) + usage[key]
    return total


class ToolLoop:
    """The loop for one gateway: its pipeline and its MCP servers."""

    def __init__(self, pipeline: Pipeline, servers: McpServers) -> None:
        self.pipeline, self.servers = pipeline, servers

    async def serve(self, request: web.Request, ask: Ask) -> web.StreamResponse:
        if ask.path not in ROUTES:
            raise _bad(f"the tool loop runs on {', '.join(ROUTES)}, not {ask.path}")
        body = dict(ask.body)
        names = names_of(body.pop("mcp"), sorted(self.servers.servers))
        where = self.pipeline.resolve(request, ask.model)
        if isinstance(where, Forward):
            raise _bad(
                f"model '{ask.model}' is served by remote '{where.remote.name}'; the tool "
                "loop runs on this host's models"
            )
        servers = {n: s for n in names if (s := self.servers.get(n)) is not None}
        results = await asyncio.gather(
            *(s.ensure_ready() for s in servers.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, McpUnavailable):
                raise ProtocolError(503, f"mcp: {result}", "mcp_unavailable")
            if isinstance(result, BaseException):
                raise result
        tools, owners = offered(servers, body.get("tools"))
        stream = body.pop("stream", False) is True
        include_usage = bool((body.pop("stream_options", None) or {}).get("include_usage"))
        body["tools"] = tools
        answer, rounds = await self._rounds(request, ask, body, owners)
        headers = {**ask.envelope.headers(request), ROUNDS: str(rounds)}
        if not stream:
            return web.json_response(answer, headers=headers)
        return await _as_stream(request, answer, include_usage, headers)

    async def _rounds(
        self, request: web.Request, ask: Ask, body: dict[str, Any], owners: dict[str, McpServer]
    ) -> tuple[dict[str, Any], int]:
        messages = list(body.get("messages") or [])
        priority = wants_priority(request)
        keep_alive = steps.keep_alive(request.headers, ask.body)
        trace = current()
        usage: dict[str, Any] | None = None
        for done in range(MAX_ROUNDS + 1):
            sent = {**body, "messages": messages}
            round_ask = replace(ask, body=sent, raw=None, shareable=False)
            answer = await self.pipeline.complete(
                round_ask, priority=priority, keep_alive=keep_alive
            )
            usage = add_usage(usage, answer.get("usage"))
            choice = (answer.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            ours = calls and all(c.get("function", {}).get("name") in owners for c in calls)
            if not ours or done == MAX_ROUNDS:
                if trace is not None:
                    trace.tool_round([], choice.get("finish_reason"))
                if usage is not None:
                    answer["usage"] = usage
                return answer, done
            noted: list[dict[str, Any]] = []
            replies = await asyncio.gather(*(self._call(c, owners, noted) for c in calls))
            if trace is not None:
                trace.tool_round(noted, choice.get("finish_reason"))
            messages.append(
                {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
            )
            messages.extend(replies)
        raise AssertionError("unreachable")

    @staticmethod
    async def _call(
        call: dict[str, Any], owners: dict[str, McpServer], noted: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Run one tool call; its `tool` message, with the error as the result if any."""
        function = call.get("function") or {}
        name = str(function.get("name"))
        server = owners[name]
        began = time.perf_counter()
        failed = True
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            text = f"Error: the arguments are not a JSON object ({exc}); call {name} again"
        else:
            try:
                text, failed = await server.call_tool(name, arguments)
            except (McpUnavailable, mcp.McpProtocolError) as exc:
                text = f"Error: the tool could not be called: {exc}"
            else:
                if failed and not text.lower().startswith("error"):
                    text = f"Error: {text}"
        noted.append(
            {
                "server": server.spec.name,
                "tool": name,
                "error": failed,
                "ms": round((time.perf_counter() - began) * 1000, 1),
            }
        )
        return {"role": "tool", "tool_call_id": call.get("id") or name, "content": text}


async def _as_stream(
    request: web.Request, answer: dict[str, Any], include_usage: bool, headers: dict[str, str]
) -> web.StreamResponse:
    """A whole chat completion as OpenAI's stream of chunks (the loop is done by now)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)
    created = answer.get("created") or int(time.time())
    base = {
        "id": answer.get("id"),
        "object": "chat.completion.chunk",
        "created": created,
        "model": answer.get("model"),
    }
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
    finish = choice.get("finish_reason")
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": answer.get("usage")})
    for chunk in chunks:
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
