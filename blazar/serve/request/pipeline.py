"""The one request path: every model route hands its `Ask` to `Pipeline.serve`.

A route parses its protocol's body into an `Ask` (`blazar.serve.request.asks`); the
pipeline then takes the same steps for all of them, in this order:

1. resolve: the requested name -> this host's model (`Target`: pool, adapters,
   replica) or a remote's (`Forward`); a model the request's API key may not use is
   answered as an unknown one (404, naming only what the key sees).
2. plan: the `Ask`'s plan for the engine that will answer (`native` for llama-server,
   `openai` for an engine that speaks only OpenAI's API).
3. require: the model can do what the plan needs (`steps.require`, once).
4. keep_alive: the request's (body field or header; `steps.keep_alive`).
5. lease: a slot from the scheduler (`x-blazar-priority` read here), with the load
   time measured; a start failure is a 502, and with a `failover` chain a full queue,
   a failed load or a child failing before any byte goes to the chain's next member.
6. admit: the prompt preflight (a prompt that cannot fit is a 400; an output that
   cannot is capped, said in `x-blazar-max-tokens-capped`), the sessions' slot routing
   (`id_slot`), and the adapters and model defaults (`steps.engine_body`); a body
   nothing changed travels as the client's bytes.
7. trace: what was sent and what came back, on the request's trace
   (`blazar.observe.trace`); helper calls (templates, tokens) never are.
8. call and answer: the engine's reply, whole or streamed, through the plan's
   `Answer`; a stream the engine breaks off ends with the envelope's error event.
9. release: the slot goes back with the request's keep_alive.

`held` is steps 1 to 5 and 9 for the audio routes and the async jobs, whose call is
their own; `complete` is the whole path for work no client waits on (no request), and
`events` the same path streamed (a realtime session's answer, event by event).
Failures are raised as `ProtocolError`/`SchedulerError` and answered in the route's
envelope by the gateway's middleware (`steps.failure`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from blazar.observe.speculation import HEADER
from blazar.observe.trace import current
from blazar.protocols import EngineRequest, LoadOnly, ProtocolError
from blazar.serve.request import forward, steps
from blazar.serve.request.admission import admitted
from blazar.serve.request.asks import OPENAI_DIALECT, Ask, Done, Plan
from blazar.serve.request.child_calls import (
    Child,
    ChildUpstream,
    decode,
    gate,
    refused,
)
from blazar.serve.request.exchange import Sent, dumps, events, exchange, fetch, whole
from blazar.serve.request.grants import grant_of
from blazar.serve.request.prompts import Prompts
from blazar.serve.request.singleflight import SingleFlight, deterministic
from blazar.serve.state.remotes import Fleet, Forward
from blazar.serve.state.sessions import Sessions
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.instance import InstanceFailed
from blazar.serve.supervisor.scheduler import (
    Lease,
    ModelNotFound,
    Scheduler,
    SchedulerError,
    Target,
)
from specs.serving import Serving

PRIORITY = "x-blazar-priority"


@dataclass
class Timed:
    """A lease with the clock of its request: when it started and how long loading took."""

    lease: Lease
    started: int  # time.perf_counter_ns() when the request arrived
    load_ns: int  # time spent in acquire while the model was not ready; 0 if it was

    def total(self) -> int:
        return time.perf_counter_ns() - self.started


class Pipeline:
    """The request path of one gateway: the scheduler, the child client, the prompt
    counter, the sessions, the fleet and singleflight, and the `[serving]` settings."""

    def __init__(
        self,
        scheduler: Scheduler,
        children: ChildConnections,
        *,
        sessions: Sessions | None = None,
        fleet: Fleet | None = None,
        serving: Serving | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.children = children
        self.prompts = Prompts(children)
        self.sessions = sessions
        self.fleet = fleet if fleet is not None else Fleet()
        self.singleflight = SingleFlight()
        self.serving = serving if serving is not None else Serving()

    # -- 1. resolve ---------------------------------------------------------------------

    def where(self, request: web.Request | None, requested: Any) -> Target | Forward:
        """The model a request names: this host's, or a remote's; a 400 when `model` is
        missing, a 404 when unknown or not one the request's API key may use."""
        if not isinstance(requested, str) or not requested:
            raise ProtocolError(
                400, "'model' is required: a string naming a model", "invalid_request_error"
            )
        trace = current()
        if trace is not None:  # observe: the name asked for, even if it is unknown
            trace.requested = requested
        grant = grant_of(request) if request is not None else None
        visible = None
        if grant is not None and grant.models is not None:
            sees = grant.sees
            visible = lambda r: sees(r.name, r.aliases)  # noqa: E731
        try:
            target = self.scheduler.resolve(requested, visible)
        except ModelNotFound:
            remote = self.fleet.remote_for(requested) if not forward.forwarded(request) else None
            if remote is None or (grant is not None and not grant.sees(requested, ())):
                raise
            if trace is not None:
                trace.model = requested
            return Forward(remote, "a remote model: this host does not serve it", requested)
        if trace is not None:
            trace.model, trace.adapter = target.runtime.name, steps.adapters_text(target)
        return target

    def here(self, request: web.Request, requested: Any) -> Target:
        """The model a route that acts on this host's models names (copy, stop, sessions):
        a remote's model is a 404 that says so."""
        where = self.where(request, requested)
        if isinstance(where, Forward):
            raise ProtocolError(
                404,
                f"model '{where.model}' is served by remote '{where.remote.name}': "
                f"{request.method} {request.path} acts on this host's models only",
                "model_not_found",
            )
        return where

    def _member(self, request: web.Request | None, model: str, why: str) -> Forward | None:
        """The next usable member of the model's failover chain, when this host cannot
        serve the request for `why`; never for work no client waits on, nor for a request
        another Blazar forwarded here."""
        if forward.forwarded(request) or not self.fleet.chains:
            return None
        member = self.fleet.member(model)
        return Forward(member, f"failover: {why}", model) if member is not None else None

    # -- the whole path -----------------------------------------------------------------

    def plan(self, ask: Ask, target: Target) -> Plan | LoadOnly:
        runtime = target.runtime
        if runtime.dialect == OPENAI_DIALECT:
            return ask.openai(runtime)
        return ask.native(runtime, target)

    async def serve(self, request: web.Request, ask: Ask) -> web.StreamResponse:
        """Carry a model route's request out, here or on a remote, and answer it."""
        where = self.where(request, ask.model)
        if isinstance(where, Forward):
            return await self.forward(request, ask, where)
        target, runtime = where, where.runtime
        if ask.images:
            await ask.resolved(runtime, self.serving)
        plan = self.plan(ask, target)
        seconds = steps.keep_alive(request.headers, ask.body)
        if isinstance(plan, LoadOnly):
            return await self._load_only(request, ask, plan, target, seconds)
        steps.require(
            runtime, plan.need or ask.need, plan.needs, alternative=ask.hint, requested=ask.model
        )
        if ask.shareable and runtime.singleflight and deterministic(ask.body):
            return await self._shared(request, ask, plan, target, seconds)
        timed = await self.lease(request, target, keep_alive=seconds, started=ask.started)
        if isinstance(timed, Forward):
            return await self.forward(request, ask, timed)
        released = False
        try:
            try:
                return await self._local(request, ask, plan, timed)
            except ProtocolError as exc:
                why = f"the local instance failed ({exc.message})"
                member = self._member(request, runtime.name, why) if forward.spills(exc) else None
                if member is None:
                    raise
            self.scheduler.release(timed.lease, keep_alive=seconds)
            released = True
            return await self.forward(request, ask, member)
        finally:
            if not released:
                self.scheduler.release(timed.lease, keep_alive=seconds)

    async def _internal(
        self, ask: Ask, priority: bool, keep_alive: float | None
    ) -> tuple[Plan, Timed, Done, EngineRequest, Sent, ChildUpstream]:
        """Steps 1 to 6 for work no client's HTTP request waits on: this host's model only.
        The caller gives the slot back (`scheduler.release`)."""
        target = self.where(None, ask.model)
        if isinstance(target, Forward):  # never: where() forwards only for a client
            raise ProtocolError(404, f"model '{ask.model}' is not served here")
        if ask.images:
            await ask.resolved(target.runtime, self.serving)
        plan = self.plan(ask, target)
        if isinstance(plan, LoadOnly):
            raise ProtocolError(400, "nothing to generate", "invalid_request_error")
        steps.require(target.runtime, plan.need or ask.need, plan.needs, requested=ask.model)
        timed = await self.lease(
            None, target, keep_alive=keep_alive, started=ask.started, priority=priority
        )
        assert not isinstance(timed, Forward)
        try:
            done = self._done(ask, timed)
            engine = plan.engine if plan.prepare is None else await plan.prepare(done)
            sent = await admitted(self.prompts, self.sessions, timed.lease, ask, engine)
        except BaseException:
            self.scheduler.release(timed.lease, keep_alive=keep_alive)
            raise
        upstream = ChildUpstream(self.children, timed.lease.url, target.runtime.name)
        return plan, timed, done, engine, sent, upstream

    async def complete(
        self, ask: Ask, *, priority: bool = False, keep_alive: float | None = None
    ) -> Any:
        """The whole path for work no client waits on (a batch, a tool loop): this host's
        model only, the answer as the plan's `Answer` builds it, decoded; `keep_alive` is
        the request's, for the tool loop of a client that asked for one."""
        plan, timed, done, engine, sent, upstream = await self._internal(ask, priority, keep_alive)
        try:
            status, payload = await fetch(upstream, engine, sent)
            answer = plan.answer(done)
            if status != 200:
                data = decode(payload)
                raise answer.refusal(status, data) or refused(status, data)
            out = await answer.whole(payload)
            return decode(out) if isinstance(out, bytes) else out
        finally:
            self.scheduler.release(timed.lease, keep_alive=keep_alive)

    async def events(self, ask: Ask, *, priority: bool = False) -> AsyncGenerator[Any, None]:
        """The whole path for a stream no client's HTTP request waits on (a realtime
        session's answer): the engine's events decoded as they arrive (`exchange.events`).
        The slot goes back when the stream ends, fails, or its consumer stops: use it
        under `contextlib.aclosing`, so that stopping early closes the engine's
        connection (the child stops generating) and releases the slot at once."""
        plan, timed, done, engine, sent, upstream = await self._internal(ask, priority, None)
        try:
            async with aclosing(events(upstream, engine, sent, plan.answer(done))) as stream:
                async for data in stream:
                    yield data
        finally:
            self.scheduler.release(timed.lease)

    def local(self, request: web.Request | None, ask: Ask) -> Target:
        """Steps 1 and 3 for a route served only here (audio): the model, able to serve
        the request now, or the refusal (a remote's model is a 404 that says why)."""
        target = self.where(request, ask.model)
        if isinstance(target, Forward):
            assert request is not None  # where() forwards only for a client
            forward.check(request, target)  # raises: this route acts on this host only
            raise AssertionError("unreachable")
        steps.require(target.runtime, ask.need)
        if target.runtime.refusal is not None:
            raise ProtocolError(400, target.runtime.refusal, "invalid_request_error")
        return target

    @asynccontextmanager
    async def held(
        self, request: web.Request | None, ask: Ask, *, priority: bool = False
    ) -> AsyncIterator[Timed]:
        """Steps 1 to 5 and 9 for a route whose call is its own (audio): a slot on an
        instance of the model, given back when the block ends."""
        target = self.local(request, ask)
        seconds = steps.keep_alive(request.headers if request is not None else {}, ask.body)
        timed = await self.lease(
            request, target, keep_alive=seconds, started=ask.started, priority=priority
        )
        if isinstance(timed, Forward):  # a kind no chain serves: say so as the lease did
            raise ProtocolError(503, f"model '{ask.model}' cannot be served here now")
        try:
            yield timed
        finally:
            self.scheduler.release(timed.lease, keep_alive=seconds)

    # -- 5. lease -----------------------------------------------------------------------

    async def lease(
        self,
        request: web.Request | None,
        target: Target,
        *,
        keep_alive: float | None = None,
        started: int | None = None,
        priority: bool = False,
    ) -> Timed | Forward:
        """A slot on an instance of the target's model, loading it if needed; or, with a
        failover chain, the member to carry the request out instead. `request` None is
        work no client waits on, with `priority` its own.

        Raises SchedulerError (503 busy, ...) or a 502 when the model failed to start; a
        400 before any spawn when no installed engine supports the model's architecture
        (what to install is in the message). Give it back with `scheduler.release`."""
        runtime = target.runtime
        if runtime.refusal is not None:
            member = self._member(request, runtime.name, "no installed engine supports it here")
            if member is not None:
                return member
            raise ProtocolError(400, runtime.refusal, "invalid_request_error")
        if request is not None:
            priority = request.headers.get(PRIORITY, "").lower() == "high"
        ready = target.ready
        begin = time.perf_counter_ns()
        try:
            leased = await self.scheduler.acquire(target, priority=priority, keep_alive=keep_alive)
        except InstanceFailed as exc:
            member = self._member(request, runtime.name, f"the model failed to start here ({exc})")
            if member is not None:
                return member
            raise ProtocolError(
                502, f"model '{runtime.name}' failed to start: {exc}", "upstream_error"
            ) from None
        except SchedulerError as exc:
            if exc.status == 503:  # busy with the queue full, no capacity: not a 4xx
                member = self._member(request, runtime.name, str(exc))
                if member is not None:
                    return member
            raise
        load_ns = 0 if ready else time.perf_counter_ns() - begin
        if (trace := current()) is not None:  # observe: the instance and how it was chosen
            trace.leased(leased, begin)
        return Timed(leased, begin if started is None else started, load_ns)

    # -- 6. admit -----------------------------------------------------------------------

    def _done(self, ask: Ask, timed: Timed) -> Done:
        lease = timed.lease
        return Done(
            ask.model,
            timed.started,
            timed.load_ns,
            Child(self.children, lease.url, lease.runtime.name),
        )

    async def _local(
        self, request: web.Request, ask: Ask, plan: Plan, timed: Timed
    ) -> web.StreamResponse:
        lease = timed.lease
        done = self._done(ask, timed)
        engine = plan.engine if plan.prepare is None else await plan.prepare(done)
        sent = await admitted(self.prompts, self.sessions, lease, ask, engine)
        # Which speculative decoding mode answers (docs/tune.md); a whole answer adds its
        # acceptance rate from the engine's timings (`_whole`).
        sent.headers[HEADER] = lease.runtime.tuning.describe()
        upstream = ChildUpstream(self.children, lease.url, lease.runtime.name)
        return await exchange(request, ask, plan, engine, upstream, sent, done)

    # -- the rest -----------------------------------------------------------------------

    async def _load_only(
        self, request: web.Request, ask: Ask, load: LoadOnly, target: Target, seconds: float | None
    ) -> web.StreamResponse:
        """Nothing to generate: load the model (ollama's way to warm one), or with
        keep_alive 0 unload it now, never loading a model just to unload it."""
        if seconds == 0:
            await self.scheduler.stop_model(ask.model)
        else:
            timed = await self.lease(request, target, keep_alive=seconds, started=ask.started)
            if isinstance(timed, Forward):
                return await self.forward(request, ask, timed)
            self.scheduler.release(timed.lease, keep_alive=seconds)
        body = ask.loaded(load, unloaded=seconds == 0)
        return web.Response(
            body=dumps(body),
            headers={"Content-Type": "application/json", **ask.envelope.headers(request)},
        )

    async def _shared(
        self, request: web.Request, ask: Ask, plan: Plan, target: Target, seconds: float | None
    ) -> web.StreamResponse:
        """Singleflight: one engine call for identical concurrent deterministic requests;
        each client's trace notes the answer, and each after the first gets its own id."""
        runtime = target.runtime

        async def call() -> tuple[int, bytes] | Forward:
            timed = await self.lease(request, target, keep_alive=seconds, started=ask.started)
            if isinstance(timed, Forward):
                return timed
            try:
                sent = await admitted(self.prompts, self.sessions, timed.lease, ask, plan.engine)
                upstream = ChildUpstream(self.children, timed.lease.url, runtime.name)
                return await fetch(upstream, plan.engine, sent)
            finally:
                self.scheduler.release(timed.lease, keep_alive=seconds)

        key = (runtime.name, steps.adapters_text(target), target.replica, ask.path, ask.raw)
        result, leader = await self.singleflight.share(key, call)
        if isinstance(result, Forward):
            return await self.forward(request, ask, result)
        status, payload = result
        if not leader and (trace := current()) is not None:
            trace.sending(plan.engine.path, ask.body)
            trace.answered(payload, status)
            gate(status)
        done = Done(ask.model, ask.started, shared=not leader)
        return await whole(plan.answer(done), status, payload, ask.envelope.headers(request))

    async def forward(
        self, request: web.Request, ask: Ask | None, wanted: Forward
    ) -> web.StreamResponse:
        """Carry the request out on a remote (`forward.carry`): `ask` None, as it came."""
        return await forward.carry(self.fleet, request, ask, wanted, self.serving.upstream_timeout)
