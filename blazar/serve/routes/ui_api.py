"""The dashboard on the gateway: the page at `/ui`, its one event stream, request trails.

- `GET /ui`, `/ui/`, `/ui/{file}`: the page's static files (`blazar/webui/`, shipped in
  the package, read once into memory; a name not among them is a 404, so no path a
  client sends is ever opened). Public, like `/health`: they hold no data, and the
  page must load to ask for a key. Every one carries a Content-Security-Policy that
  allows only this origin (scripts, styles, connections; no inline script, no
  frames: `frame-ancestors 'none'`), so the page works offline and nothing else can
  run in it or embed it.
- `GET /api/ui/events` (inference scope): server-sent events from the app's
  `blazar.serve.state.events.EventBus`: `hello` (the key's name and scope), `models`,
  and for admin keys (or no keys) `requests`, `request`, `running`, `series`,
  `sample`. The page reads it with `fetch`, so the key travels in a header as on
  every other route, never in the URL.
- `GET /api/ui/trail/{trace}` (admin): a request's trace and its routing trail, the
  lines `blazar why` prints (`blazar.observe.trail.render`).

`register` also adds the bus to the observer's listeners and runs its task with the
app (started on startup, its streams ended on shutdown, before aiohttp waits for
open handlers). Admin actions, health and logs are in `ui_admin`.
"""

from __future__ import annotations

import asyncio
import contextlib
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from blazar import __version__
from blazar.observe import trail
from blazar.protocols import ProtocolError
from blazar.serve.http import TRACE, trace_id
from blazar.serve.request.grants import ADMIN, grant_of, sees
from blazar.serve.routes.services import Services
from blazar.serve.state import dashboard
from blazar.serve.state.events import EventBus
from blazar.serve.supervisor.runtime import resolve as resolve_name

KEEPALIVE = 15.0  # seconds between comments on a quiet stream (proxies close idle ones)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
BUS = web.AppKey("ui_bus", EventBus)
BUS_TASK = web.AppKey("ui_bus_task", asyncio.Task[None])
STREAM_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def webui_dir() -> Path:
    """Where the page's files are installed (package data of `blazar`)."""
    return Path(str(resources.files("blazar").joinpath("webui")))


def load_files(folder: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of each page file; other kinds are not served."""
    files = {}
    for path in sorted(folder.iterdir()):
        kind = TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            files[path.name] = (path.read_bytes(), kind)
    return files


def remote_rows(services: Services) -> list[dict[str, Any]]:
    """The models only remotes serve, as rows of the models view."""
    runtimes = services.scheduler.runtimes

    def local(name: str) -> bool:
        try:
            resolve_name(runtimes, name)
        except KeyError:
            return False
        return True

    return [
        dashboard.remote_row(name, remote.name, "drained" if remote.drained else str(remote.health))
        for name, remote in services.fleet.listing(local)
    ]


def register(app: web.Application, services: Services) -> None:
    """Add the dashboard's page, stream and trail routes, and its event bus."""
    control = services.control
    observer = services.observer
    bus = EventBus(
        lambda: services.scheduler,
        conditions=control.store.conditions if control is not None else list,
        recent=lambda: list(observer.ring),
        remotes=lambda: remote_rows(services),
    )
    app[BUS] = bus
    api = UIAPI(services, bus, load_files(webui_dir()))
    app.router.add_get("/ui", api.page)
    app.router.add_get("/ui/", api.page)
    app.router.add_get("/ui/{file}", api.asset)
    app.router.add_get("/api/ui/events", api.events)
    app.router.add_get("/api/ui/trail/{trace}", api.trail)

    async def start(app: web.Application) -> None:
        observer.listeners.append(bus.on_trace)
        app[BUS_TASK] = asyncio.create_task(bus.run())

    async def shutdown(app: web.Application) -> None:
        bus.close()  # open streams end now, so serve does not wait on them

    async def cleanup(app: web.Application) -> None:
        with contextlib.suppress(ValueError):
            observer.listeners.remove(bus.on_trace)
        task = app.get(BUS_TASK)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(cleanup)


class UIAPI:
    def __init__(
        self, services: Services, bus: EventBus, files: dict[str, tuple[bytes, str]]
    ) -> None:
        self.services, self.bus, self.files = services, bus, files

    def _file(self, name: str) -> web.Response:
        found = self.files.get(name)
        if found is None:
            raise ProtocolError(404, f"/ui/{name}: no such file of the dashboard; open /ui")
        body, kind = found
        return web.Response(body=body, headers={**PAGE_HEADERS, "Content-Type": kind})

    async def page(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["file"])

    async def events(self, request: web.Request) -> web.StreamResponse:
        if request.method == "HEAD":  # the head only: a stream's bytes would follow it
            return web.Response(headers={**STREAM_HEADERS, TRACE: trace_id(request)})
        grant = grant_of(request)
        admin = grant is None or grant.scope == ADMIN
        hello = {
            "version": __version__,
            "keyed": grant is not None,
            "key": grant.name if grant is not None else None,
            "scope": "admin" if admin else "inference",
        }
        sub = self.bus.subscribe(hello, admin, lambda name, aliases: sees(request, name, aliases))
        response = web.StreamResponse(headers={**STREAM_HEADERS, TRACE: trace_id(request)})
        try:
            await response.prepare(request)
            while True:
                try:
                    event = await asyncio.wait_for(sub.queue.get(), KEEPALIVE)
                except TimeoutError:
                    event = b": keep-alive\n\n"
                if event is None:
                    break
                await response.write(event)
        except ConnectionResetError:
            pass  # the page went away
        finally:
            self.bus.unsubscribe(sub)
        return response

    async def trail(self, request: web.Request) -> web.Response:
        wanted = request.match_info["trace"]
        record = await self.services.observer.find(wanted)
        if record is None:
            raise ProtocolError(
                404,
                f"no trace {wanted!r}: it is older than serving.trace_retention keeps, or not "
                "a request id this host answered",
            )
        return web.json_response({"record": record, "trail": trail.render(record)})
