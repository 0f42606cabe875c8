"""Anthropic message batches, run in the background at low priority.

A batch (`submit`: every request checked first, by the route) is kept in memory and
written behind to the store (`blazar.serve.request.batch_store`), so it survives a
restart of serve: requests still queued, and those that were running when serve
stopped, run again; results are kept. Each request is a `/v1/messages` request run on
the one request path with no client waiting (`Pipeline.complete`, with the `Ask` the
route makes for it), and its result (the message, or the error in Anthropic's shape) is
written to the store and dropped from memory; `results` reads them back.

Interactive requests never wait behind a batch (docs/compatibility.md): a batch's
request starts only when its model has a free slot and nobody waits in the model's
queue, and at most `serving.batch_in_flight` of them run on one model at once
(`may_start`, pure). Requests of one model start oldest batch first. A request that
finds the model busy after all (a slot taken in between) goes back to the queue.

`cancel` ends the queued requests `canceled` (those running finish); requests not run
by `expires_at` (`serving.batch_expiry` after creation) end `expired`; a batch ends
when every request has a result, and is pruned `serving.batch_retention` after it was
created. With keys in use, a key sees only the batches it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols import ProtocolError
from blazar.protocols import anthropic_batches as shapes
from blazar.protocols.anthropic_batches import (
    CANCELED,
    CANCELING,
    ENDED,
    EXPIRED,
    IN_PROGRESS,
    QUEUED,
    Request,
)
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.batch_store import BatchStore, pages
from blazar.serve.request.job_table import JobTable, pruning
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.state.remotes import Forward
from blazar.serve.supervisor.scheduler import Busy, ModelNotFound, Starting, Target

RUNNING = "running"  # in memory only: the store keeps such a request queued
POLL = 0.05  # seconds between looks at a model that had no free slot
RETRY_WRITE = 0.5
MAX_LIVE = 1_000_000  # requests queued or running, all batches together
logger = logging.getLogger("blazar.serve")


def may_start(*, in_flight: int, capacity: int, queued: int, ours: int, limit: int) -> bool:
    """Whether a batch's request may take a slot of a model now: fewer than `limit` of the
    batches' requests run on it, a slot is free, and no request waits in its queue."""
    return ours < limit and queued == 0 and in_flight < capacity


@dataclass
class Item:
    idx: int
    custom_id: str
    state: str = QUEUED
    params: dict[str, Any] | None = None  # until it has a result


@dataclass
class Batch:
    id: str
    key: str | None
    created_at: float
    expires_at: float
    items: list[Item]
    status: str = IN_PROGRESS
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    running: int = 0
    left: int = 0  # requests without a result yet

    def __post_init__(self) -> None:
        self.left = sum(1 for i in self.items if i.state in (QUEUED, RUNNING))

    def to_api(self, base_url: str) -> dict[str, Any]:
        return shapes.batch_object(
            self.id,
            self.status,
            [i.state for i in self.items],
            created_at=self.created_at,
            expires_at=self.expires_at,
            ended_at=self.ended_at,
            cancel_initiated_at=self.cancel_initiated_at,
            base_url=base_url,
        )

    def row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "status": self.status,
            "requests": len(self.items),
            "created_at": shapes.iso(self.created_at),
            "expires_at": shapes.iso(self.expires_at),
            "ended_at": shapes.iso(self.ended_at),
            "cancel_initiated_at": shapes.iso(self.cancel_initiated_at),
        }


def not_found(batch_id: str) -> ProtocolError:
    return ProtocolError(
        404,
        f"no message batch '{batch_id}' here (ended batches are kept for serving.batch_retention)",
        "not_found_error",
    )


@dataclass
class MessageBatches:
    """The batches of one gateway: in memory, written behind to the store, run by one
    task (`_dispatch`) that starts each request when its model may take it."""

    store: BatchStore
    pipeline: Pipeline
    ask_for: Callable[[dict[str, Any]], Ask]  # a Messages request's Ask (the route's)
    in_flight: Callable[[], int]  # serving.batch_in_flight, now
    expiry: Callable[[], float]  # serving.batch_expiry
    retention: Callable[[], float]  # serving.batch_retention
    clock: Callable[[], float] = time.time
    batches: JobTable[Batch] = field(default_factory=lambda: JobTable(not_found))
    _queues: dict[str, deque[tuple[Batch, Item]]] = field(default_factory=dict)  # by model
    _ours: dict[str, int] = field(default_factory=dict)  # running, by served model
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _dirty_batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    _dirty_items: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    _gone: set[str] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    _helpers: list[asyncio.Task[None]] = field(default_factory=list)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Load the store's batches (each request not ended is queued again), then run."""
        loaded = await asyncio.to_thread(self.store.load)
        items: dict[str, list[Item]] = {}
        for batch_id, idx, custom_id, state, params in loaded.requests:
            item = Item(idx, custom_id, state, json.loads(params) if params else None)
            items.setdefault(batch_id, []).append(item)
        for row in loaded.batches:
            batch = Batch(
                row["id"],
                row["key"],
                shapes.epoch(row["created_at"]) or 0.0,
                shapes.epoch(row["expires_at"]) or 0.0,
                items.get(row["id"], []),
                status=row["status"],
                ended_at=shapes.epoch(row["ended_at"]),
                cancel_initiated_at=shapes.epoch(row["cancel_initiated_at"]),
            )
            self.batches[batch.id] = batch
            for item in batch.items:
                if item.state == QUEUED and item.params is not None:
                    self._enqueue(batch, item)
            self._settle(batch)
        self._helpers = [
            asyncio.create_task(self._dispatch(), name="message batches"),
            asyncio.create_task(self._writer()),
            asyncio.create_task(pruning(self.prune)),
        ]

    async def close(self) -> None:
        """Stop: running requests are abandoned (queued again in the store, they run after
        a restart) and what changed is written, waiting a little for the apply lock."""
        for task in [*self._helpers, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._helpers, *self._tasks, return_exceptions=True)
        await self._flush(timeout=10.0)

    # -- the API ------------------------------------------------------------------------

    def submit(self, requests: list[Request], key: str | None) -> Batch:
        live = sum(len(q) for q in self._queues.values())
        if live + len(requests) > MAX_LIVE:
            raise Busy(f"{live} batch requests are queued; retry later", retry_after=60)
        now = self.clock()
        batch = Batch(
            f"msgbatch_{uuid.uuid4().hex[:24]}",
            key,
            now,
            now + self.expiry(),
            [Item(i, r.custom_id, params=r.params) for i, r in enumerate(requests)],
        )
        self.batches[batch.id] = batch
        self._dirty_batches[batch.id] = batch.row()
        for item in batch.items:
            self._mark(batch, item)
            self._enqueue(batch, item)
        self._wake.set()
        return batch

    def get(self, batch_id: str, key: str | None = None, *, keyed: bool = False) -> Batch:
        """The batch, if it exists and (with keys in use) the key that asks made it."""
        return self.batches.owned(batch_id, key, keyed=keyed)

    def visible(self, key: str | None = None, *, keyed: bool = False) -> list[Batch]:
        """The batches the key sees, newest first."""
        return self.batches.visible(key, keyed=keyed)

    def cancel(self, batch_id: str, key: str | None = None, *, keyed: bool = False) -> Batch:
        """Queued requests end canceled; running ones finish; then the batch ends."""
        batch = self.get(batch_id, key, keyed=keyed)
        if batch.status == IN_PROGRESS:
            batch.status, batch.cancel_initiated_at = CANCELING, self.clock()
            self._end_queued(batch, CANCELED)
            self._settle(batch)
        return batch

    def wake(self) -> None:
        """Look again now rather than at the next poll (up to a second away): the
        dispatcher starts what may start and expires what is due by the clock. For an
        injected clock that moved; serve's own clock needs no nudge."""
        self._wake.set()

    def delete(self, batch_id: str, key: str | None = None, *, keyed: bool = False) -> None:
        batch = self.get(batch_id, key, keyed=keyed)
        if batch.status != ENDED:
            raise ProtocolError(
                400,
                f"message batch '{batch_id}' is {batch.status}: cancel it "
                f"(POST /v1/messages/batches/{batch_id}/cancel) and let it end first",
                "invalid_request_error",
            )
        self._forget(batch)

    async def results(self, batch: Batch) -> AsyncIterator[bytes]:
        """An ended batch's results as JSON Lines, in request order, read from the store
        (results not written yet come from memory)."""
        await self._flush(timeout=5.0)
        pending = {idx: row for (bid, idx), row in self._dirty_items.items() if bid == batch.id}
        reader = pages(self.store, batch.id)
        while (rows := await asyncio.to_thread(next, reader, None)) is not None:
            for idx, custom_id, result in rows:
                row = pending.pop(idx, None)
                if row is not None:
                    custom_id, result = row["custom_id"], row["result"]
                if result is not None:
                    yield shapes.result_line(custom_id, json.loads(result))
        for row in pending.values():  # never written yet (the store is locked)
            if row["result"] is not None:
                yield shapes.result_line(row["custom_id"], json.loads(row["result"]))

    # -- running ------------------------------------------------------------------------

    def _enqueue(self, batch: Batch, item: Item, *, front: bool = False) -> None:
        model = str((item.params or {}).get("model", ""))
        queue = self._queues.setdefault(model, deque())
        queue.appendleft((batch, item)) if front else queue.append((batch, item))

    async def _dispatch(self) -> None:
        while True:
            blocked = self._start_what_may()
            self._expire()
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that
            # comes as the event is set, and serve's stop would wait for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL if blocked else 1.0):
                    await self._wake.wait()
            self._wake.clear()

    def _start_what_may(self) -> bool:
        """Start every request a model may take now; True when one had to wait."""
        blocked = False
        for model, queue in list(self._queues.items()):
            while queue and queue[0][1].state != QUEUED:  # canceled or expired meanwhile
                queue.popleft()
            if not queue:
                del self._queues[model]
                continue
            try:
                target = self.pipeline.resolve(None, model)
            except Starting:
                blocked = True
                continue
            except (ModelNotFound, ProtocolError) as exc:  # removed since: each errs
                known = steps.failure(exc)
                assert known is not None
                while queue:
                    batch, item = queue.popleft()
                    if item.state == QUEUED:
                        self._finish(batch, item, shapes.errored(known.status, known.message))
                continue
            if isinstance(target, Forward):
                continue  # never: where() forwards only for a client
            served = target.runtime.name
            while queue and self._free(target, served):
                batch, item = queue.popleft()
                if item.state == QUEUED:
                    self._launch(batch, item, served)
            blocked = blocked or bool(queue)
        return blocked

    def _free(self, target: Target, served: str) -> bool:
        pool = target.pool
        return may_start(
            in_flight=pool.in_flight,
            capacity=pool.capacity,
            queued=len(pool.waiters),
            ours=self._ours.get(served, 0),
            limit=self.in_flight(),
        )

    def _launch(self, batch: Batch, item: Item, served: str) -> None:
        item.state = RUNNING
        batch.running += 1
        self._ours[served] = self._ours.get(served, 0) + 1
        task = asyncio.create_task(self._run(batch, item, served), name=f"batch {batch.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: Batch, item: Item, served: str) -> None:
        result: dict[str, Any] | None = None
        try:
            answer = await self.pipeline.complete(self.ask_for(item.params or {}))
            result = shapes.succeeded(answer)
        except (Busy, Starting):  # the slot went to someone else after all: queued again
            pass
        except asyncio.CancelledError:  # serve is stopping: the store keeps it queued
            item.state = QUEUED
            raise
        except Exception as exc:
            known = steps.failure(exc)
            if known is None:  # a bug: the result says so, serve's log has the traceback
                logger.exception("message batch %s request %d failed", batch.id, item.idx)
                known = steps.Failure(500, f"internal error ({type(exc).__name__})")
            result = shapes.errored(known.status, known.message, known.code)
        finally:
            batch.running -= 1
            self._ours[served] -= 1
            self._wake.set()
        if result is None:
            item.state = QUEUED
            if batch.status == IN_PROGRESS:
                self._enqueue(batch, item, front=True)
            else:
                self._finish(batch, item, {"type": CANCELED})
            return
        self._finish(batch, item, result)

    def _finish(
        self, batch: Batch, item: Item, result: dict[str, Any], settle: bool = True
    ) -> None:
        item.state, item.params = result["type"], None
        batch.left -= 1
        self._mark(batch, item, json.dumps(result))
        if settle:
            self._settle(batch)

    def _end_queued(self, batch: Batch, state: str) -> None:
        ended = [i for i in batch.items if i.state == QUEUED]
        for item in ended:
            self._finish(batch, item, {"type": state}, settle=False)
        if ended:
            self._settle(batch)

    def _settle(self, batch: Batch) -> None:
        """End the batch once every request has a result."""
        if batch.status != ENDED and batch.left == 0:
            batch.status, batch.ended_at = ENDED, self.clock()
        self._dirty_batches[batch.id] = batch.row()
        self._wake.set()

    def _expire(self) -> None:
        now = self.clock()
        for batch in list(self.batches.values()):
            if batch.status != ENDED and batch.expires_at <= now:
                self._end_queued(batch, EXPIRED)

    # -- the store ----------------------------------------------------------------------

    def _mark(self, batch: Batch, item: Item, result: str | None = None) -> None:
        params = json.dumps(item.params) if item.params is not None else None
        self._dirty_items[(batch.id, item.idx)] = {
            "batch_id": batch.id,
            "idx": item.idx,
            "custom_id": item.custom_id,
            "state": item.state if item.state != RUNNING else QUEUED,
            "params": params,
            "result": result,
        }

    def _forget(self, batch: Batch) -> None:
        del self.batches[batch.id]
        self._dirty_batches.pop(batch.id, None)
        for key in [k for k in self._dirty_items if k[0] == batch.id]:
            del self._dirty_items[key]
        self._gone.add(batch.id)
        self._wake.set()

    async def _flush(self, timeout: float = 0.0) -> bool:
        """Write what changed; one write at a time (a second waits for the first)."""
        async with self._writing:
            if not (self._dirty_batches or self._dirty_items or self._gone):
                return True
            batches, items, gone = self._dirty_batches, self._dirty_items, self._gone
            self._dirty_batches, self._dirty_items, self._gone = {}, {}, set()
            written = False
            try:
                written = await asyncio.to_thread(
                    self.store.write,
                    list(batches.values()),
                    list(items.values()),
                    sorted(gone),
                    timeout,
                )
            finally:
                if not written:  # put them back (also when cancelled); newer states win
                    self._dirty_batches = {**batches, **self._dirty_batches}
                    self._dirty_items = {**items, **self._dirty_items}
                    self._gone |= gone
            return written

    async def _writer(self) -> None:
        """Write behind, at most every RETRY_WRITE: many results go in one transaction."""
        while True:
            await asyncio.sleep(RETRY_WRITE)
            await self._flush()

    def prune(self) -> list[str]:
        """Forget ended batches created more than serving.batch_retention ago."""
        cutoff = self.clock() - self.retention()
        old = [b for b in self.batches.values() if b.status == ENDED and b.created_at < cutoff]
        for batch in old:
            self._forget(batch)
        return [b.id for b in old]
