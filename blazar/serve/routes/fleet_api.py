"""The fleet's routes on the gateway: `GET /api/failover` and `POST /api/failover` (admin).

`GET` answers `Fleet.snapshot()`: every remote (its kind, health, last error,
the models it serves, requests forwarded and failed) and every model's
failover chain with each member's state; `blazar remotes` prints it. `POST
{"member": NAME, "drained": true|false}` drains a remote (no request goes to it,
health probes go on) or brings it back; a drain lasts until serve restarts or
it is undone. Both are admin routes (`blazar.serve.gateway.access`).
"""

from __future__ import annotations

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve.http import read_json
from blazar.serve.routes.services import Services


def register(app: web.Application, services: Services) -> None:
    """Add the fleet's routes to the gateway's app."""
    api = FleetAPI(services)
    app.router.add_get("/api/failover", api.show)
    app.router.add_post("/api/failover", api.drain)


class FleetAPI:
    def __init__(self, services: Services) -> None:
        self.services = services

    async def show(self, request: web.Request) -> web.Response:
        return web.json_response(self.services.fleet.snapshot())

    async def drain(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        member, drained = body.get("member"), body.get("drained")
        if not isinstance(member, str) or not isinstance(drained, bool):
            raise ProtocolError(400, 'send {"member": REMOTE, "drained": true or false}')
        fleet = self.services.fleet
        if member not in fleet.remotes:
            known = ", ".join(sorted(fleet.remotes)) or "none: declare [remotes.NAME]"
            raise ProtocolError(404, f"no remote '{member}'; remotes: {known}")
        return web.json_response(fleet.drain(member, drained).view())
