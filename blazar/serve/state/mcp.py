"""The MCP servers the manifest declares (`[mcp.NAME]`), as serve runs them.

The daemon hands `configure` the manifest's tables on every pass: a new server is
started (its owner, `blazar.serve.supervisor.mcp_server.McpServer`, restarts it with
backoff from then on), a changed one is stopped and started again, a removed one is
stopped; `close` stops them all when serve stops, so none is left running. Keys named
by `key_env` are read from serve's environment here, when the server is (re)made.
`GET /api/mcp` shows `snapshot()`; the tool loop (`blazar.serve.request.tool_loop`)
finds servers by name with `get`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blazar.serve.supervisor.mcp_server import McpServer, McpSpec
from specs.mcp import McpServer as Declared


def spec_of(name: str, declared: Declared, log_dir: Path | None) -> McpSpec:
    key = os.environ.get(declared.key_env) or None if declared.key_env else None
    log = log_dir / f"mcp-{name}.log" if log_dir is not None else None
    return McpSpec(
        name,
        tuple(declared.command),
        tuple(sorted(declared.env.items())),
        declared.url,
        key,
        declared.timeout,
        log,
    )


class McpServers:
    """Every declared MCP server, by name, each with its owner."""

    def __init__(self, log_dir: Path | None = None, **options: Any) -> None:
        self.log_dir = log_dir
        self.options = options  # backoff, health_every, grace: for McpServer
        self.servers: dict[str, McpServer] = {}

    async def configure(self, declared: Mapping[str, Declared]) -> dict[str, str]:
        """Make the running servers the declared ones; what changed, by name."""
        wanted = {name: spec_of(name, table, self.log_dir) for name, table in declared.items()}
        changes: dict[str, str] = {}
        stale = [n for n, s in self.servers.items() if wanted.get(n) != s.spec]
        await asyncio.gather(*(self.servers[n].close() for n in stale))
        for name in stale:
            del self.servers[name]
            changes[name] = "stopped" if name not in wanted else "restarted"
        for name, spec in wanted.items():
            if name not in self.servers:
                self.servers[name] = server = McpServer(spec, **self.options)
                server.start()
                changes.setdefault(name, "started")
        return changes

    def get(self, name: str) -> McpServer | None:
        return self.servers.get(name)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each server as `GET /api/mcp` shows it: no command line, env or URL."""
        return [
            {
                "name": name,
                "transport": server.spec.transport,
                "state": str(server.state),
                "tools": len(server.tools),
                "tool_names": [t.name for t in server.tools],
                "restarts": server.restarts,
                "last_error": server.last_error,
            }
            for name, server in sorted(self.servers.items())
        ]

    async def close(self) -> None:
        servers = list(self.servers.values())
        self.servers.clear()
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
