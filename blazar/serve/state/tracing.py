"""The gateway's observer: a trace per request, finished off the answer's path, kept and counted.

The gateway's one middleware (`blazar.serve.gateway.app`) calls `Observer.begin`,
which starts a `Trace` for each inference request (the paths in `TRACED`) and makes it
current for the request's task, and `Observer.end` once the request is done; the one
request path fills it in (`blazar.observe.trace`). When the handler returns, the trace
waits for `drain` (every FINISH_EVERY, or before any read of traces or metrics), so
the answer goes out first and done requests are finished in batches. A streamed
answer's last byte reaches the client before the middleware ends its request: a reader
that must see that request's trace waits for its end (`find(id, wait=...)`, behind
`/api/why/{id}?wait=SECONDS`), which `end` signals. `finish` reads the answer
(outcome, sentinels), checks for cache-busting, counts the request in `Metrics`, keeps
the record in a bounded ring, queues it for the store and exports its spans
(serving.otlp_endpoint).

The store is written by `run` (a task of the daemon) about once a second, in one
worker thread with its own connection, and pruned by serving.trace_retention. A record
the store refuses costs only itself: it is written escaped, or left out and counted in
`blazar_trace_records_dropped_total` (`trace_store.write`).
`/metrics` (`blazar.serve.routes.observe_api`) calls `metrics_text`, which first scrapes
each ready child's own `/metrics` and relabels them; what is read at scrape time
and the live summary (`stats`) are in `blazar.serve.state.live`. The daemon forwards
instance events (`instance_event`) for load times and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import Counter, generate_latest
from prometheus_client.metrics_core import Metric

from blazar.observe import cachebust
from blazar.observe import trace_store as trace_store
from blazar.observe.metrics import Metrics, rejection, relabel
from blazar.observe.otlp import SpanExporter
from blazar.observe.trace import CURRENT, Trace
from blazar.serve.http import KEY_NAME, trace_id
from blazar.serve.state import live
from blazar.serve.supervisor.instance import Instance
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.store.db import Store
from specs.serving import Serving

# The requests that get a trace: inference on each protocol.
TRACED = {
    "/v1/chat/completions": "openai",
    "/v1/completions": "openai",
    "/v1/embeddings": "openai",
    "/v1/rerank": "openai",
    "/rerank": "openai",
    "/v1/responses": "openai",
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
    "/api/chat": "ollama",
    "/api/generate": "ollama",
    "/api/embed": "ollama",
    "/api/embeddings": "ollama",
    "/v1/audio/transcriptions": "openai",
    "/v1/audio/translations": "openai",
    "/v1/audio/speech": "openai",
    "/v1/images/generations": "openai",
    "/v1/images/edits": "openai",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RING = 2000  # traces kept in memory
# Done requests are finished in batches: one after another, the code stays in the CPU's
# caches (finishing each at once, between aiohttp's work, measured twice the CPU).
FINISH_EVERY = 0.05
FLUSH_EVERY = 1.0  # seconds between writes to the store
PRUNE_EVERY = 60.0
logger = logging.getLogger("blazar.serve")


@dataclass(frozen=True)
class Settings:
    """The `[serving]` fields the observer follows (reloaded with the manifest)."""

    pii_scrub: bool = False
    sentinel: bool = True
    sentinel_enforce: bool = False
    retention_age: float = 7 * 86400.0  # seconds; < 0: any age
    retention_count: int = 100_000
    otlp_endpoint: str | None = None
    otlp_service: str = "blazar"

    @classmethod
    def from_serving(cls, serving: Serving) -> Settings:
        return cls(
            pii_scrub=serving.pii_scrub,
            sentinel=serving.sentinel,
            sentinel_enforce=serving.sentinel_enforce,
            retention_age=float(serving.trace_retention.age),
            retention_count=serving.trace_retention.count,
            otlp_endpoint=serving.otlp_endpoint,
            otlp_service=serving.otlp_service,
        )


class Observer:
    """Traces, metrics and spans of one gateway. `db_path` None: traces stay in memory."""

    def __init__(self, settings: Settings | None = None, *, db_path: Path | None = None) -> None:
        self.settings = Settings()
        self.metrics = Metrics()
        self.ring: deque[dict[str, Any]] = deque(maxlen=RING)
        self.tracker = cachebust.Tracker()
        self.scheduler: Scheduler | None = None
        self._db_path = db_path
        self._executor = ThreadPoolExecutor(1, "blazar-traces") if db_path else None
        self._store: Store | None = None  # opened, used and closed in the executor's thread
        self._pending: list[dict[str, Any]] = []
        self._finishing: list[Trace] = []
        # Who waits for a request to end (`wait_ended`), by its trace id.
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._pruned = 0.0
        self._exporter: SpanExporter | None = None
        self._starting: dict[str, int] = {}
        self._scraped: list[Metric] = []
        # Told of each trace as it starts (record None) and once it is finished (its record):
        # the dashboard's event bus (`blazar.serve.state.events`). Each must be cheap and
        # must not raise.
        self.listeners: list[Callable[[Trace, dict[str, Any] | None], None]] = []
        self.metrics.registry.register(live.StateCollector(self._scheduler, self._children))
        # Incremented in the store's thread: prometheus_client's own counter, which locks.
        self.dropped = Counter(
            "blazar_trace_records_dropped",
            "Trace records the store refused even escaped, left out so that the rest of "
            "their batch was written.",
            registry=self.metrics.registry,
        )
        self.configure(settings or Settings())

    def bind(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _scheduler(self) -> Scheduler | None:
        return self.scheduler

    def _children(self) -> list[Metric]:
        return self._scraped

    def configure(self, settings: Settings) -> None:
        """Follow new settings; the span exporter is remade when its endpoint changed."""
        old, self.settings = self.settings, settings
        same = (old.otlp_endpoint, old.otlp_service) == (
            settings.otlp_endpoint,
            settings.otlp_service,
        )
        if same and (self._exporter is not None or settings.otlp_endpoint is None):
            return
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None
        if settings.otlp_endpoint:
            self._exporter = SpanExporter(settings.otlp_endpoint, settings.otlp_service)

    # -- the request path ---------------------------------------------------------------

    def begin(self, request: web.Request) -> Trace | None:
        """A trace for an inference request (the paths in `TRACED`), made current for the
        request's task; None for any other request. The gateway's middleware calls it
        first, and `end` when the request is done, however it ended."""
        if request.method != "POST":
            return None
        protocol = TRACED.get(request.path)
        if protocol is None:
            return None
        try:
            trace = Trace(trace_id(request), protocol, request.path)
        except Exception:  # observing must never break serving
            logger.exception("tracing %s failed", request.path)
            return None
        trace.checks, trace.enforce = self.settings.sentinel, self.settings.sentinel_enforce
        for listener in self.listeners:
            listener(trace, None)
        trace.token = CURRENT.set(trace)
        return trace

    def end(self, trace: Trace, request: web.Request, status: int) -> None:
        """The request is done with `status` (what its trace has not said already)."""
        if trace.token is not None:
            CURRENT.reset(trace.token)
        self._done(trace, request, status)

    def started(self, trace: Trace) -> None:
        """A trace made off the middleware (each response of a realtime session) begins:
        the listeners hear of it as of the middleware's; the caller makes it current."""
        trace.checks, trace.enforce = self.settings.sentinel, self.settings.sentinel_enforce
        for listener in self.listeners:
            listener(trace, None)

    def finished(self, trace: Trace, request: web.Request, status: int) -> None:
        """A trace from `started` is done with `status` (unless a failure said one;
        `request`: the socket's upgrade): finished, kept and counted as the middleware's."""
        self._done(trace, request, status)

    def _done(self, trace: Trace, request: web.Request, status: int) -> None:
        self.done(trace, status, request.remote, request.get(KEY_NAME))

    def done(self, trace: Trace, status: int, client: str | None, key: str | None) -> None:
        """A trace from `started` that no aiohttp request carried (the gateway's relay,
        `blazar.serve.gateway.relay`) is done: finished, kept and counted the same way."""
        trace.ended(status, client=client, key=key)
        self._finishing.append(trace)
        if len(self._finishing) == 1:
            asyncio.get_running_loop().call_later(FINISH_EVERY, self.drain)
        if self._waiting:
            self._ended(trace.asked.id)

    def _ended(self, trace_id: str) -> None:
        for future in self._waiting.pop(trace_id, ()):
            if not future.done():
                future.set_result(None)

    def drain(self) -> None:
        """Finish the requests done since the last batch (reads of traces call it first)."""
        batch, self._finishing = self._finishing, []
        for trace in batch:
            self.finish(trace)

    def finish(self, trace: Trace) -> None:
        """Read, check, count and keep a request that is done (never raises)."""
        try:
            self._finish(trace)
        except Exception:  # observing must never break serving
            logger.exception("observing request %s failed", trace.asked.id)

    def _finish(self, trace: Trace) -> None:
        result = trace.result
        if result.rejected is None:
            result.rejected = rejection(result.status, result.code)
        record = trace.record(scrub=self.settings.pii_scrub)
        busted = False
        body = trace.conversation()
        model = trace.placement.model
        if model and result.status == 200 and body is not None:
            turn = cachebust.turn(body)
            out = result.outcome
            if turn is not None and out is not None:
                asked = trace.asked
                client = asked.key or asked.client or "-"
                busted = self.tracker.observe(
                    client, model, turn, out.prompt_tokens, out.cached_tokens, asked.wall
                )
        if busted:
            record["cache"] = {
                "finding": cachebust.FINDING,
                "detail": "the system prompt changed while the conversation after it went on, "
                f"so the engine prefilled it again ({record['cached_tokens'] or 0} of "
                f"{record['prompt_tokens'] or '?'} prompt tokens reused)",
                "fix": cachebust.FIX,
            }
        self.metrics.observe(trace, busted)
        self.ring.append(record)
        for listener in self.listeners:
            listener(trace, record)
        if self._executor is not None:
            self._pending.append(record)
        if self._exporter is not None:
            self._exporter.export(record, trace.timing())

    # -- instance events (from the daemon) ----------------------------------------------

    def instance_event(self, instance: Instance, event: str) -> None:
        spec = instance.spec
        if event == "starting":
            self._starting[spec.key] = time.perf_counter_ns()
        elif event == "ready" and (began := self._starting.pop(spec.key, None)) is not None:
            self.metrics.loads(spec.model).inc()
            self.metrics.load_seconds(spec.model).observe((time.perf_counter_ns() - began) / 1e9)
        elif event == "exited":
            self.metrics.restarts(spec.model, str(spec.replica)).inc()
        elif event in ("failed", "stopped"):
            self._starting.pop(spec.key, None)

    # -- the store ----------------------------------------------------------------------

    async def run(self) -> None:
        """Write queued traces to the store about once a second (a task of the daemon)."""
        await self._in_store(self._prune)
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self.flush()

    async def flush(self) -> None:
        self.drain()
        if not self._pending or self._executor is None:
            return
        batch, self._pending = self._pending, []
        await self._in_store(self._write, batch)

    async def _in_store(self, fn: Any, *args: Any) -> Any:
        """Run `fn(store, *args)` in the store's thread; None without a store or on error."""
        if self._executor is None:
            return None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._with_store, fn, args)
        except Exception:
            logger.exception("the trace store failed (%s)", getattr(fn, "__name__", fn))
            return None

    def _with_store(self, fn: Any, args: tuple[Any, ...]) -> Any:
        if self._store is None:
            assert self._db_path is not None
            self._store = Store(self._db_path)
        return fn(self._store, *args)

    def _write(self, store: Store, batch: list[dict[str, Any]]) -> None:
        written = trace_store.write(store, batch)
        if written.escaped:
            logger.warning(
                "%d trace record(s) held text the store refused; written escaped",
                written.escaped,
            )
        if written.dropped:
            self.dropped.inc(written.dropped)
            logger.warning(
                "%d trace record(s) refused by the store even escaped; left out, the "
                "other %d written (blazar_trace_records_dropped_total)",
                written.dropped,
                written.total,
            )
        if time.monotonic() - self._pruned > PRUNE_EVERY:
            self._prune(store)

    def _prune(self, store: Store) -> None:
        self._pruned = time.monotonic()
        settings = self.settings
        trace_store.prune(store, max_age=settings.retention_age, count=settings.retention_count)

    async def close(self) -> None:
        """Write what is queued, close the store and flush the span exporter."""
        await self.flush()
        if self._executor is not None:
            await self._in_store(lambda store: store.close())
            self._store = None
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._exporter is not None:
            exporter, self._exporter = self._exporter, None
            await asyncio.to_thread(exporter.close)

    # -- reading traces (`/api/why`) ----------------------------------------------------

    async def find(self, wanted: str, *, wait: float = 0.0) -> dict[str, Any] | None:
        """The newest trace with this id: from memory, else from the store. With `wait`,
        a request not ended yet is waited for, up to that many seconds: a client that has
        read its answer's last byte may ask before the gateway's middleware has ended the
        request, and this is the event to wait on (`/api/why/{id}?wait=SECONDS`)."""
        if wait <= 0:
            return await self._find(wanted)
        ended = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(wanted, [])
        waiting.append(ended)
        try:  # waiting before the search: an end between the two is not missed
            found = await self._find(wanted)
            if found is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended, wait)
                found = await self._find(wanted)
            return found
        finally:
            if ended in waiting:
                waiting.remove(ended)
            if not waiting and self._waiting.get(wanted) is waiting:
                del self._waiting[wanted]

    async def _find(self, wanted: str) -> dict[str, Any] | None:
        self.drain()
        record: dict[str, Any]
        for record in reversed(self.ring):
            if record["id"] == wanted:
                return record
        await self.flush()
        found = await self._in_store(trace_store.find, wanted)
        return dict(found) if found is not None else None

    async def recent(self, model: str | None, limit: int) -> list[dict[str, Any]]:
        """The newest traces (of one model), newest first."""
        self.drain()
        if self._executor is not None:
            await self.flush()
            rows = await self._in_store(lambda s: trace_store.recent(s, model=model, limit=limit))
            if rows is not None:
                return list(rows)
        found = [r for r in reversed(self.ring) if model is None or r["model"] == model]
        return found[:limit]

    # -- /metrics -----------------------------------------------------------------------

    async def metrics_text(self) -> bytes:
        """The Prometheus exposition: Blazar's families and every ready child's own."""
        self.drain()
        self._scraped = relabel(await live.scrape_children(live.pools(self.scheduler)))
        return generate_latest(self.metrics.registry)

    def stats(self) -> dict[str, Any]:
        """The live summary `blazar watch` and `blazar doctor` read (`live.stats`)."""
        self.drain()
        return live.stats(self.scheduler, self.metrics.registry, self.ring, self.tracker)
