"""`GET /api/mcp`: the MCP servers the manifest declares, as serve runs them.

Each server with its transport (stdio or http), state (starting, ready, backoff,
failed, stopped), tool count and names, restarts and last error; never its command
line, environment or URL. Inference scope: a client needs it to know what it may name
in a chat request's `mcp` field (docs/mcp.md); the servers themselves are declared in
the manifest and supervised by serve (`blazar.serve.state.mcp`).
"""

from __future__ import annotations

from aiohttp import web

from blazar.serve.routes.services import Services


def register(app: web.Application, services: Services) -> None:
    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"servers": services.mcp.snapshot()})

    app.router.add_get("/api/mcp", listing)
