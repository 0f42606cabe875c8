"""Requests carried out on a remote: the pipeline's other upstream.

`Pipeline.resolve` answers a `Forward` for a model only a remote serves, and
`Pipeline.serve` when this host cannot serve a model that has a `failover` chain
(busy with the queue full, a failed load, a child that failed before any byte went
out). Then, for each usable member of the chain in turn:

- to another Blazar, and to any server for OpenAI's own paths, the client's request
  goes as it came (`relay`): its path, body and protocol headers, the remote's key
  (`key_env`) instead of the client's, `x-request-id` passed on (so `blazar why` on
  both hosts shows the request) and `x-blazar-forwarded` (a request forwarded here is
  never forwarded again: no loops); the answer comes back as it arrives;
- to an OpenAI-only server, the route's `Ask.openai` plan is carried out on
  `RemoteUpstream` by the same code that calls a local child: the request is
  translated onto `/v1/chat/completions` or `/v1/embeddings`, the answer back.

A remote that is down or drained is never waited on: a 503 with Retry-After at once;
one that does not connect within its `timeout` is a 502 (and counts against its
health), one silent past `serving.upstream_timeout` a 504, each in the route's
envelope. The trace notes which remote and why.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import (
    ClientError,
    ClientResponse,
    ClientTimeout,
    ConnectionTimeoutError,
    web,
)

from blazar.observe.trace import current
from blazar.protocols import LoadOnly, ProtocolError
from blazar.serve.http import PRIORITY, TRACE, trace_id
from blazar.serve.request.asks import Answering, Ask
from blazar.serve.request.envelopes import for_path
from blazar.serve.request.exchange import Call, Sent, dumps, exchange
from blazar.serve.request.steps import KEEP_ALIVE
from blazar.serve.state.remotes import FORWARDED, Fleet, Forward, Remote
from blazar.serve.supervisor.scheduler import SchedulerError

# Paths any OpenAI-compatible server speaks: forwarded as they came, to any remote.
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
PASSED_IN = (
    "content-type",
    "accept",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    PRIORITY,
    KEEP_ALIVE,
    "user-agent",
)
NOT_PASSED_OUT = frozenset(
    {
        "transfer-encoding",
        "connection",
        "keep-alive",
        "content-length",
        "server",
        "date",
        "x-request-id",
    }
)
# The routes whose requests may go to a remote: inference, and ollama's /api/show. The
# others (copy, stop, sessions) act on this host's models only.
FORWARDABLE = frozenset(
    {
        *OPENAI_PATHS,
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/api/show",
        "/v1/rerank",
        "/rerank",
    }
)


class RemoteDown(SchedulerError):
    """A request for a remote that is down or drained: 503 at once, never a wait."""

    code = "remote_down"


def forwarded(request: web.Request | None) -> bool:
    """A request another Blazar forwarded here (or work no client waits on): it is never
    forwarded again."""
    return request is None or FORWARDED in request.headers


def spills(exc: ProtocolError) -> bool:
    """A child or remote that failed before answering: the chain's next member may take it."""
    return exc.status == 502 and exc.code == "upstream_error"


def check(request: web.Request, wanted: Forward) -> None:
    """Note the attempt on the trace; refuse a route that acts on this host's models only,
    and a remote that is down or drained (503 at once)."""
    remote = wanted.remote
    if request.path not in FORWARDABLE:
        raise ProtocolError(
            404,
            f"model '{wanted.model}' is served by remote '{remote.name}': "
            f"{request.method} {request.path} acts on this host's models only",
            "model_not_found",
        )
    if (trace := current()) is not None:
        trace.forwarded(remote.name, remote.url, wanted.reason)
    if not remote.usable:
        state = "drained" if remote.drained else f"down ({remote.last_error or 'no answer'})"
        raise RemoteDown(
            f"model '{wanted.model}' is served by remote '{remote.name}', which is {state}; "
            f"retry later, or see `blazar remotes`",
            retry_after=remote.health_interval,
        )


def raw_path(request: web.Request, remote: Remote) -> bool:
    """Whether the client's request goes to `remote` as it came (else translated)."""
    return remote.kind == "blazar" or request.path in OPENAI_PATHS


def timeout_for(remote: Remote, read_timeout: float) -> ClientTimeout:
    return ClientTimeout(
        sock_connect=remote.timeout, sock_read=read_timeout if read_timeout > 0 else None
    )


def remote_failed(remote: Remote, exc: BaseException) -> ProtocolError:
    """A remote that did not answer: counted against its health; 504 when it went silent."""
    remote.failed += 1
    if isinstance(exc, TimeoutError) and not isinstance(exc, ConnectionTimeoutError):
        return ProtocolError(
            504,
            f"remote '{remote.name}' ({remote.url}) sent nothing for serving.upstream_timeout",
            "upstream_timeout",
        )
    if isinstance(exc, ConnectionTimeoutError):
        reason = f"no connection within {remote.timeout:g} s (its timeout)"
    else:
        reason = str(exc) or type(exc).__name__
    remote.note(False, reason)
    return ProtocolError(
        502, f"remote '{remote.name}' ({remote.url}) did not answer: {reason}", "upstream_error"
    )


def headers_for(request: web.Request, remote: Remote, *, raw: bool = True) -> dict[str, str]:
    out = {k: v for k in PASSED_IN if (v := request.headers.get(k)) is not None}
    out.update(remote.headers())
    # The bytes go back as they come (raw): in an encoding the client asked for, else
    # none; what is translated here must arrive plain.
    out["Accept-Encoding"] = (
        request.headers.get("Accept-Encoding", "identity") if raw else "identity"
    )
    out[TRACE] = trace_id(request)
    out[FORWARDED] = "1"
    return out


async def relay(
    fleet: Fleet, request: web.Request, remote: Remote, read_timeout: float
) -> web.StreamResponse:
    """The client's request as it came; the answer back as it arrives (its status and
    headers too: another Blazar already answered in the client's protocol)."""
    body = await request.read()
    response: web.StreamResponse | None = None
    try:
        resp = await fleet.send(
            request.method,
            remote.url + request.path_qs,
            data=body,
            headers=headers_for(request, remote),
            timeout=timeout_for(remote, read_timeout),
        )
        async with resp:
            remote.forwarded += 1
            remote.note(True)
            headers = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in NOT_PASSED_OUT and not k.lower().startswith("access-control-")
            }
            headers[TRACE] = trace_id(request)
            if resp.content_length is not None:
                return web.Response(body=await resp.read(), status=resp.status, headers=headers)
            response = web.StreamResponse(status=resp.status, headers=headers)
            await response.prepare(request)
            async for chunk in resp.content.iter_any():
                try:
                    await response.write(chunk)
                except ConnectionError:
                    return response  # the client went away: leaving closes the remote's
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
    except (ClientError, TimeoutError, OSError) as exc:
        failed = remote_failed(remote, exc)
        if response is None or not response.prepared:
            raise failed from None
        envelope = for_path(request.path)
        with contextlib.suppress(ConnectionError):
            await response.write(envelope.stream_error(failed.status, failed.message, failed.code))
            await response.write_eof()
        return response


class RemoteReply:
    """An aiohttp response as the pipeline reads a reply (`child_calls.Reply`)."""

    def __init__(self, resp: ClientResponse) -> None:
        self.resp = resp
        self.status = resp.status

    @property
    def content_type(self) -> str:
        return self.resp.content_type

    async def read(self) -> bytes:
        return await self.resp.content.readany()

    async def read_all(self) -> bytes:
        return await self.resp.read()


class RemoteUpstream:
    """An OpenAI-compatible remote as the upstream of a translated request."""

    errors: tuple[type[BaseException], ...] = (ClientError, TimeoutError, OSError)

    def __init__(
        self,
        fleet: Fleet,
        request: web.Request,
        remote: Remote,
        read_timeout: float,
        model: str,
    ) -> None:
        self.fleet, self.request, self.remote = fleet, request, remote
        self.read_timeout, self.model = read_timeout, model

    async def post(self, path: str, body: bytes) -> RemoteReply:
        headers = {
            **headers_for(self.request, self.remote, raw=False),
            "Content-Type": "application/json",
        }
        resp = await self.fleet.send(
            "POST",
            self.remote.url + path,
            data=body,
            headers=headers,
            timeout=timeout_for(self.remote, self.read_timeout),
        )
        self.remote.forwarded += 1
        self.remote.note(True)
        return RemoteReply(resp)

    def release(self, reply: Any) -> None:
        reply.resp.close()

    def failed(self, exc: BaseException) -> ProtocolError:
        return remote_failed(self.remote, exc)


async def carry(
    fleet: Fleet,
    request: web.Request,
    ask: Ask | None,
    wanted: Forward,
    read_timeout: float,
) -> web.StreamResponse:
    """Carry the request out on `wanted.remote`; on a remote that does not answer, the
    model's chain's next usable member, until none is left. `ask` None: as it came."""
    tried: list[str] = []
    while True:
        check(request, wanted)
        remote = wanted.remote
        try:
            if ask is None or raw_path(request, remote):
                return await relay(fleet, request, remote, read_timeout)
            return await bridged(fleet, request, ask, wanted, read_timeout)
        except ProtocolError as exc:
            tried.append(remote.name)
            nxt = fleet.member(wanted.model, tried) if spills(exc) else None
            if nxt is None:
                raise
            wanted = Forward(nxt, f"failover: remote {remote.name}: {exc.message}", wanted.model)


async def bridged(
    fleet: Fleet, request: web.Request, ask: Ask, wanted: Forward, read_timeout: float
) -> web.StreamResponse:
    """The request translated for an OpenAI-only remote (the route's `Ask.openai` plan,
    on the same call path as a local child), and its answer back."""
    plan = ask.openai(None)
    if isinstance(plan, LoadOnly):  # nothing to generate: nothing to load there either
        body = ask.loaded(plan, unloaded=False)
        return web.Response(
            body=dumps(body),
            headers={"Content-Type": "application/json", **ask.envelope.headers(request)},
        )
    body = {**plan.engine.body, "model": str(ask.body.get("model") or wanted.model)}
    sent = Sent(dumps(body), body, {})
    upstream = RemoteUpstream(fleet, request, wanted.remote, read_timeout, wanted.model)
    call = Call(plan, plan.engine, sent, upstream, Answering(ask.model, ask.started))
    return await exchange(request, ask, call)
