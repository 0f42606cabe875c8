"""Blazar's own routes on the gateway: `/`, `/health`, `/api/blazar/ps`, `/api/blazar/stop`.

`blazar ps` and `blazar stop` (`blazar.cli.serve`) call the last two; load
balancers and `blazar serve`'s callers probe `/health`.
"""

from __future__ import annotations

from aiohttp import web

from blazar import __version__
from blazar.protocols import ProtocolError
from blazar.serve import pipeline
from blazar.serve.grants import sees
from blazar.serve.http import read_json
from blazar.serve.services import Services


def register(app: web.Application, services: Services) -> None:
    """Add Blazar's own routes to the gateway's app."""
    api = BlazarAPI(services)
    app.router.add_get("/", api.root)
    app.router.add_get("/health", api.health)
    app.router.add_get("/api/blazar/ps", api.ps)
    app.router.add_post("/api/blazar/stop", api.stop)


class BlazarAPI:
    def __init__(self, services: Services) -> None:
        self.services = services

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Blazar is running\n")

    async def health(self, request: web.Request) -> web.Response:
        """200 once serve's first pass has made its models servable; 503 `starting` before
        (the port opens first, so a client can tell starting from absent)."""
        if self.services.scheduler.starting:
            return web.json_response(
                {"status": "starting", "version": __version__},
                status=503,
                headers={"Retry-After": "1"},
            )
        return web.json_response({"status": "ok", "version": __version__})

    async def ps(self, request: web.Request) -> web.Response:
        scheduler = self.services.scheduler
        rows = [  # a key lists only the models it may use
            row
            for row in scheduler.snapshot()
            if sees(
                request, row["model"], getattr(scheduler.runtimes.get(row["model"]), "aliases", ())
            )
        ]
        return web.json_response({"instances": rows})

    async def stop(self, request: web.Request) -> web.Response:
        model = (await read_json(request)).get("model")
        if not isinstance(model, str) or not model:
            raise ProtocolError(400, 'send {"model": NAME}')
        pipeline.resolve(self.services.scheduler, model, request)  # 404 as for any model route
        stopped = await self.services.scheduler.stop_model(model)
        return web.json_response({"model": model, "stopped": stopped})
