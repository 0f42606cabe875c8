"""The Model Context Protocol, as Blazar's gateway speaks it to MCP servers: pure.

MCP is JSON-RPC 2.0: over a server's stdin and stdout one message per line, over
streamable HTTP one POST per message (the answer as JSON, or as server-sent events).
A client `initialize`s (protocol version, its capabilities: none here), says
`notifications/initialized`, lists `tools/list` (paged by `nextCursor`) and calls
`tools/call`; `ping` checks the server is alive. What the server asks of the client
(sampling, roots) is refused with JSON-RPC's "method not found".

`blazar.serve.supervisor.mcp_link` sends these bytes; `blazar.serve.request.tool_loop`
offers the tools to a model as OpenAI function definitions (`function_tool`) and sends
a call's result back as the tool message's text (`result_text`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

PROTOCOL_VERSION = "2025-06-18"
CLIENT_INFO = {"name": "blazar", "version": "0.1.0"}
METHOD_NOT_FOUND = -32601


class McpProtocolError(Exception):
    """A message that is not MCP, or an error answer (`code` is JSON-RPC's)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Tool:
    """One tool a server offers: its name, description and JSON Schema of arguments."""

    name: str
    description: str
    schema: dict[str, Any]


def request(msg_id: int, method: str, params: Mapping[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        body["params"] = dict(params)
    return orjson.dumps(body)


def notification(method: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method})


def method_not_found(msg_id: Any, method: str) -> bytes:
    """The answer to a request the server sends that Blazar does not serve."""
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "error": {"code": METHOD_NOT_FOUND, "message": f"the client does not offer {method}"},
        }
    )


def initialize_params() -> dict[str, Any]:
    return {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}


def parse(data: bytes | str) -> dict[str, Any]:
    """One JSON-RPC message, or McpProtocolError for anything else."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data[:200] if isinstance(data, str) else data[:200].decode(errors="replace")
        raise McpProtocolError(f"not a JSON-RPC message: {text!r}") from None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise McpProtocolError(f"not a JSON-RPC 2.0 message: {str(message)[:200]}")
    return message


def outcome(message: Mapping[str, Any]) -> Any:
    """A response's result, or its error raised."""
    if "error" in message:
        error = message["error"] if isinstance(message["error"], Mapping) else {}
        raise McpProtocolError(str(error.get("message") or error), error.get("code"))
    return message.get("result")


def tools_page(result: Any) -> tuple[list[Tool], str | None]:
    """The tools of one `tools/list` answer and the cursor of the next page (None: last)."""
    if not isinstance(result, Mapping) or not isinstance(result.get("tools"), list):
        raise McpProtocolError("tools/list answered without a list of tools")
    tools = []
    for item in result["tools"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise McpProtocolError(f"tools/list gave a tool without a name: {str(item)[:200]}")
        schema = item.get("inputSchema")
        tools.append(
            Tool(
                item["name"],
                str(item.get("description") or ""),
                dict(schema) if isinstance(schema, Mapping) else {"type": "object"},
            )
        )
    cursor = result.get("nextCursor")
    return tools, cursor if isinstance(cursor, str) and cursor else None


def untitled(schema: Any) -> Any:
    """A JSON Schema without its `title` annotations (pydantic, and so the `mcp` package,
    titles every schema and property: words a model reads in its prompt for nothing;
    they mean nothing to validation). A property named "title" is kept."""
    if isinstance(schema, list):
        return [untitled(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
            value, dict
        ):
            out[key] = {name: untitled(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"):
            out[key] = untitled(value)
        else:
            out[key] = value
    return out


def function_tool(tool: Tool) -> dict[str, Any]:
    """The tool as an OpenAI chat tool definition (its schema `untitled`)."""
    function: dict[str, Any] = {"name": tool.name, "parameters": untitled(tool.schema)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def result_text(result: Any) -> tuple[str, bool]:
    """A `tools/call` result as the text a model reads, and whether it is an error: text
    parts joined, structured content as JSON when there is no text, other parts named."""
    if not isinstance(result, Mapping):
        return "the tool answered nothing", True
    parts: list[str] = []
    for item in result.get("content") or []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "text":
            parts.append(str(item.get("text", "")))
        elif kind == "resource" and isinstance(item.get("resource"), Mapping):
            parts.append(str(item["resource"].get("text") or f"[resource {item['resource']}]"))
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.get("structuredContent") is not None:
        parts.append(orjson.dumps(result["structuredContent"]).decode())
    return "\n".join(parts), bool(result.get("isError"))
