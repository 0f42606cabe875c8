"""The one request path every protocol takes: resolve once, lease once, one engine body,
failures mapped once.

A route (OpenAI in `openai_api`, ollama in `ollama_api`, Anthropic in
`anthropic_api`) parses its body and translates it; everything after that is
here and the same for all three:

1. `resolve`: the requested name -> a `Target` (model pool and adapter), or a
   404 that names the models served; a model the request's API key may not use
   is answered the same way (`grants`), so the key learns nothing of it.
2. `require`: the model can do what the route needs (a chat template for chat,
   embeddings for embeddings), or one 400 that says how to fix it.
3. `lease`: a slot from the scheduler (`x-blazar-priority` read here), with
   the load time measured the way ollama reports it; a start failure is a 502.
4. `engine_body`: the body with the adapter of a `model#adapter` request on.
5. `failure`: every exception a route may raise -> (status, message, code,
   Retry-After). The `errors` middleware in `blazar.serve.app` answers with it
   in the route's envelope (`blazar.serve.envelopes`), so routes only raise.

`blazar.serve.engine` posts the body to the child and reads what comes back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from blazar.errors import AlreadyExists, BlazarError, Conflict, InvalidInput, NotFound
from blazar.protocols import ProtocolError
from blazar.reconcile import InvalidManifest
from blazar.serve.grants import grant_of
from blazar.serve.http import wants_priority
from blazar.serve.instance import InstanceFailed
from blazar.serve.runtime import ModelRuntime
from blazar.serve.runtime import resolve as resolve_name
from blazar.serve.scheduler import Lease, Scheduler, SchedulerError, Target, model_not_found
from specs.names import InvalidName
from specs.sources import InvalidSource

CHAT, EMBEDDINGS, ANY = "chat", "embeddings", "any"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Failure:
    """How an error is answered: status, message, the protocol's code, Retry-After."""

    status: int
    message: str
    code: str | None = None
    retry_after: float | None = None


def failure(exc: BaseException) -> Failure | None:
    """The answer for an exception a route raised; None for one that is a bug."""
    if isinstance(exc, ProtocolError):
        return Failure(exc.status, exc.message, exc.code)
    if isinstance(exc, SchedulerError):
        return Failure(exc.status, str(exc), exc.code, exc.retry_after)
    if isinstance(exc, NotFound):
        return Failure(404, str(exc))
    if isinstance(exc, Conflict | AlreadyExists):
        return Failure(409, str(exc))
    if isinstance(exc, InvalidInput | InvalidManifest | InvalidName | InvalidSource):
        return Failure(400, str(exc))
    if isinstance(exc, BlazarError):
        return Failure(500, str(exc))
    return None


def resolve(scheduler: Scheduler, requested: Any, request: web.Request) -> Target:
    """The model a request names; a 400 when `model` is missing, a 404 when unknown or
    not one the request's API key may use (then only the models it may use are named)."""
    if not isinstance(requested, str) or not requested:
        raise ProtocolError(
            400, "'model' is required: a string naming a model", "invalid_request_error"
        )
    grant = grant_of(request)
    if grant is None or grant.models is None:
        return scheduler.resolve(requested)
    try:
        runtime: ModelRuntime | None = resolve_name(scheduler.runtimes, requested)[0]
    except KeyError:
        runtime = None
    if runtime is None or not grant.sees(runtime.name, runtime.aliases):
        visible = (r.name for r in scheduler.runtimes.values() if grant.sees(r.name, r.aliases))
        raise model_not_found(requested, visible)
    return scheduler.resolve(requested)


def free_name(scheduler: Scheduler, name: str, target: Target) -> None:
    """Refuse a new name for the target's model that already names another model."""
    try:
        taken = scheduler.resolve(name).pool
    except SchedulerError:
        return
    if taken is not target.pool:
        raise InvalidInput(
            f"'{name}' already names model '{taken.runtime.name}': delete it first "
            "(`ollama rm`, `blazar rm`) or choose another name"
        )


def require(runtime: ModelRuntime, need: str, *, alternative: str = "") -> None:
    """Refuse (400) a request the model cannot serve; `alternative` is the route's own way
    out (for example "use /v1/completions, or ")."""
    if need == CHAT and (refusal := runtime.chat_refusal(alternative)) is not None:
        raise ProtocolError(400, refusal, "invalid_request_error")
    if need == EMBEDDINGS and not runtime.embeddings:
        raise ProtocolError(
            400,
            f"model '{runtime.name}' is not served for embeddings: set embeddings = true for "
            "it in the manifest and apply",
            "invalid_request_error",
        )


@dataclass
class Timed:
    """A lease with the clock of its request: when it started and how long loading took."""

    lease: Lease
    started: int  # time.perf_counter_ns() when the request arrived
    load_ns: int  # time spent in acquire while the model was not ready; 0 if it was

    def total(self) -> int:
        return time.perf_counter_ns() - self.started


async def lease(
    scheduler: Scheduler,
    request: web.Request,
    target: Target,
    *,
    keep_alive: float | None = None,
    started: int | None = None,
) -> Timed:
    """A slot on an instance of the target's model, loading it if needed.

    Raises SchedulerError (503 busy, ...) or a 502 ProtocolError when the model
    failed to start. Give it back with `scheduler.release(timed.lease, ...)`.
    """
    ready = target.ready
    begin = time.perf_counter_ns()
    try:
        leased = await scheduler.acquire(
            target, priority=wants_priority(request), keep_alive=keep_alive
        )
    except InstanceFailed as exc:
        raise ProtocolError(
            502, f"model '{target.runtime.name}' failed to start: {exc}", "upstream_error"
        ) from None
    load_ns = 0 if ready else time.perf_counter_ns() - begin
    return Timed(leased, begin if started is None else started, load_ns)


def engine_body(lease: Lease, body: dict[str, Any]) -> dict[str, Any]:
    """The body to send, with the LoRA adapter turned on for a `model#adapter` request."""
    if lease.adapter is None:
        return body
    index = lease.runtime.adapter_index(lease.adapter)
    scale = lease.runtime.adapters[index].scale if index is not None else 1.0
    return {**body, "lora": [{"id": index, "scale": scale}]}
