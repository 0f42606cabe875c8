"""Admin routes the dashboard (`/ui`) uses: load and pin models, the host's health, the logs.

- `POST /api/blazar/load {"model"}`: load a model now, as a request for it would (a
  slot leased and given back at once; its keep_alive then applies). Unloading is
  `POST /api/blazar/stop` (`blazar_api`).
- `POST /api/blazar/pin {"model", "pinned"}`: set or clear `pin` in the manifest serve
  watches (`manifest_ops.set_pin`, comments kept) and run a pass, which updates the
  model in place; the manifest stays the one source of truth.
- `GET /api/ui/health`: `blazar doctor`'s findings with their fixes (in a worker
  thread: it runs each engine's `--version`), the remotes (`Fleet.snapshot`), the
  engine lanes with their installed versions and the models each serves, and every
  condition that is not Ready.
- `GET /api/ui/logs`: the instance log files (`blazar.serve.state.log_tail.listing`);
  `GET /api/ui/logs/{name}`: one of them as server-sent `lines` events, its last lines
  then new ones as the child writes them. The name is looked up in that listing,
  never joined to a path.

All are admin scope (`blazar.serve.gateway.access.SCOPES`); errors are raised and
answered in ollama's shape (`/api/*`) by the gateway's error middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from blazar import doctor
from blazar.engines.ledger import EngineStore
from blazar.errors import NotFound
from blazar.manifest import ops as manifest_ops
from blazar.protocols import ProtocolError
from blazar.serve.http import TRACE, read_json, trace_id
from blazar.serve.request.pipeline import Routed
from blazar.serve.routes.services import Services
from blazar.serve.state import live, log_tail
from blazar.serve.state.dashboard import condition_json
from blazar.serve.state.remotes import Forward

CLOSING = web.AppKey("ui_closing", asyncio.Event)
STREAM_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def register(app: web.Application, services: Services) -> None:
    """Add the dashboard's admin routes to the gateway's app."""
    api = UIAdmin(services)
    app[CLOSING] = api.closing
    app.router.add_post("/api/blazar/load", api.load)
    app.router.add_post("/api/blazar/pin", api.pin)
    app.router.add_get("/api/ui/health", api.health)
    app.router.add_get("/api/ui/logs", api.logs)
    app.router.add_get("/api/ui/logs/{name}", api.log)

    async def shutdown(app: web.Application) -> None:
        api.closing.set()  # log streams end, so serve does not wait on them

    app.on_shutdown.append(shutdown)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError(400, 'send {"model": NAME}')
    return model


class UIAdmin:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.closing = asyncio.Event()

    async def load(self, request: web.Request) -> web.Response:
        scheduler, pipeline = self.services.scheduler, self.services.pipeline
        target = pipeline.resolve_here(request, _model(await read_json(request)))
        runtime = target.runtime
        # No request: a failure here is answered, not failed over to a remote.
        leased = await pipeline.lease(None, Routed(target, None, None, False))
        assert not isinstance(leased, Forward)  # never, without a request
        with leased:
            pass  # loaded: the slot goes back at once
        rows = [r for r in scheduler.snapshot() if r["model"] == runtime.name]
        return web.json_response({"model": runtime.name, "loaded": True, "instances": rows})

    async def pin(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        pinned = body.get("pinned")
        if not isinstance(pinned, bool):
            raise ProtocolError(400, 'send {"model": NAME, "pinned": true or false}')
        control = self.services.need_control()
        target = self.services.pipeline.resolve_here(request, _model(body))
        name = target.runtime.name
        changed = await asyncio.to_thread(manifest_ops.set_pin, control.manifest, name, pinned)
        if changed:
            await control.refresh(f"{'pin' if pinned else 'unpin'} {name}")
        runtime = self.services.scheduler.runtimes.get(name)
        return web.json_response(
            {"model": name, "pinned": bool(runtime and runtime.pin), "changed": changed},
            headers={TRACE: trace_id(request)},
        )

    async def health(self, request: web.Request) -> web.Response:
        control = self.services.need_control()
        paths = control.paths
        url = f"{request.scheme}://{request.host}"
        with contextlib.suppress(OSError, ValueError, KeyError):
            url = str(json.loads((paths.state / "serve.json").read_text())["url"])
        view = doctor.DaemonView(
            url, up=True, pid=os.getpid(), stats=self.services.observer.stats()
        )
        findings = await asyncio.to_thread(doctor.examine, paths, control.manifest, view)
        runtimes = self.services.scheduler.runtimes
        engines = []
        records = EngineStore(control.store)
        for record in records.installed():
            serving = sorted(r.name for r in runtimes.values() if r.engine_tag == record.tag)
            engines.append(
                {
                    "kind": record.kind,
                    "tag": record.tag,
                    "version": record.version,
                    "method": record.method,
                    "active": record.active,
                    "installed_at": record.installed_at,
                    "models": serving,
                    "bench": records.last_bench(record.kind, record.tag),
                }
            )
        waiting = [
            {"kind": c.kind, "name": c.name, **condition_json(c)}
            for c in control.store.conditions()
            if c.status != "True"
        ]
        return web.json_response(
            {
                "findings": [asdict(f) for f in findings],
                "groups": list(doctor.GROUPS),
                "remotes": self.services.fleet.snapshot(),
                "engines": engines,
                "conditions": waiting,
            }
        )

    def _logs_dir(self) -> Path:
        return self.services.scheduler.log_dir

    async def logs(self, request: web.Request) -> web.Response:
        owners = {
            member.instance.spec.log_path.name: member.instance.spec.key
            for pool in live.pools(self.services.scheduler)
            for member in pool.members
        }
        rows = [
            {**row, "instance": owners.get(row["name"])}
            for row in log_tail.listing(self._logs_dir())
        ]
        return web.json_response({"logs": rows})

    async def log(self, request: web.Request) -> web.StreamResponse:
        path = log_tail.pick(self._logs_dir(), request.match_info["name"])
        try:
            fh = path.open("rb")
        except OSError:
            raise NotFound(
                f"the log {path.name} is gone; GET /api/ui/logs lists the ones there"
            ) from None
        response = web.StreamResponse(headers={**STREAM_HEADERS, TRACE: trace_id(request)})
        try:
            await response.prepare(request)
            async for lines in log_tail.follow(path, fh, self.closing):
                data = json.dumps({"lines": lines})
                await response.write(f"event: lines\ndata: {data}\n\n".encode())
        except ConnectionResetError:
            pass  # the page went away
        finally:
            fh.close()
        return response
