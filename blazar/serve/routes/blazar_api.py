"""Blazar's own routes on the gateway: `/`, `/health`, `/api/blazar/ps`, `/api/blazar/stop`,
`/api/blazar/coreside`.

`blazar ps`, `blazar stop` (`blazar.cli.serve`) and `blazar coreside`
(`blazar.cli.coreside`) call the last three (`ps` lists the models served from remotes
too, marked with `remote`); load balancers, `blazar serve`'s callers and other Blazars'
fleet probes read `/health`.
"""

from __future__ import annotations

from aiohttp import web

from blazar import __version__
from blazar.protocols import ProtocolError
from blazar.serve.http import read_json
from blazar.serve.request.grants import sees
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import Remote
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.runtime import resolve as resolve_name


def register(app: web.Application, services: Services) -> None:
    """Add Blazar's own routes to the gateway's app."""
    api = BlazarAPI(services)
    app.router.add_get("/", api.root)
    app.router.add_get("/health", api.health)
    app.router.add_get("/api/blazar/ps", api.ps)
    app.router.add_post("/api/blazar/stop", api.stop)
    app.router.add_get("/api/blazar/coreside", api.coreside)


def _local(runtimes: dict[str, ModelRuntime], name: str) -> bool:
    try:
        resolve_name(runtimes, name)
    except KeyError:
        return False
    return True


def remote_row(name: str, remote: Remote) -> dict[str, object]:
    """A remote model as `ps` lists it: no pid or port here, the remote and its health."""
    return {
        "model": name,
        "replica": None,
        "engine": None,
        "lane": None,
        "pid": None,
        "port": None,
        "slots": None,
        "ctx": None,
        "in_flight": None,
        "queued": None,
        "keep_alive_remaining": None,
        "pinned": False,
        "state": str(remote.health) if not remote.drained else "drained",
        "retired": False,
        "size": None,
        "remote": remote.name,
        "url": remote.url,
        "spec": None,
        "profile": [],
    }


class BlazarAPI:
    def __init__(self, services: Services) -> None:
        self.services = services

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Blazar is running\n")

    async def health(self, request: web.Request) -> web.Response:
        """200 once serve's first pass has made its models servable; 503 `starting` before
        (the port opens first, so a client can tell starting from absent). `server` tells
        another Blazar's fleet probe to forward in the client's protocol."""
        if self.services.scheduler.starting:
            return web.json_response(
                {"status": "starting", "version": __version__, "server": "blazar"},
                status=503,
                headers={"Retry-After": "1"},
            )
        return web.json_response({"status": "ok", "version": __version__, "server": "blazar"})

    async def ps(self, request: web.Request) -> web.Response:
        scheduler = self.services.scheduler
        rows = [  # a key lists only the models it may use
            row
            for row in scheduler.snapshot()
            if sees(
                request, row["model"], getattr(scheduler.runtimes.get(row["model"]), "aliases", ())
            )
        ]
        local = self.services.scheduler.runtimes
        for name, remote in self.services.fleet.listing(lambda n: _local(local, n)):
            if sees(request, name, ()):
                rows.append(remote_row(name, remote))
        pegged = {  # warm pegs held (models.NAME.warm_peg): their files' bytes
            model: size
            for model, size in scheduler.pegs.sizes().items()
            if sees(request, model, getattr(scheduler.runtimes.get(model), "aliases", ()))
        }
        return web.json_response({"instances": rows, "pegs": pegged})

    async def coreside(self, request: web.Request) -> web.Response:
        """Which models can be resident at once and where; with `?load=MODEL` (repeated),
        whether those fit together and what loading each now would evict."""
        asked = request.query.getall("load", [])
        answer = self.services.scheduler.coreside(asked)  # 404 for an unknown model
        return web.json_response(answer.to_json())

    async def stop(self, request: web.Request) -> web.Response:
        model = (await read_json(request)).get("model")
        if not isinstance(model, str) or not model:
            raise ProtocolError(400, 'send {"model": NAME}')
        self.services.pipeline.resolve_here(request, model)  # 404 as for any model route
        stopped = await self.services.scheduler.stop_model(model)
        return web.json_response({"model": model, "stopped": stopped})
