"""What the gateway's routes work with, as one small value the daemon builds.

`Services` holds the one request path (`pipeline`: the scheduler, the child client,
the prompt counter, the sessions, singleflight and the fleet), the daemon's hooks for
routes that edit the manifest (`Control`), the observer (traces and metrics,
`blazar.serve.state.tracing`), and the manifest's current `[serving]` settings (the
daemon replaces them on reload). Route modules receive it from
`blazar.serve.gateway.app` and import nothing of the daemon; the daemon
(`blazar.serve.daemon`) assembles both.

A model route is registered with `Services.route(ask)`: `ask` parses the client's
request into an `Ask`, and the handler hands it to `Pipeline.serve` (or, for a request
naming MCP servers in its `mcp` field, to the tool loop, which runs its rounds on the
pipeline). Every model route is such a `PipelineRoute` (tests/test_pipeline_routes.py
walks the router to prove it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from blazar.observe.metrics import CacheCollector
from blazar.paths import Paths
from blazar.protocols import ProtocolError
from blazar.serve.http import Handler
from blazar.serve.request.asks import Ask
from blazar.serve.request.pipeline import Leased, Pipeline
from blazar.serve.request.tool_loop import ToolLoop
from blazar.serve.state.mcp import McpServers
from blazar.serve.state.remotes import Fleet
from blazar.serve.state.sessions import Sessions
from blazar.serve.state.tracing import Observer
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.store.db import Store
from specs.serving import Serving

Asker = Callable[[web.Request], Awaitable[Ask]]
Call = Callable[[web.Request, Ask, Leased | None], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Control:
    """The daemon's hooks for routes that edit the manifest and reconcile.

    `manifest` is the file `blazar serve` watches (the one those routes edit);
    `store` is the daemon's connection (event-loop thread only); `refresh` runs
    one control-loop pass so the scheduler serves what a change made ready.
    """

    paths: Paths
    manifest: Path
    store: Store
    refresh: Callable[[str], Awaitable[None]]


class PipelineRoute:
    """A model route's handler: the route's parser, then the pipeline. `call` is for a
    route whose engine call is its own (audio): the pipeline holds the slot around it
    (`Pipeline.hold`), or for an `Ask` that is `deferred` (an async job) only checks it
    (`Pipeline.servable`) and `call` gets no slot. A request with an `mcp` field goes to
    the tool loop, which runs its rounds on the same pipeline (`tool_loop.ToolLoop`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        ask: Asker,
        call: Call | None = None,
        tools: ToolLoop | None = None,
    ) -> None:
        self.pipeline, self.ask, self.call, self.tools = pipeline, ask, call, tools

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        ask = await self.ask(request)
        if self.tools is not None and ask.body.get("mcp") is not None:
            return await self.tools.serve(request, ask)
        if self.call is None:
            return await self.pipeline.serve(request, ask)
        if ask.deferred:
            self.pipeline.servable(request, ask)
            return await self.call(request, ask, None)
        async with self.pipeline.hold(request, ask) as leased:
            return await self.call(request, ask, leased)


@dataclass
class Services:
    """The request path, the observer, (under `blazar serve`) the sessions and the
    daemon's hooks, and the `[serving]` settings routes read (upload limits, import
    roots)."""

    scheduler: Scheduler
    children: ChildConnections = field(default_factory=ChildConnections)
    control: Control | None = None
    started: float = field(default_factory=time.time)
    observer: Observer = field(default_factory=Observer)  # traces and metrics
    sessions: Sessions | None = None  # None: sessions and the bank are off (no daemon)
    serving: Serving = field(default_factory=Serving)
    # Awaited by serve as it stops, before the scheduler stops the children (the audio
    # jobs keep a queued job queued for the next serve).
    closing: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    fleet: Fleet = field(default_factory=Fleet)  # remotes and failover chains (docs/fleet.md)
    mcp: McpServers = field(default_factory=McpServers)  # [mcp.NAME] (docs/mcp.md)
    pipeline: Pipeline = field(init=False)
    tools: ToolLoop = field(init=False)

    def __post_init__(self) -> None:
        self.observer.bind(self.scheduler)
        self.pipeline = Pipeline(
            self.scheduler,
            self.children,
            sessions=self.sessions,
            fleet=self.fleet,
            serving=self.serving,
            store=self.control.paths.db if self.control is not None else None,
        )
        self.tools = ToolLoop(self.pipeline, self.mcp)
        self.observer.metrics.registry.register(CacheCollector(self.pipeline.cache.stats))

    def configure(self, serving: Serving) -> None:
        """The manifest's `[serving]` settings from now on (the daemon, on every pass)."""
        self.serving = self.pipeline.serving = serving

    def route(self, ask: Asker, call: Call | None = None) -> Handler:
        """The handler of a model route whose requests `ask` parses (and, for a route
        whose engine call is its own, `call` makes); `handler.pipeline_route` is its
        `PipelineRoute`, for the test that walks the router."""
        owner = PipelineRoute(self.pipeline, ask, call, self.tools)

        async def handler(request: web.Request) -> web.StreamResponse:
            return await owner(request)

        handler.pipeline_route = owner  # type: ignore[attr-defined]
        return handler

    def need_control(self) -> Control:
        """The daemon's hooks; routes that edit the manifest need `blazar serve`."""
        if self.control is None:
            raise ProtocolError(501, "model management needs `blazar serve`")
        return self.control
