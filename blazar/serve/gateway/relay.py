"""Carrying a request out on a remote: the `Forward` the request path raised, done.

`middleware` (installed by `blazar.serve.gateway.app`, inside the access layer) catches
`blazar.serve.state.remotes.Forward`, raised by `pipeline.resolve` for a model only a
remote serves and by `pipeline.lease` when this host cannot serve a model with a
`failover` chain, and a child's failure (502 `upstream_error`) raised before any
byte went out for such a model. Then:

- to another Blazar, and to any server for OpenAI's own paths, the client's
  request goes as it came (`_raw`): its path, body and protocol headers, the
  remote's key (`key_env`) instead of the client's, `x-request-id` passed on (so
  `blazar why` on both hosts shows the request) and `x-blazar-forwarded`; the
  answer comes back as it arrives, chunk by chunk;
- to an OpenAI-only server, ollama, Anthropic and Responses requests go through
  Blazar's translators (`_bridged`): the same ones the routes use, onto the
  remote's `/v1/chat/completions` or `/v1/embeddings`, the answer translated
  back whole or event by event.

A remote that is down or drained is never waited on: a 503 with Retry-After at
once; one that does not connect within its `timeout` is a 502 (and counts
against its health), one silent past `serving.upstream_timeout` a 504, each in
the route's envelope (the errors middleware); with a chain, the next usable
member is tried instead. The trace notes which remote and why.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientTimeout, ConnectionTimeoutError, web

from blazar.observe.trace import current
from blazar.protocols import (
    EngineRequest,
    LoadOnly,
    ProtocolError,
    anthropic,
    anthropic_chat,
    ollama,
)
from blazar.protocols.openai_responses import responses_request
from blazar.protocols.openai_responses_stream import ResponseStream, response_object
from blazar.protocols.sse import SSEDecoder, encode
from blazar.serve.http import TRACE, now_rfc3339, parse_json_object, trace_id
from blazar.serve.request import pipeline
from blazar.serve.request.envelopes import for_path
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import FAILOVER, FORWARDED, Forward, Remote
from blazar.serve.supervisor.scheduler import SchedulerError

# Paths any OpenAI-compatible server speaks: forwarded as they came, to any remote.
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
PASSED_IN = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta",
             "x-blazar-priority", "x-blazar-keep-alive", "user-agent")  # fmt: skip
NOT_PASSED_OUT = frozenset({"transfer-encoding", "connection", "keep-alive", "content-length",
                            "server", "date", "x-request-id"})  # fmt: skip
BIG_CTX = 1 << 30  # the remote checks context sizes; nothing is refused here for them
# The routes whose requests may go to a remote: inference, and ollama's /api/show. The
# others (copy, stop, sessions) act on this host's models only.
FORWARDABLE = frozenset({*OPENAI_PATHS, "/v1/responses", "/v1/messages",
                         "/v1/messages/count_tokens", "/api/chat", "/api/generate",
                         "/api/embed", "/api/embeddings", "/api/show"})  # fmt: skip


class RemoteDown(SchedulerError):
    """A request for a remote that is down or drained: 503 at once, never a wait."""

    code = "remote_down"


def middleware(services: Services) -> Any:
    """The middleware that carries out `Forward`s (see the module docstring)."""

    @web.middleware
    async def forward(request: web.Request, handler: pipeline.Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except Forward as wanted:
            if request.path not in FORWARDABLE:
                raise ProtocolError(
                    404,
                    f"model '{wanted.model}' is served by remote '{wanted.remote.name}': "
                    f"{request.method} {request.path} acts on this host's models only",
                    "model_not_found",
                ) from None
            return await _carry(services, request, wanted)
        except ProtocolError as exc:
            model = request.get(FAILOVER)
            if model is None or not _spills(exc) or request.path not in FORWARDABLE:
                raise
            member = services.fleet.member(model)
            if member is None:
                raise
            why = f"failover: the local instance failed ({exc.message})"
            return await _carry(services, request, Forward(member, why, model))

    return forward


def _spills(exc: ProtocolError) -> bool:
    """A child that failed before answering: the chain's next member may take it."""
    return exc.status == 502 and exc.code == "upstream_error"


async def _carry(services: Services, request: web.Request, wanted: Forward) -> web.StreamResponse:
    """Relay to `wanted.remote`; on a remote that does not answer, the model's chain's next
    usable member, until none is left."""
    fleet, tried = services.fleet, []
    while True:
        try:
            return await relay(services, request, wanted)
        except ProtocolError as exc:
            tried.append(wanted.remote.name)
            nxt = fleet.member(wanted.model, tried) if _spills(exc) else None
            if nxt is None:
                raise
            why = f"failover: remote {wanted.remote.name}: {exc.message}"
            wanted = Forward(nxt, why, wanted.model)


async def relay(services: Services, request: web.Request, wanted: Forward) -> web.StreamResponse:
    """One attempt on one remote."""
    remote = wanted.remote
    if (trace := current()) is not None:
        trace.forwarded(remote.name, remote.url, wanted.reason)
    if not remote.usable:
        state = "drained" if remote.drained else f"down ({remote.last_error or 'no answer'})"
        raise RemoteDown(
            f"model '{wanted.model}' is served by remote '{remote.name}', which is {state}; "
            f"retry later, or see `blazar remotes`",
            retry_after=remote.health_interval,
        )
    if remote.kind == "blazar" or request.path in OPENAI_PATHS:
        return await _raw(services, request, remote)
    return await _bridged(services, request, remote, wanted.model)


def _timeout(services: Services, remote: Remote) -> ClientTimeout:
    seconds = services.serving.upstream_timeout
    return ClientTimeout(sock_connect=remote.timeout, sock_read=seconds if seconds > 0 else None)


def _failed(remote: Remote, exc: BaseException) -> ProtocolError:
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


def _headers(request: web.Request, remote: Remote, *, raw: bool = True) -> dict[str, str]:
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


async def _raw(services: Services, request: web.Request, remote: Remote) -> web.StreamResponse:
    """The client's request as it came; the answer back as it arrives."""
    body = await request.read()
    session = services.fleet.client()
    url = remote.url + request.path_qs
    response: web.StreamResponse | None = None
    try:
        async with session.request(
            request.method,
            url,
            data=body,
            headers=_headers(request, remote),
            timeout=_timeout(services, remote),
        ) as resp:
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
                if not await _write(response, chunk):
                    return response  # the client went away: leaving closes the remote's
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
    except (ClientError, TimeoutError, OSError) as exc:
        failed = _failed(remote, exc)
        if response is None or not response.prepared:
            raise failed from None
        await _stream_error(response, request.path, failed)
        return response


async def _write(response: web.StreamResponse, data: bytes) -> bool:
    """Write to the client; False when it has gone (not the remote's failure)."""
    try:
        await response.write(data)
    except ConnectionError:
        return False
    return True


async def _stream_error(response: web.StreamResponse, path: str, failed: ProtocolError) -> None:
    """A stream cut short: one error event in the protocol's shape (the headers are gone)."""
    body = for_path(path).body(failed.status, failed.message, failed.code)
    if path.startswith("/api/"):
        data = ollama.ndjson(body)
    elif path.startswith("/v1/messages"):
        data = anthropic.sse(body)
    else:
        data = f"data: {json.dumps(body)}\n\n".encode()
    with contextlib.suppress(ConnectionError):
        await response.write(data)
        await response.write_eof()


# -- through the translators, for an OpenAI-only remote ------------------------------------


@dataclass
class Bridge:
    """A request translated for an OpenAI-compatible server, and how its answer is
    translated back: `whole` for a whole answer, `start`/`feed`/`end` for a stream's
    chunks (each returns the bytes to write), in `content_type`."""

    engine: EngineRequest
    whole: Callable[[dict[str, Any]], dict[str, Any]]
    feed: Callable[[Any], list[bytes]]
    content_type: str
    start: Callable[[], list[bytes]] = field(default=lambda: [])
    end: Callable[[], list[bytes]] = field(default=lambda: [])


def _ollama_bridge(path: str, body: dict[str, Any], model: str) -> Bridge | LoadOnly:
    if path not in ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings"):
        raise ProtocolError(
            404,
            f"{path}: model '{model}' is on an OpenAI-compatible remote, which has no such details",
        )
    chat = path == "/api/chat"
    if path in ("/api/embed", "/api/embeddings"):
        legacy = path == "/api/embeddings"
        asked = (ollama.embeddings_request if legacy else ollama.embed_request)(
            body, model_ctx=BIG_CTX
        )
        if isinstance(asked, LoadOnly):
            return asked
        dims = asked.hints.get("dimensions")

        def embedded(payload: dict[str, Any]) -> dict[str, Any]:
            if legacy:
                return ollama.embeddings_response(payload)
            return ollama.embed_response(payload, model=model, dimensions=dims)

        return Bridge(asked, embedded, lambda _: [], "application/json")
    made = (ollama.chat_request if chat else ollama.generate_request)(
        body, model_ctx=BIG_CTX, has_vision=True
    )
    if isinstance(made, LoadOnly):
        return made
    if made.path != "/v1/chat/completions":
        raise ProtocolError(
            400,
            "raw, suffix and context need llama-server's own endpoints, which a remote that "
            "is an OpenAI-compatible server does not offer through Blazar; send messages to "
            "/api/chat instead",
        )
    started = time.perf_counter_ns()
    state = ollama.StreamState(model, now_rfc3339(), "chat" if chat else "generate")
    translate = ollama.chat_response if chat else ollama.generate_response
    chunks = ollama.chat_chunks if chat else ollama.generate_chunks

    def whole(payload: dict[str, Any]) -> dict[str, Any]:
        return translate(
            payload,
            model=model,
            created_at=now_rfc3339(),
            total_duration=time.perf_counter_ns() - started,
        )

    def feed(data: Any) -> list[bytes]:
        state.created_at = now_rfc3339()
        state.total_duration = time.perf_counter_ns() - started
        return [ollama.ndjson(obj) for obj in chunks(data, state)]

    def end() -> list[bytes]:
        state.total_duration = time.perf_counter_ns() - started
        return [ollama.ndjson(obj) for obj in ollama.finish_stream(state)]

    return Bridge(made, whole, feed, "application/x-ndjson", end=end)


def _anthropic_bridge(path: str, body: dict[str, Any], model: str) -> Bridge:
    if path != "/v1/messages":
        raise ProtocolError(
            400,
            f"{path} is not offered through a remote that is an OpenAI-compatible server: "
            "count tokens on a Blazar or llama-server remote",
        )
    made = anthropic_chat.chat_request(anthropic.messages_request(body, has_vision=True))
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    state = anthropic.StreamState(model=model, message_id=message_id)
    events = anthropic_chat.ChatEvents()

    def whole(payload: dict[str, Any]) -> dict[str, Any]:
        message = anthropic_chat.message_from_chat(payload)
        return anthropic.message_response(message, model=model, message_id=message_id)

    def feed(data: Any) -> list[bytes]:
        return [
            anthropic.sse(event)
            for item in events.feed(data)
            for event in anthropic.stream_events(item, state)
        ]

    def end() -> list[bytes]:
        return [anthropic.sse(e) for e in anthropic.finish_stream(state)]

    return Bridge(made, whole, feed, "text/event-stream", end=end)


def _responses_bridge(body: dict[str, Any], model: str) -> Bridge:
    made = responses_request(body)
    rid, created = f"resp_{uuid.uuid4().hex}", int(time.time())
    stream = ResponseStream(rid, created, model, made.echo)

    def event(e: dict[str, Any]) -> bytes:
        return encode(e, str(e["type"]))

    return Bridge(
        made.engine,
        lambda p: response_object(
            p, response_id=rid, created_at=created, model=model, echo=made.echo
        ),
        lambda data: [event(e) for e in stream.feed(data)],
        "text/event-stream",
        start=lambda: [event(e) for e in stream.start()],
        end=lambda: [event(e) for e in stream.finish()],
    )


def bridge_for(path: str, body: dict[str, Any], model: str) -> Bridge | LoadOnly:
    """The translation of a request on `path` for an OpenAI-compatible server."""
    if path.startswith("/api/"):
        return _ollama_bridge(path, body, model)
    if path.startswith("/v1/messages"):
        return _anthropic_bridge(path, body, model)
    if path == "/v1/responses":
        return _responses_bridge(body, model)
    raise ProtocolError(404, f"{path} cannot be forwarded to remote models", "unknown_endpoint")


async def _bridged(
    services: Services, request: web.Request, remote: Remote, model: str
) -> web.StreamResponse:
    body = parse_json_object(await request.read())
    made = bridge_for(request.path, body, model)
    envelope = for_path(request.path)
    if isinstance(made, LoadOnly):  # nothing to generate: nothing to load here either
        answer = ollama.load_response(made, model=model, created_at=now_rfc3339())
        return web.json_response(answer, headers={TRACE: trace_id(request)})
    sent = {**made.engine.body, "model": str(body.get("model") or model)}
    session = services.fleet.client()
    response: web.StreamResponse | None = None
    try:
        async with session.post(
            remote.url + made.engine.path,
            data=json.dumps(sent).encode(),
            headers={**_headers(request, remote, raw=False), "Content-Type": "application/json"},
            timeout=_timeout(services, remote),
        ) as resp:
            remote.forwarded += 1
            remote.note(True)
            streamed = resp.content_type == "text/event-stream"
            if resp.status != 200 or not streamed:
                payload = await resp.read()
                data = _decoded(payload)
                if resp.status != 200 or not isinstance(data, dict):
                    raise _refused(resp.status, data)
                return web.json_response(made.whole(data), headers=envelope.headers(request))
            headers = {"Content-Type": made.content_type, "Cache-Control": "no-cache"}
            response = web.StreamResponse(headers={**headers, **envelope.headers(request)})
            await response.prepare(request)
            decoder = SSEDecoder()
            pieces: list[bytes] = made.start()
            async for chunk in resp.content.iter_any():
                pieces += [p for sse in decoder.feed(chunk) for p in made.feed(sse.data)]
                if pieces and not await _write(response, b"".join(pieces)):
                    return response  # the client went away: leaving closes the remote's
                pieces = []
            pieces += [p for sse in decoder.close() for p in made.feed(sse.data)]
            if await _write(response, b"".join([*pieces, *made.end()])):
                with contextlib.suppress(ConnectionError):
                    await response.write_eof()
            return response
    except (ClientError, TimeoutError, OSError) as exc:
        failed = _failed(remote, exc)
        if response is None or not response.prepared:
            raise failed from None
        await _stream_error(response, request.path, failed)
        return response


def _decoded(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")


def _refused(status: int, payload: Any) -> ProtocolError:
    """The remote's error answer, in the client's protocol (by the errors middleware)."""
    message = payload
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        message = inner.get("message", inner) if isinstance(inner, dict) else inner
    return ProtocolError(status if status >= 400 else 502, f"the remote answered: {message}")
