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
   the load time measured the way ollama reports it; a start failure is a 502,
   a model no installed engine supports a 400 that says what to install.
4. `engine_body`: the body with the adapters the request chose (`model+adapter`,
   `model+none`; the model's always-on ones otherwise) on, for that request only,
   and the model's `system` prompt and `params` where the request sets none.
   `admit` (docs/sessions.md), after the lease: the prompt preflight (a 400 for
   a prompt that cannot fit) and the sessions' slot routing (`id_slot`), and
   `keep_alive` reads a request's keep_alive (body field or header).
   Steps 1 and 3 note what they did on the request's trace (`blazar.observe.trace`).
   The fleet (`blazar.serve.state.remotes`): step 1 raises `Forward` for a model only a
   remote serves, and step 3 (`spill`) when this host cannot serve a model that has
   a `failover` chain (busy with the queue full, a failed load); `blazar.serve.gateway.relay`
   carries it out.
5. `failure`: every exception a route may raise -> (status, message, code,
   Retry-After). The `errors` middleware in `blazar.serve.gateway.app` answers with it
   in the route's envelope (`blazar.serve.request.envelopes`), so routes only raise.

`blazar.serve.request.child_calls` posts the body to the child and reads what comes back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from blazar.errors import AlreadyExists, BlazarError, Conflict, InvalidInput, NotFound
from blazar.observe.trace import current
from blazar.protocols import ProtocolError
from blazar.protocols.ollama import keep_alive_seconds
from blazar.protocols.ollama_options import SAMPLING_OPTIONS
from blazar.reconcile import InvalidManifest
from blazar.serve.http import wants_priority
from blazar.serve.request.grants import grant_of
from blazar.serve.request.prompts import KINDS, Prompts
from blazar.serve.state.remotes import FAILOVER, FLEET, FORWARDED, Fleet, Forward
from blazar.serve.state.sessions import Sessions
from blazar.serve.supervisor.child_http import UpstreamError
from blazar.serve.supervisor.instance import InstanceFailed
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.runtime import resolve as resolve_name
from blazar.serve.supervisor.scheduler import (
    Lease,
    ModelNotFound,
    Scheduler,
    SchedulerError,
    Target,
    model_not_found,
)
from specs.names import InvalidName
from specs.sources import InvalidSource

CHAT, EMBEDDINGS, ANY = "chat", "embeddings", "any"
TOOLS, THINKING = "tools", "thinking"  # what a chat template may or may not render
TRANSCRIPTION, SPEECH = "transcription", "speech"  # the audio routes' kinds of model
# Where each kind of model is served, for the 400 a request of another kind gets.
SERVED_ON = {
    "chat": "/v1/chat/completions, /v1/completions, /api/chat, /v1/messages",
    TRANSCRIPTION: "/v1/audio/transcriptions or /v1/audio/translations",
    SPEECH: "/v1/audio/speech",
}
KEEP_ALIVE = "x-blazar-keep-alive"
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
    trace = current()
    if trace is not None:  # observe: the name asked for, even if it is unknown
        trace.requested = requested
    grant = grant_of(request)
    fleet = request.app.get(FLEET)
    if grant is not None and grant.models is not None:
        try:
            runtime: ModelRuntime | None = resolve_name(scheduler.runtimes, requested)[0]
        except KeyError:
            runtime = None
        if runtime is None and fleet is not None and grant.sees(requested, ()):
            _remote(fleet, request, requested)
        if runtime is None or not grant.sees(runtime.name, runtime.aliases):  # as if absent
            visible = (r.name for r in scheduler.runtimes.values() if grant.sees(r.name, r.aliases))
            raise model_not_found(requested, visible)
    try:
        target = scheduler.resolve(requested)
    except ModelNotFound:
        if fleet is not None:
            _remote(fleet, request, requested)
        raise
    if trace is not None:
        trace.model, trace.adapter = target.runtime.name, adapters_text(target)
    if fleet is not None and fleet.chains and target.runtime.name in fleet.chains:
        request[FAILOVER] = target.runtime.name  # a crash before any byte may fail over
    return target


def _remote(fleet: Fleet, request: web.Request, requested: str) -> None:
    """Raise `Forward` when a remote serves the name this host does not (never for a
    request another Blazar forwarded here: no loops)."""
    if FORWARDED in request.headers:
        return
    remote = fleet.remote_for(requested)
    if remote is not None:
        if (trace := current()) is not None:
            trace.model = requested
        raise Forward(remote, "a remote model: this host does not serve it", requested)


def spill(request: web.Request | None, target: Target, why: str) -> None:
    """Raise `Forward` to the next usable member of the model's failover chain, when it
    has one (`blazar.serve.state.remotes`): this host cannot serve the request, for `why`.
    Work no client waits on (`request` None: an async transcription job) stays here."""
    if request is None:
        return
    fleet = request.app.get(FLEET)
    if fleet is None or not fleet.chains or FORWARDED in request.headers:
        return
    member = fleet.member(target.runtime.name)
    if member is not None:
        raise Forward(member, f"failover: {why}", target.runtime.name)


def adapters_text(target: Target) -> str | None:
    """The adapters a request chose, as written (`fox`, `fox:0.5+owl`, `none`); None when
    it chose none and the model's always-on ones apply."""
    if target.adapters is None:
        return None
    if not target.adapters:
        return "none"
    return "+".join(c.name if c.scale is None else f"{c.name}:{c.scale:g}" for c in target.adapters)


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


def require(
    runtime: ModelRuntime, need: str, *, alternative: str = "", requested: str | None = None
) -> None:
    """Refuse (400) a request the model cannot serve; `alternative` is the route's own way
    out (for example "use /v1/completions, or "), `requested` the name the client used.

    TOOLS and THINKING are decided from the chat template (`runtime.capabilities`), and
    refused in ollama's words (`"<model>" does not support tools`), which clients such
    as llm-ollama read to fall back, on every protocol."""
    check_kind(runtime, need if need in (TRANSCRIPTION, SPEECH) else CHAT)
    if need == CHAT and (refusal := runtime.chat_refusal(alternative)) is not None:
        raise ProtocolError(400, refusal, "invalid_request_error")
    if need in (TOOLS, THINKING):
        require(runtime, CHAT, alternative=alternative)
        if not getattr(runtime.capabilities, need):
            raise ProtocolError(400, _missing(runtime, need, requested), "invalid_request_error")
    if need == EMBEDDINGS and not runtime.embeddings:
        raise ProtocolError(
            400,
            f"model '{runtime.name}' is not served for embeddings: set embeddings = true for "
            "it in the manifest and apply",
            "invalid_request_error",
        )


def check_kind(runtime: ModelRuntime, kind: str) -> None:
    """Refuse (400) a model of another kind than the route serves: a voice on a chat route,
    a chat model on /v1/audio/speech."""
    if runtime.kind == kind:
        return
    what = {"chat": "a chat model", TRANSCRIPTION: "a transcription (speech to text) model",
            SPEECH: "a speech (text to speech) voice"}  # fmt: skip
    raise ProtocolError(
        400,
        f"model '{runtime.name}' is {what.get(runtime.kind, runtime.kind)}, and this endpoint "
        f"needs {what.get(kind, kind)}: use it on {SERVED_ON.get(runtime.kind, 'its route')}, "
        "or name another model",
        "invalid_request_error",
    )


def _missing(runtime: ModelRuntime, need: str, requested: str | None) -> str:
    name = requested or runtime.name
    where = f"models.{runtime.name}.chat_template"
    if need == TOOLS:
        return (
            f'"{name}" does not support tools: its chat template renders no tool '
            f"definitions. Use a model whose template does, or set {where} to one that "
            "does (chatml, llama3, mistral-v3, mistral-v7) and apply"
        )
    return (
        f'"{name}" does not support thinking: its chat template has no thinking switch. '
        "Send the request without it, or use a reasoning model"
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
    request: web.Request | None,
    target: Target,
    *,
    keep_alive: float | None = None,
    started: int | None = None,
    kind: str = CHAT,
    priority: bool = False,
) -> Timed:
    """A slot on an instance of the target's model, loading it if needed.

    Raises SchedulerError (503 busy, ...) or a 502 ProtocolError when the model
    failed to start; a 400 before any spawn when no installed engine supports the
    model's architecture (what to install is in the message), or when the model is
    not of the `kind` the route serves (chat; the audio routes' transcription and
    speech). `request` None is work no client waits on (an async transcription
    job), with `priority` its request's. Give it back with
    `scheduler.release(timed.lease, ...)`.
    """
    check_kind(target.runtime, kind)
    if target.runtime.refusal is not None:
        spill(request, target, "no installed engine supports the model here")
        raise ProtocolError(400, target.runtime.refusal, "invalid_request_error")
    ready = target.ready
    begin = time.perf_counter_ns()
    try:
        leased = await scheduler.acquire(
            target,
            priority=wants_priority(request) if request is not None else priority,
            keep_alive=keep_alive,
        )
    except InstanceFailed as exc:
        spill(request, target, f"the model failed to start here ({exc})")
        raise ProtocolError(
            502, f"model '{target.runtime.name}' failed to start: {exc}", "upstream_error"
        ) from None
    except SchedulerError as exc:
        if exc.status == 503:  # busy with the queue full, no capacity: not a 4xx
            spill(request, target, str(exc))
        raise
    load_ns = 0 if ready else time.perf_counter_ns() - begin
    if (trace := current()) is not None:  # observe: the instance and how it was chosen
        trace.leased(leased, begin)
    return Timed(leased, begin if started is None else started, load_ns)


def engine_body(lease: Lease, body: dict[str, Any], path: str = "") -> dict[str, Any]:
    """The body to send to `path`: with llama-server's per-request `lora` list when the
    request chose adapters (`model+adapter`, `model+none`) or its model has always-on
    ones, and the model's `system` prompt and `params` where the request sets none; else
    `body` itself, the same object (the OpenAI route then forwards the client's bytes as
    they came). A client's own `lora` field is left alone unless the name chose adapters.

    Scales are per request, so concurrent requests to one instance each get their own
    adapters (llama-server batches only slots whose adapters match); see docs/serve.md.
    """
    runtime = lease.runtime
    lora = lease.lora
    if lora is None and runtime.system is None and not runtime.params:
        return body  # the common case: nothing to add
    out = dict(body)
    if lora is not None and (lease.adapters is not None or "lora" not in body):
        out["lora"] = lora
    if path != "/v1/embeddings":
        with_defaults(out, path, runtime.system, runtime.params)
    return out if out != body else body


# Where a Modelfile PARAMETER goes in llama-server's request bodies.
PARAM_FIELDS = {**SAMPLING_OPTIONS, "num_predict": "n_predict", "stop": "stop"}
LIMITS = ("n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens")
# What llama-server's /v1/messages keeps of a request: any other default needs its chat
# endpoint (`anthropic_chat`), as adapters do.
MESSAGES_PARAMS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "stop": "stop_sequences"}  # fmt: skip


def with_defaults(
    body: dict[str, Any], path: str, system: str | None, params: Mapping[str, Any]
) -> None:
    """Fill in (in place) the model's system prompt and parameters the request left unset."""
    messages_api = path.startswith("/v1/messages")
    if system is not None:
        if messages_api:
            body.setdefault("system", system)
        elif path == "/v1/responses":
            body.setdefault("instructions", system)
        elif isinstance(body.get("messages"), list):
            roles = {m.get("role") for m in body["messages"] if isinstance(m, dict)}
            if not roles & {"system", "developer"}:
                body["messages"] = [{"role": "system", "content": system}, *body["messages"]]
    if path.endswith("count_tokens"):
        return
    fields = MESSAGES_PARAMS if messages_api else PARAM_FIELDS
    for key, value in params.items():
        name = fields.get(key)
        if name is None or name in body:
            continue
        if key == "num_predict" and any(limit in body for limit in LIMITS):
            continue  # the request's own token limit (n_predict would override it)
        body[name] = value


def keep_alive(request: web.Request, body: dict[str, Any]) -> float | None:
    """A request's keep_alive in seconds for the scheduler, from its `keep_alive` field or
    the `x-blazar-keep-alive` header (the field wins): None (the model's own), -1 (forever),
    or seconds (0: unload after this request). As ollama spells it ("5m", 0, -1)."""
    value = body.get("keep_alive")
    if value is None:
        value = request.headers.get(KEEP_ALIVE)
        if value is None:
            return None
    seconds = keep_alive_seconds(value)
    return -1.0 if seconds is None else seconds


async def admit(
    prompts: Prompts,
    sessions: Sessions | None,
    lease: Lease,
    path: str,
    body: dict[str, Any],
    size: int,
) -> int | None:
    """What happens between the lease and the engine call: the preflight refuses (400) a
    prompt that cannot fit its slot, and the sessions name the slot the request must go to
    (restoring a banked session into it first). Returns that slot (`id_slot`), or None.

    Cheap when nothing needs the prompt's tokens: `size` (the body's bytes) bounds them."""
    kind = KINDS.get(path)
    if kind is None:
        return None
    runtime = lease.runtime
    routed = sessions is not None and sessions.wants_tokens(lease)
    if not routed and not runtime.preflight:
        return None
    tokens = None
    if routed:
        try:
            tokens = await prompts.token_ids(lease.url, kind, body)
        except UpstreamError:
            tokens = None
    if runtime.preflight:
        instance = lease.member.instance
        await prompts.preflight(
            instance, lease.url, model=runtime.name, ctx=runtime.ctx, kind=kind, body=body,
            size=size, tokens=tokens,
        )  # fmt: skip
    if sessions is not None and tokens is not None:
        return await sessions.route(lease, tokens)
    return None
