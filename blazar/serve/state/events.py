"""The dashboard's event bus: one stream of server-sent events per open `/ui` page.

`blazar.serve.routes.ui_api` makes one `EventBus` per app, adds `on_trace` to the
observer's listeners (`blazar.serve.state.tracing.Observer.listeners`: told when a
trace starts and when it is finished) and runs `run` while the app does. Every TICK
the bus publishes the models view when it changed (`dashboard.models_view`; again
every REFRESH for memory and keep-alive) and the requests in flight; every
`series.SAMPLE_EVERY` it appends a point to the last hour's series (always, so the
charts have the hour even when no page was open). Requests are published as they
start and finish.

Each subscriber is a bounded queue of encoded events (`event: NAME` / `data: JSON`),
made for its key: an inference key gets only the models it may use, without admin
details, and no requests or metrics (`/api/why` and `/metrics` are admin routes). A
subscriber that falls QUEUE events behind is dropped: its stream ends, and the page
reconnects and starts again from a fresh snapshot. On the request path `on_trace`
costs a dict insert and pop and an `Interval.add`; encoding happens only while a
page listens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from blazar.observe.trace import Trace
from blazar.serve.state import dashboard, live, series
from blazar.serve.supervisor.scheduler import Scheduler
from blazar.store.db import Condition

TICK = 1.0  # seconds between looks at what changed
REFRESH = 5.0  # the models view is sent at least this often (memory, keep-alive)
CONDITIONS_EVERY = 2.0  # seconds between reads of the store's conditions
QUEUE = 1000  # events a subscriber may fall behind before it is dropped
RECENT = 200  # finished requests a new page starts with
STALE = 5.0  # a trace done this long ago without being finished is forgotten
logger = logging.getLogger("blazar.serve")


def encode(name: str, data: Any) -> bytes:
    """One server-sent event (orjson writes no newline inside the data)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class Subscriber:
    """One open stream: what its key may see, and the events waiting to be written."""

    def __init__(self, admin: bool, sees: dashboard.Sees) -> None:
        self.admin, self.sees = admin, sees
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE)
        self.models: bytes | None = None  # the last models event it was sent
        self.models_at = 0.0

    def put(self, event: bytes | None) -> bool:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            return False
        return True

    def end(self) -> None:
        """Close its stream: whatever waits is dropped, then the end."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class EventBus:
    """Subscribers, the requests in flight, and the series; `run` is its task."""

    def __init__(
        self,
        scheduler: Callable[[], Scheduler | None],
        *,
        conditions: Callable[[], Sequence[Condition]] = list,
        recent: Callable[[], Iterable[dict[str, Any]]] = list,
        remotes: Callable[[], Sequence[dict[str, Any]]] = list,
        rss: Callable[[int | None], int | None] = series.rss_bytes,
    ) -> None:
        self.scheduler, self.conditions_of, self.recent, self.remotes = (
            scheduler,
            conditions,
            recent,
            remotes,
        )
        self.rss = rss
        self.subscribers: list[Subscriber] = []
        self.running: dict[int, Trace] = {}  # id(trace) -> the trace, while in flight
        self.series = series.Series()
        self.interval = series.Interval()
        self.closed = False
        self._sampled = time.time()
        self._conditions: Sequence[Condition] = ()
        self._conditions_at = -CONDITIONS_EVERY
        self._had_running = False

    # -- the observer's listener ------------------------------------------------------

    def on_trace(self, trace: Trace, record: dict[str, Any] | None) -> None:
        """A trace started (`record` None) or was finished; never raises."""
        try:
            if record is None:
                self.running[id(trace)] = trace
                if self.subscribers:
                    self.publish("request", dashboard.running_row(trace), admin=True)
                return
            self.running.pop(id(trace), None)
            self.interval.add(record)
            if self.subscribers:
                self.publish("request", dashboard.request_row(record), admin=True)
        except Exception:  # observing must never break serving
            logger.exception("the dashboard's event bus failed on a trace")

    # -- subscribers --------------------------------------------------------------------

    def subscribe(self, hello: dict[str, Any], admin: bool, sees: dashboard.Sees) -> Subscriber:
        """A new stream, starting with `hello`, the models and (admin) the requests and
        the series so far."""
        sub = Subscriber(admin, sees)
        if self.closed:
            sub.end()
            return sub
        sub.put(encode("hello", hello))
        self._send_models(sub, self._models(), time.time(), force=True)
        if admin:
            done = [dashboard.request_row(r) for r in list(self.recent())[-RECENT:]]
            now = time.time()
            running = [dashboard.running_row(t, now) for t in self.running.values()]
            sub.put(encode("requests", {"finished": done, "running": running}))
            sub.put(encode("series", self.series.view()))
        self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)

    def publish(self, name: str, data: Any, *, admin: bool = False) -> None:
        """Send an event to every subscriber (admin: only those with admin scope)."""
        event = encode(name, data)
        for sub in list(self.subscribers):
            if (sub.admin or not admin) and not sub.put(event):
                self._drop(sub)

    def _drop(self, sub: Subscriber) -> None:
        self.unsubscribe(sub)
        sub.end()

    def close(self) -> None:
        """End every stream (serve is stopping); new ones end at once."""
        self.closed = True
        for sub in list(self.subscribers):
            self._drop(sub)

    # -- the tick -----------------------------------------------------------------------

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            await asyncio.sleep(TICK)
            try:
                self.tick(time.time())
            except Exception:
                logger.exception("the dashboard's event bus failed")

    def tick(self, now: float) -> None:
        if now - self._sampled >= self.series.every:
            self.sample(now)
        if not self.subscribers:
            return
        models = self._models()
        for sub in list(self.subscribers):
            self._send_models(sub, models, now)
        self._forget_stale(now)
        if self.running or self._had_running:
            rows = [dashboard.running_row(t, now) for t in self.running.values()]
            self.publish("running", rows, admin=True)
        self._had_running = bool(self.running)

    def sample(self, now: float) -> dict[str, Any]:
        """Append one point to the series and publish it."""
        done, self.interval = self.interval, series.Interval()
        seconds, self._sampled = now - self._sampled, now
        queue = in_flight = 0
        memory: int | None = None
        scheduler = self.scheduler()
        if scheduler is not None:
            memory = 0
            for pool in live.pools(scheduler):
                queue += len(pool.waiters)
                in_flight += pool.in_flight
                for member in pool.members:
                    memory += self.rss(member.instance.pid) or 0
        point = series.point(
            now,
            seconds,
            done,
            queue_depth=queue,
            in_flight=in_flight,
            memory_bytes=memory,
            gateway_bytes=self.rss(os.getpid()),
        )
        self.series.add(point)
        if self.subscribers:
            self.publish("sample", point, admin=True)
        return point

    def _forget_stale(self, now: float) -> None:
        """Traces done but never finished (their finishing failed) leave the running set."""
        for key, trace in list(self.running.items()):
            took = trace.result.duration_ns
            if took and now - trace.asked.wall - took / 1e9 > STALE:
                del self.running[key]

    def _models(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._conditions_at >= CONDITIONS_EVERY:
            self._conditions_at = now
            try:
                self._conditions = self.conditions_of()
            except Exception:  # the store is busy or gone: keep the last ones
                logger.exception("reading the conditions for the dashboard failed")
        return dashboard.models_view(self.scheduler(), self._conditions, self.remotes(), self.rss)

    def _send_models(
        self, sub: Subscriber, models: list[dict[str, Any]], now: float, force: bool = False
    ) -> None:
        rows = dashboard.for_grant(models, sub.admin, sub.sees)
        names = {r["name"] for r in rows}
        memory = dashboard.memory_for_grant(
            dashboard.memory_view(self.scheduler()), sub.admin, names
        )
        stable = orjson.dumps([[_without_volatile(r) for r in rows], memory])
        if force or stable != sub.models or now - sub.models_at >= REFRESH:
            sub.models, sub.models_at = stable, now
            event = {"time": now, "models": rows, "memory": memory}  # memory: the bars
            if not sub.put(encode("models", event)):
                self._drop(sub)


def _without_volatile(row: dict[str, Any]) -> dict[str, Any]:
    """A model row without what changes by itself (memory, the keep-alive countdown)."""
    instances = [
        {k: v for k, v in i.items() if k not in ("memory_bytes", "keep_alive_remaining")}
        for i in row["instances"]
    ]
    return {**row, "instances": instances}
