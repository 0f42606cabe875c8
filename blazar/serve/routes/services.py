"""What the gateway's routes work with, as one small value the daemon builds.

`Services` holds the scheduler, the one HTTP client to the children, the
prompt counter, the sessions and singleflight (docs/sessions.md), the fleet
(remotes and failover chains, `blazar.serve.state.remotes`), the daemon's hooks for
routes that edit the manifest (`Control`), the observer
(traces and metrics, `blazar.serve.state.tracing`), and the manifest's current
`[serving]` settings (the daemon replaces them on reload). Route modules
(`openai_api`, `ollama_api`, `ollama_admin`, `ollama_pull`, `anthropic_api`,
`blazar_api`) receive it from `blazar.serve.gateway.app` and import nothing of the
daemon; the daemon (`blazar.serve.daemon`) assembles both.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from blazar.paths import Paths
from blazar.protocols import EngineRequest, ProtocolError
from blazar.serve.request import pipeline
from blazar.serve.request.prompts import Prompts
from blazar.serve.request.singleflight import SingleFlight
from blazar.serve.state.remotes import Fleet
from blazar.serve.state.sessions import Sessions
from blazar.serve.state.tracing import Observer
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.scheduler import Lease, Scheduler
from blazar.store import Store
from specs.serving import Serving


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


@dataclass
class Services:
    """The scheduler, the child client, what counts prompts, the observer, (under `blazar
    serve`) the sessions and the daemon's hooks, and the `[serving]` settings routes read
    (upload limits, import roots)."""

    scheduler: Scheduler
    children: ChildConnections = field(default_factory=ChildConnections)
    control: Control | None = None
    started: float = field(default_factory=time.time)
    observer: Observer = field(default_factory=Observer)  # traces and metrics
    sessions: Sessions | None = None  # None: sessions and the bank are off (no daemon)
    serving: Serving = field(default_factory=Serving)
    prompts: Prompts = field(init=False)
    singleflight: SingleFlight = field(default_factory=SingleFlight)
    # Awaited by serve as it stops, before the scheduler stops the children (the audio
    # jobs keep a queued job queued for the next serve).
    closing: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    fleet: Fleet = field(default_factory=Fleet)  # remotes and failover chains (docs/fleet.md)

    def __post_init__(self) -> None:
        self.observer.bind(self.scheduler)
        self.prompts = Prompts(self.children)

    async def admit(self, lease: Lease, req: EngineRequest, size: int) -> EngineRequest:
        """A translated request after `pipeline.admit` (the preflight, the sessions' slot
        routing): with `id_slot` when a slot must be named; `size` bounds its tokens."""
        slot = await pipeline.admit(self.prompts, self.sessions, lease, req.path, req.body, size)
        return req if slot is None else replace(req, body={**req.body, "id_slot": slot})

    def need_control(self) -> Control:
        """The daemon's hooks; routes that edit the manifest need `blazar serve`."""
        if self.control is None:
            raise ProtocolError(501, "model management needs `blazar serve`")
        return self.control
