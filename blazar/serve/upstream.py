"""What the ollama and Anthropic routes share: timed leases, engine calls, SSE reading.

The gateway's OpenAI routes pass bytes through untouched. The ollama routes
(`ollama_api`, `ollama_admin`) and the Anthropic routes (`anthropic_api`)
translate instead: they take a lease from the scheduler like the OpenAI path
(slots, queue, `x-blazar-priority`), post the JSON a translator in
`blazar.protocols` built to the leased instance, and read JSON or server-sent
events back. This module holds those steps, with the load time measured the
way ollama reports it, and `Control`: what the daemon lends the routes that
change the manifest (`/api/pull`, `/api/delete`, `/api/copy`, `/api/create`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from blazar.paths import Paths
from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.sse import SSEDecoder
from blazar.serve.instance import InstanceFailed, State
from blazar.serve.scheduler import Lease, Scheduler, SchedulerError
from blazar.store import Store

TRACE = "x-request-id"  # the same header and request key as the gateway's
PRIORITY = "x-blazar-priority"


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


def trace_id(request: web.Request) -> str:
    """The request's trace id: the client's `x-request-id`, or a new one (kept per request)."""
    trace = request.get("trace")
    if isinstance(trace, str):
        return trace
    trace = request.headers.get(TRACE) or uuid.uuid4().hex
    request["trace"] = trace
    return trace


def add_retry_after(headers: MutableMapping[str, str], retry_after: float | None) -> None:
    """A 503 says when to retry, in whole seconds, at least one."""
    if retry_after is not None:
        headers["Retry-After"] = str(int(max(1, retry_after)))


def now_rfc3339() -> str:
    """The gateway's clock as ollama writes it (UTC, microseconds, `Z`)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a ProtocolError(400) that says what is wrong."""
    raw = await request.read()
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError as exc:
        raise ProtocolError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(400, "the request body must be a JSON object")
    return body


@dataclass
class Timed:
    """A lease with the clock of its request: when it started and how long loading took."""

    lease: Lease
    started: int  # time.perf_counter_ns() when the request arrived
    load_ns: int  # time spent in acquire while the model was not ready; 0 if it was

    def total(self) -> int:
        return time.perf_counter_ns() - self.started


def _ready(scheduler: Scheduler, model: str) -> bool:
    pool, _ = scheduler.lookup(model)
    return pool.loaded and all(m.instance.state == State.READY for m in pool.members)


async def acquire(
    scheduler: Scheduler,
    request: web.Request,
    model: str,
    *,
    started: int,
    keep_alive: float | None = None,
) -> Timed:
    """A slot on an instance of `model`, loading it if needed; the load time is measured.

    Raises SchedulerError (404 unknown model, 503 busy) or InstanceFailed.
    """
    ready = _ready(scheduler, model)
    begin = time.perf_counter_ns()
    priority = request.headers.get(PRIORITY, "").lower() == "high"
    lease = await scheduler.acquire(model, priority=priority, keep_alive=keep_alive)
    return Timed(lease, started, 0 if ready else time.perf_counter_ns() - begin)


def failure(exc: BaseException, model: str) -> tuple[int, str, float | None] | None:
    """(status, message, retry_after) for what acquiring or calling an engine raised."""
    if isinstance(exc, SchedulerError):
        return exc.status, str(exc), exc.retry_after
    if isinstance(exc, InstanceFailed):
        return 502, f"model '{model}' failed to start: {exc}", None
    if isinstance(exc, aiohttp.ClientError | ConnectionError):
        return 502, f"model '{model}' failed while answering: {exc or type(exc).__name__}", None
    return None


def engine_body(lease: Lease, body: dict[str, Any]) -> dict[str, Any]:
    """The body to send, with the LoRA adapter turned on for a `model#adapter` request."""
    if lease.adapter is None:
        return body
    index = lease.runtime.adapter_index(lease.adapter)
    scale = lease.runtime.adapters[index].scale if index is not None else 1.0
    return {**body, "lora": [{"id": index, "scale": scale}]}


def _decode(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")


async def call(session: aiohttp.ClientSession, lease: Lease, req: EngineRequest) -> tuple[int, Any]:
    """Post a whole (non-streamed) request; return the engine's status and decoded body."""
    body = engine_body(lease, req.body)
    async with session.post(lease.url + req.path, json=body) as upstream:
        return upstream.status, _decode(await upstream.read())


@asynccontextmanager
async def stream(
    session: aiohttp.ClientSession, lease: Lease, req: EngineRequest
) -> AsyncIterator[aiohttp.ClientResponse]:
    """Post a streamed request; the response is closed (the engine stops) however the
    caller leaves, a client that went away included."""
    body = engine_body(lease, req.body)
    # llama-server hangs up after every streamed response although it advertises
    # keep-alive; pooled, that connection would fail the next request ("Server
    # disconnected") if taken before its FIN is read. Asking for close keeps it unpooled.
    headers = {"Connection": "close"}
    async with session.post(lease.url + req.path, json=body, headers=headers) as upstream:
        try:
            yield upstream
        finally:
            upstream.close()


def is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.status == 200 and upstream.headers.get("Content-Type", "").startswith(
        "text/event-stream"
    )


async def error_body(upstream: aiohttp.ClientResponse) -> Any:
    """The decoded body of an engine response that is not a stream (an error, usually)."""
    return _decode(await upstream.read())


async def events(upstream: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The data of each server-sent event as it arrives (parsed JSON, or `DONE`)."""
    decoder = SSEDecoder()
    async for chunk in upstream.content.iter_any():
        for event in decoder.feed(chunk):
            yield event.data
    for event in decoder.close():
        yield event.data
