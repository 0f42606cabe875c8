"""The response cache's admin API (docs/cache.md): `GET /api/blazar/cache` (its figures:
entries, bytes, hits and misses per tier, evictions by reason, the hit ratio, entries per
model) and `POST /api/blazar/cache/clear` (`{"model": NAME, "key": NAME}`, either or
neither: all). `blazar cache stats|clear` (`blazar.cli.cache`) call them; both are admin
scope (`blazar.serve.gateway.access.SCOPES`)."""

from __future__ import annotations

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve.http import read_json
from blazar.serve.routes.services import Services


def register(app: web.Application, services: Services) -> None:
    cache = services.pipeline.cache

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"enabled": services.serving.cache.enabled, **cache.stats()})

    async def clear(request: web.Request) -> web.Response:
        body = await read_json(request)
        model, key = body.get("model"), body.get("key")
        for name, value in (("model", model), ("key", key)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ProtocolError(400, f"'{name}' must be a name (a non-empty string)")
        return web.json_response({"cleared": cache.clear(model, key)})

    app.router.add_get("/api/blazar/cache", stats)
    app.router.add_post("/api/blazar/cache/clear", clear)
