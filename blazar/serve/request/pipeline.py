"""The one request path: every model route hands its `Ask` to the `Pipeline`.

A route parses its protocol's body into an `Ask` (`blazar.serve.request.asks`); the
pipeline then takes the same steps for all of them, in this order (`serve` reads them
top-down):

1. resolve: the requested name -> this host's model (`Target`: pool, adapters,
   replica) or a remote's (`Forward`); a model the request's API key may not use is
   answered as an unknown one (404, naming only what the key sees, with the closest of
   them for a typo: `steps.closest`).
2. plan: the `Ask`'s plan for the engine that will answer (`native` for llama-server,
   `openai` for an engine that speaks only OpenAI's API).
3. require: the model can do what the plan needs (`steps.require`, once).
4. keep_alive and priority: a client's from its request (the body field or the header,
   `steps.keep_alive`; `x-blazar-priority`, `http.wants_priority`), else the `Way`'s.
5. lease: a slot from the scheduler, with the load time measured (`Leased`); with
   several replicas, on the one that served the prompt's prefix within the last minute
   when it has a free slot (its cache holds that prefix: `scheduler.affinity`), and
   with several slots on that prefix's slot (`id_slot`, sent in step 6); a start
   failure is a 502, and with a `failover` chain a full queue, a failed load or a child
   failing before any byte goes to the chain's next member.
6. admit: the model's default output limit for a request that sets none (a base
   model's), the prompt preflight (a prompt that cannot fit is a 400; an output that
   cannot is capped; either cap said in `x-blazar-max-tokens-capped`), the sessions' slot routing
   (`id_slot`), and the adapters and model defaults (`steps.engine_body`); a body
   nothing changed travels as the client's bytes. The result is a `Call`.
7. trace: what was sent and what came back, on the request's trace
   (`blazar.observe.trace`); helper calls (templates, tokens) never are.
8. call and answer: the engine's reply, whole or streamed, through the plan's
   `Answer` (`blazar.serve.request.exchange`); a stream the engine breaks off ends with
   the envelope's error event.
9. release: the slot goes back with the request's keep_alive when the `Leased`'s
   block ends: the one place a slot is given back.

Steps 1 to 4 are `route`, 5 `lease`, 6 `admit`. The entries take that one sequence
and differ in what they ask of it, said as data (`Way`), and in the form of the answer:
`serve` answers a client's HTTP request (here or on a remote, shared by singleflight,
or only loading the model); `complete` is the whole path for work no client waits on
(a batch, a tool loop's round), the answer decoded, and `events` the same streamed (a
realtime session's answer, event by event); `hold` is a route whose engine call is its
own (audio), the slot held around it; `servable` is steps 1 and 3 alone, for a request
checked now and run later (an async job). Failures are raised as `ProtocolError`/
`SchedulerError` and answered in the route's envelope by the gateway's middleware
(`steps.failure`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from blazar.observe.speculation import HEADER
from blazar.observe.trace import current, prompt_text
from blazar.protocols import LoadOnly, ProtocolError
from blazar.serve.http import wants_priority
from blazar.serve.request import cache, exchange, forward, steps
from blazar.serve.request.admission import admitted
from blazar.serve.request.asks import OPENAI_DIALECT, Answering, Ask, Plan
from blazar.serve.request.child_calls import LeasedChild, decode, gate, refused
from blazar.serve.request.exchange import Call, dumps, fetch, whole
from blazar.serve.request.grants import grant_of
from blazar.serve.request.prompts import Prompts
from blazar.serve.request.singleflight import SingleFlight, deterministic
from blazar.serve.state.remotes import Fleet, Forward
from blazar.serve.state.sessions import Sessions
from blazar.serve.supervisor.child_http import ChildConnections
from blazar.serve.supervisor.instance import InstanceFailed
from blazar.serve.supervisor.scheduler import (
    PREFIX_BLOCK,
    Lease,
    ModelNotFound,
    PrefixAffinity,
    Scheduler,
    SchedulerError,
    SlotBook,
    Target,
    prefix_keys,
)
from specs.serving import Serving


@dataclass(frozen=True, slots=True)
class Way:
    """What an ask needs of the path beyond the `Ask` itself. A client's request takes
    its keep_alive and priority from its headers; work no client waits on (no request)
    brings its own here."""

    own_call: bool = False  # the caller makes the engine call (audio): no plan, no admit
    priority: bool = False
    keep_alive: float | None = None


CLIENT = Way()


# Routed and the other values made once per request (`exchange.Call`, `Sent`) are slotted
# but not frozen: a frozen dataclass sets each field through object.__setattr__, which
# measured 580 ns against 160 ns for five fields, on every request. Nothing mutates them.
@dataclass(slots=True)
class Routed:
    """Steps 1 to 4 done: this host's model, the plan (`LoadOnly`: nothing to generate;
    None: the caller's own call), and the request's keep_alive and priority."""

    target: Target
    plan: Plan | LoadOnly | None
    keep_alive: float | None
    priority: bool
    prefix: tuple[bytes, ...] = ()  # the prompt's prefix keys, with replicas or slots


class Leased(LeasedChild):
    """A slot on an instance of the request's model (step 5): the child the request's
    call goes to and its answer's helper calls are made on (`LeasedChild`), with the
    request's clock and the instance's speculative decoding mode. It goes back to the
    scheduler, with the request's keep_alive, when its `with` block ends (step 9): the
    one place a slot is given back, however the block ends (`release(reply)` is the
    upstream's: a reply's connection kept or closed)."""

    __slots__ = (
        "_book",
        "_keep_alive",
        "_scheduler",
        "lease",
        "load_ns",
        "slot",
        "spec",
        "started",
    )

    def __init__(
        self,
        scheduler: Scheduler,
        children: ChildConnections,
        lease: Lease,
        started: int,
        load_ns: int,
        spec: str,
        keep_alive: float | None,
        slot: int | None = None,
        book: SlotBook | None = None,
    ) -> None:
        # LeasedChild's fields, set here: one object per request, not two (the hot path).
        self.children, self.url, self.model = children, lease.url, lease.runtime.name
        self._scheduler, self._keep_alive = scheduler, keep_alive
        self.slot, self._book = slot, book  # the child's slot the gateway chose (id_slot)
        self.lease = lease
        self.started = started  # time.perf_counter_ns() when the request arrived
        self.load_ns = load_ns  # spent in acquire while the model was not ready; 0 if it was
        self.spec = spec  # off, ngram, draft:NAME (docs/tune.md)

    def __enter__(self) -> Leased:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._book is not None and self.slot is not None:
            self._book.held.discard(self.slot)
        self._scheduler.release(self.lease, keep_alive=self._keep_alive)


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
        store: Path | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.children = children
        self.prompts = Prompts(children)
        self.sessions = sessions
        self.fleet = fleet if fleet is not None else Fleet()
        self.singleflight = SingleFlight()
        self.serving = serving if serving is not None else Serving()
        self.cache = cache.ResponseCache(store, self._embed)  # docs/cache.md
        self.affinity = PrefixAffinity()  # which replica saw a prompt's prefix last
        self.books: dict[str, SlotBook] = {}  # per child (url): the slots leases hold

    # -- the entries --------------------------------------------------------------------

    async def serve(self, request: web.Request, ask: Ask) -> web.StreamResponse:
        """Carry a client's request out, here or on a remote, and answer it."""
        routed = await self.route(request, ask)  # 1 to 4
        if isinstance(routed, Forward):
            return await self.forward(request, ask, routed)
        target, plan = routed.target, routed.plan
        if isinstance(plan, LoadOnly):
            return await self._load_only(request, ask, plan, routed)
        assert plan is not None  # a client's way has a plan
        looked: cache.Lookup | None = None
        settings = self.serving.cache
        if settings.enabled:  # 4b: the response cache (a hit needs no slot)
            looked = await self.cache.lookup(request, ask, target, plan, settings)
            if looked.hit:
                return await cache.replay(
                    request, ask, plan, looked, Answering(ask.model, ask.started)
                )
            if looked.stores:
                plan = cache.recording(plan, self.cache, looked, settings, request)
        if ask.shareable and target.runtime.singleflight and deterministic(ask.body):
            return await self._shared(request, ask, plan, routed, looked)
        leased = await self.lease(request, routed, ask.started)
        if isinstance(leased, Forward):
            return await self.forward(request, ask, leased)
        try:
            with leased:
                call = await self.admit(ask, plan, leased)
                if looked is not None:
                    call.sent.headers[cache.HEADER] = looked.header
                return await exchange.exchange(request, ask, call)  # 7 and 8
        except ProtocolError as exc:  # the slot is back; the chain's next member may answer
            if not forward.spills(exc):
                raise
            why = f"the local instance failed ({exc.message})"
            member = self._member(request, target.runtime.name, why)
            if member is None:
                raise
        return await self.forward(request, ask, member)

    async def complete(
        self, ask: Ask, *, priority: bool = False, keep_alive: float | None = None
    ) -> Any:
        """The whole path for work no client waits on (a batch, a tool loop): this host's
        model only, the answer as the plan's `Answer` builds it, decoded; `keep_alive` is
        the request's, for the tool loop of a client that asked for one."""
        async with self._unattended(ask, Way(priority=priority, keep_alive=keep_alive)) as call:
            status, payload = await fetch(call)
            answer = call.answer()
            if status != 200:
                data = decode(payload)
                raise answer.refusal(status, data) or refused(status, data)
            out = await answer.whole(payload)
            return decode(out) if isinstance(out, bytes) else out

    async def events(self, ask: Ask, *, priority: bool = False) -> AsyncGenerator[Any, None]:
        """The whole path for a stream no client's HTTP request waits on (a realtime
        session's answer): the engine's events decoded as they arrive (`exchange.events`).
        The slot goes back when the stream ends, fails, or its consumer stops: use it
        under `contextlib.aclosing`, so that stopping early closes the engine's
        connection (the child stops generating) and releases the slot at once."""
        way = Way(priority=priority)
        async with self._unattended(ask, way) as call, aclosing(exchange.events(call)) as stream:
            async for data in stream:
                yield data

    @asynccontextmanager
    async def hold(
        self, request: web.Request | None, ask: Ask, *, priority: bool = False
    ) -> AsyncIterator[Leased]:
        """Steps 1 to 5 and 9 for a route whose call is its own (audio): a slot on an
        instance of the model, given back when the block ends. `priority` is for work no
        client waits on (`request` None); a client's is its header's."""
        routed = await self.route(request, ask, Way(own_call=True, priority=priority))
        assert not isinstance(routed, Forward)  # servable() refuses a remote's model
        leased = await self.lease(request, routed, ask.started)
        if isinstance(leased, Forward):  # a kind no chain serves: say so as the lease did
            raise ProtocolError(503, f"model '{ask.model}' cannot be served here now")
        with leased:
            yield leased

    def servable(self, request: web.Request | None, ask: Ask) -> Target:
        """Steps 1 and 3 for a request served only here (audio, a realtime session): the
        model, able to serve the ask now, or the refusal (a remote's model is a 404 that
        says why)."""
        target = self.resolve_here(request, ask.model)
        steps.require(target.runtime, ask.need)
        if target.runtime.refusal is not None:
            raise ProtocolError(400, target.runtime.refusal, "invalid_request_error")
        return target

    async def _embed(self, model: str, text: str) -> list[float]:
        """The response cache's semantic tier: `text`'s embedding by `model`, through the
        one path (loaded and evicted like any model)."""
        return cache.embedding_of(await self.complete(cache.embed_ask(model, text)))

    # -- 1. resolve ---------------------------------------------------------------------

    def resolve(self, request: web.Request | None, requested: Any) -> Target | Forward:
        """The model a request names: this host's, or a remote's; a 400 when `model` is
        missing, a 404 when unknown or not one the request's API key may use."""
        if not isinstance(requested, str) or not requested:
            raise ProtocolError(
                400, "'model' is required: a string naming a model", "invalid_request_error"
            )
        trace = current()
        if trace is not None:  # observe: the name asked for, even if it is unknown
            trace.asking(requested)
        grant = grant_of(request) if request is not None else None
        visible = None
        if grant is not None and grant.models is not None:
            sees = grant.sees
            visible = lambda r: sees(r.name, r.aliases)  # noqa: E731
        try:
            target = self.scheduler.resolve(requested, visible)
        except ModelNotFound as exc:
            remote = self.fleet.remote_for(requested) if not forward.forwarded(request) else None
            if remote is None or (grant is not None and not grant.sees(requested, ())):
                names = (
                    name
                    for r in self.scheduler.runtimes.values()
                    if visible is None or visible(r)
                    for name in (r.name, *r.aliases)
                )
                raise steps.did_you_mean(exc, requested, names) from None
            if trace is not None:
                trace.resolved(requested)
            return Forward(remote, "a remote model: this host does not serve it", requested)
        if trace is not None:
            trace.resolved(target.runtime.name, steps.adapters_text(target))
        return target

    def resolve_here(self, request: web.Request | None, requested: Any) -> Target:
        """The model a route that acts on this host's models names (copy, stop, sessions,
        audio): a remote's model is a 404 that says so."""
        found = self.resolve(request, requested)
        if isinstance(found, Forward):
            assert request is not None  # resolve() forwards only for a client
            raise ProtocolError(
                404,
                f"model '{found.model}' is served by remote '{found.remote.name}': "
                f"{request.method} {request.path} acts on this host's models only",
                "model_not_found",
            )
        return found

    def _member(self, request: web.Request | None, model: str, why: str) -> Forward | None:
        """The next usable member of the model's failover chain, when this host cannot
        serve the request for `why`; never for work no client waits on, nor for a request
        another Blazar forwarded here."""
        if forward.forwarded(request) or not self.fleet.chains:
            return None
        member = self.fleet.member(model)
        return Forward(member, f"failover: {why}", model) if member is not None else None

    # -- 1 to 4 -------------------------------------------------------------------------

    def plan(self, ask: Ask, target: Target) -> Plan | LoadOnly:
        runtime = target.runtime
        if runtime.dialect == OPENAI_DIALECT:
            return ask.openai(runtime)
        return ask.native(runtime, target)

    async def route(
        self, request: web.Request | None, ask: Ask, way: Way = CLIENT
    ) -> Routed | Forward:
        """Steps 1 to 4: the model (a remote's: the `Forward` that carries the request
        there), the plan for its engine, what the plan needs of the model, and the
        request's keep_alive and priority."""
        plan: Plan | LoadOnly | None = None
        if way.own_call:
            target = self.servable(request, ask)
        else:
            found = self.resolve(request, ask.model)
            if isinstance(found, Forward):
                return found
            target, runtime = found, found.runtime
            if ask.images:
                await ask.resolved(runtime, self.serving)
            plan = self.plan(ask, target)
            if not isinstance(plan, LoadOnly):
                steps.require(
                    runtime,
                    plan.need or ask.need,
                    plan.needs,
                    alternative=ask.hint,
                    requested=ask.model,
                )
        prefix: tuple[bytes, ...] = ()
        pool = target.pool
        several = len(pool.members) > 1 or pool.runtime.slots > 1
        if several and isinstance(plan, Plan) and (ask.raw is None or ask.size >= PREFIX_BLOCK):
            prefix = prefix_keys(target.runtime.name, prompt_text(ask.body))  # affinity
        if request is None:
            return Routed(target, plan, way.keep_alive, way.priority, prefix)
        keep_alive = steps.keep_alive(request.headers, ask.body)
        return Routed(target, plan, keep_alive, wants_priority(request), prefix)

    @asynccontextmanager
    async def _unattended(self, ask: Ask, way: Way) -> AsyncIterator[Call]:
        """Steps 1 to 6 and 9 for work no client waits on: the call, its slot held for
        the block. This host's model only: without a request nothing goes to a remote."""
        routed = await self.route(None, ask, way)
        assert not isinstance(routed, Forward)  # resolve() forwards only for a client
        plan = routed.plan
        if not isinstance(plan, Plan):
            raise ProtocolError(400, "nothing to generate", "invalid_request_error")
        leased = await self.lease(None, routed, ask.started)
        assert not isinstance(leased, Forward)  # never, without a request
        with leased:
            yield await self.admit(ask, plan, leased)

    # -- 5. lease -----------------------------------------------------------------------

    async def lease(
        self, request: web.Request | None, routed: Routed, started: int | None = None
    ) -> Leased | Forward:
        """A slot on an instance of the routed model, loading it if needed, queued with the
        request's priority and given back with its keep_alive; or, with a failover chain
        and a client's `request`, the member to carry it out instead. Hold it with
        `with leased:`, which gives it back. `started`: when the request arrived.

        Raises SchedulerError (503 busy, ...) or a 502 when the model failed to start; a
        400 before any spawn when no installed engine supports the model's architecture
        (what to install is in the message)."""
        target, keep_alive = routed.target, routed.keep_alive
        runtime = target.runtime
        if runtime.refusal is not None:
            member = self._member(request, runtime.name, "no installed engine supports it here")
            if member is not None:
                return member
            raise ProtocolError(400, runtime.refusal, "invalid_request_error")
        ready = target.ready
        begin = time.perf_counter_ns()
        prefix = routed.prefix
        now = time.monotonic()
        try:
            lease = await self.scheduler.acquire(
                target,
                priority=routed.priority,
                keep_alive=keep_alive,
                prefer=self.affinity.choose(prefix, now) if prefix else None,
            )
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
        slot, book = None, None
        if prefix:  # the prefix is on this replica now (a cancelled prefill keeps it too)
            replica = lease.member.instance.spec.replica
            if lease.runtime.slots > 1 and lease.runtime.dialect != OPENAI_DIALECT:
                seen = self.affinity.seen(prefix, now)
                wanted = seen.slot if seen is not None and seen.replica == replica else None
                book = self._book(lease.url)
                slot = book.take(lease.runtime.slots, wanted, now)
            self.affinity.remember(prefix, replica, now, slot)
        leased_runtime = lease.runtime
        spec = leased_runtime.tuning.describe()
        if (trace := current()) is not None:  # observe: the instance and how it was chosen
            instance = lease.member.instance.spec
            trace.leased(
                instance.key,
                instance.replica,
                leased_runtime.engine_tag,
                spec,
                lease.decision,
                begin,
            )
        started = begin if started is None else started
        return Leased(
            self.scheduler, self.children, lease, started, load_ns, spec, keep_alive, slot, book
        )

    def _book(self, url: str) -> SlotBook:
        """The slot book of the child at `url` (a restarted child has another port: the
        books of gone children are dropped once they hold nothing and there are many)."""
        book = self.books.get(url)
        if book is None:
            if len(self.books) > 256:
                self.books = {u: b for u, b in self.books.items() if b.held}
            book = self.books[url] = SlotBook()
        return book

    # -- 6. admit -----------------------------------------------------------------------

    async def admit(self, ask: Ask, plan: Plan, leased: Leased) -> Call:
        """Step 6: the engine request made (with the leased child's helpers, when the plan
        prepares it) and admitted (`admission.admitted`), ready to call."""
        answering = Answering(ask.model, leased.started, leased.load_ns, leased)
        engine = plan.engine if plan.prepare is None else await plan.prepare(answering)
        sent = await admitted(
            self.prompts, self.sessions, leased.lease, ask, engine, slot=leased.slot
        )
        # Which speculative decoding mode answers (docs/tune.md); a whole answer adds its
        # acceptance rate from the engine's timings (`exchange.whole`).
        sent.headers[HEADER] = leased.spec
        return Call(plan, engine, sent, leased, answering)

    # -- the variations a client's request may take ---------------------------------------

    async def _load_only(
        self, request: web.Request, ask: Ask, load: LoadOnly, routed: Routed
    ) -> web.StreamResponse:
        """Nothing to generate: load the model (ollama's way to warm one), or with
        keep_alive 0 unload it now, never loading a model just to unload it."""
        if routed.keep_alive == 0:
            await self.scheduler.stop_model(ask.model)
        else:
            leased = await self.lease(request, routed, ask.started)
            if isinstance(leased, Forward):
                return await self.forward(request, ask, leased)
            with leased:
                pass  # loaded: the slot goes back at once
        body = ask.loaded(load, unloaded=routed.keep_alive == 0)
        return web.Response(
            body=dumps(body),
            headers={"Content-Type": "application/json", **ask.envelope.headers(request)},
        )

    async def _shared(
        self,
        request: web.Request,
        ask: Ask,
        plan: Plan,
        routed: Routed,
        looked: cache.Lookup | None = None,
    ) -> web.StreamResponse:
        """Singleflight: one engine call for identical concurrent deterministic requests;
        each client's trace notes the answer, and each after the first gets its own id."""
        target = routed.target

        async def call() -> tuple[int, bytes, dict[str, str]] | Forward:
            leased = await self.lease(request, routed, ask.started)
            if isinstance(leased, Forward):
                return leased
            with leased:
                admitted_call = await self.admit(ask, plan, leased)
                status, payload = await fetch(admitted_call)
                return status, payload, admitted_call.sent.headers

        runtime = target.runtime
        key = (runtime.name, steps.adapters_text(target), target.replica, ask.path, ask.raw)
        result, leader = await self.singleflight.share(key, call)
        if isinstance(result, Forward):
            return await self.forward(request, ask, result)
        status, payload, sent_headers = result
        if not leader and (trace := current()) is not None:
            trace.sending(plan.engine.path, ask.body)
            trace.answered(payload, status)
            gate(status)
        answering = Answering(ask.model, ask.started, shared=not leader)
        headers = {**ask.envelope.headers(request), **sent_headers}
        if looked is not None:
            headers[cache.HEADER] = looked.header
        return await whole(plan.answer(answering), status, payload, headers)

    async def forward(
        self, request: web.Request, ask: Ask | None, wanted: Forward
    ) -> web.StreamResponse:
        """Carry the request out on a remote (`forward.carry`): `ask` None, as it came."""
        return await forward.carry(self.fleet, request, ask, wanted, self.serving.upstream_timeout)
