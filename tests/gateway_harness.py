"""The gateway's app in-process, in front of a scripted fake child: for fault injection only.

`InProcessGateway` runs `blazar.serve.gateway.app.build_app` on a free loopback port in a
thread of its own, with a real `Scheduler` whose instances are stand-ins that
report a scripted child's URL as theirs. The scripted child is a
`tests.loopback.LoopbackHTTP` whose handler the test writes: hang, answer late, stop mid-stream.
Everything a real child does well is tested against the real engine elsewhere.
Given a `manifest`, the routes that edit it (`/api/pull`, `/api/copy`, ...) work too,
on the store under `BLAZAR_HOME`, with a control-loop pass that does nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from blazar.paths import resolve_paths
from blazar.serve.gateway.access import Access
from blazar.serve.gateway.app import build_app
from blazar.serve.gateway.listener import GatewaySite, Limits
from blazar.serve.routes.services import Control, Services
from blazar.serve.state.remotes import FLEET
from blazar.serve.state.sessions import Sessions
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.instance import State
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.store.db import Store
from specs.serving import Serving

# The lane an InProcessGateway's requests take when a test does not say: a test module
# runs on both by setting this from a parametrized fixture (`lanes` below).
RELAY = True


def one_chunk_of_a_stream(handler: BaseHTTPRequestHandler) -> None:
    """For a scripted child: read the request and start an OpenAI event stream with one
    chunk (the word "fox"); what the child does next is the fault the test injects."""
    handler.rfile.read(int(handler.headers["Content-Length"]))
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = {"choices": [{"index": 0, "delta": {"content": "fox"}, "finish_reason": None}]}
    data = f"data: {json.dumps(chunk)}\n\n".encode()
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def runtime(name: str, **fields: Any) -> ModelRuntime:
    base: dict[str, Any] = dict(
        name=name,
        path=f"/m/{name}.gguf",
        aliases=(),
        ctx=512,
        slots=1,
        replicas=0,
        pin=False,
        keep_alive=300.0,
        engine_tag="b1-cpu",
        command=("llama-server",),
        has_template=True,
        chat_template=None,
        embeddings=False,
        pooling=None,
        extra_args=(),
    )
    base.update(fields)
    return ModelRuntime(**base)


class StandIn:
    """Answers like an Instance whose child is at `url_of_child`; starts nothing, counts starts."""

    url_of_child = "http://127.0.0.1:1"

    def __init__(self, spec: Any, **_: Any) -> None:
        self.spec = spec
        self.state = State.STOPPED
        self.pid: int | None = None
        self.port: int | None = None
        self.starts = 0

    @property
    def url(self) -> str | None:
        return self.url_of_child if self.state == State.READY else None

    async def ensure_ready(self) -> str:
        if self.state != State.READY:
            self.starts += 1
            self.state = State.READY
        return self.url_of_child

    async def stop(self) -> None:
        self.state = State.STOPPED

    async def close(self) -> None:
        self.state = State.STOPPED


class InProcessGateway:
    """build_app on 127.0.0.1:<free port> in a background thread; a context manager."""

    def __init__(
        self,
        child_url: str,
        *runtimes: ModelRuntime,
        upstream_timeout: float | None = None,
        manifest: Path | None = None,
        access: Access | None = None,
        relay: bool | None = None,
    ) -> None:
        self.relay = RELAY if relay is None else relay
        self.child_url = child_url
        self.access = access
        self.runtimes = runtimes or (runtime("tiny"),)
        self.upstream_timeout = upstream_timeout
        self.manifest = manifest
        self.store: Store | None = None
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> InProcessGateway:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        child_url = self.child_url

        class Instance(StandIn):
            url_of_child = child_url

        self.scheduler = Scheduler(
            {r.name: r for r in self.runtimes},
            max_loaded=4,
            max_queue=8,
            queue_timeout=5.0,
            log_dir=Path("/nonexistent"),
            make_instance=Instance,
        )
        self.children = ChildConnections(timeout=self.upstream_timeout)
        control, sessions = None, None
        if self.manifest is not None:  # as under `blazar serve`: manifest hooks and sessions
            paths = resolve_paths()
            self.store = Store(paths.db)  # opened on the loop's thread, which uses it

            async def refresh(reason: str) -> None:
                return None

            control = Control(paths, self.manifest, self.store, refresh)
            sessions = Sessions(
                self.store, self.children, paths.sessions, runtimes=lambda: self.scheduler.runtimes
            )
        services = Services(self.scheduler, self.children, control, sessions=sessions)
        services.configure(Serving(relay=self.relay))
        self.services = services
        self.app = build_app(services, self.access)
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        # The daemon's own site: its connections read heads for the relay (`relay`).
        site = GatewaySite(self._runner, "127.0.0.1", 0, Limits.of(Serving()))
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def stop() -> None:
            assert self._runner is not None
            await self._runner.cleanup()
            for hook in self.services.closing:  # as serve ends: the async audio jobs' tasks
                await hook()
            await self.app[FLEET].close()  # the remotes' client, when a test used one
            self.children.close()
            await self.scheduler.close()
            if self.store is not None:
                self.store.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
