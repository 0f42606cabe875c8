"""What the gateway shows of itself: `/metrics`, `/api/why`, `/api/why/{id}`, `/api/blazar/stats`.

`/metrics` is Prometheus' text exposition (`blazar.serve.state.tracing.Observer.metrics_text`:
Blazar's families and the children's own `llamacpp:*`); `/api/why/{id}` one
request's trace (with `?wait=SECONDS`, a request that has not ended yet is waited
for: a streamed answer's last byte reaches the client before its request ends) and
`/api/why?model=&limit=` the newest ones (`blazar why`);
`/api/blazar/stats` the live summary `blazar watch` and `blazar doctor` read. Who
may call them is the access middleware's decision, not this module's.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from blazar.protocols import ProtocolError
from blazar.serve.routes.services import Services

MAX_LIMIT = 1000
MAX_WAIT = 60.0  # seconds `/api/why/{id}?wait=` may wait for a request to end


def register(app: web.Application, services: Services) -> None:
    """Add the observability routes to the gateway's app."""
    api = ObserveAPI(services)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/api/why", api.why_list)
    app.router.add_get("/api/why/{trace}", api.why)
    app.router.add_get("/api/blazar/stats", api.stats)


class ObserveAPI:
    def __init__(self, services: Services) -> None:
        self.observer = services.observer

    async def metrics(self, request: web.Request) -> web.Response:
        body = await self.observer.metrics_text()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def why(self, request: web.Request) -> web.Response:
        wanted = request.match_info["trace"]
        raw = request.query.get("wait", "0")
        try:
            wait = float(raw)
        except ValueError:
            raise ProtocolError(400, f"wait must be a number of seconds, got {raw!r}") from None
        if not 0 <= wait <= MAX_WAIT:  # NaN fails both
            raise ProtocolError(
                400, f"wait must be between 0 and {MAX_WAIT:g} seconds, got {raw!r}"
            )
        record = await self.observer.find(wanted, wait=wait)
        if record is None:
            raise ProtocolError(
                404,
                f"no trace {wanted!r}: it is older than serving.trace_retention keeps, or not a "
                "request id this host answered; `blazar why --last 20` lists recent ones",
            )
        return web.json_response(record)

    async def why_list(self, request: web.Request) -> web.Response:
        model = request.query.get("model") or None
        raw = request.query.get("limit", "20")
        try:
            limit = int(raw)
        except ValueError:
            raise ProtocolError(400, f"limit must be a whole number, got {raw!r}") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise ProtocolError(400, f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        return web.json_response({"traces": await self.observer.recent(model, limit)})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.observer.stats())
