"""Steps 7 and 8 of the request path: an engine call made, and its answer built.

`blazar.serve.request.pipeline` (and `forward`, for an OpenAI-only remote) hands these a
`Call`: the plan, the engine request and its bytes (`Sent`), where it goes (a leased
child, `child_calls.LeasedChild`, or a remote, `forward.RemoteUpstream`) and what its
answer is built with (`asks.Answering`). `exchange` answers a client, whole or streamed
as the engine request says; `fetch` posts a whole request and notes it on the trace
(gated by the sentinels with serving.sentinel_enforce), `whole` turns a whole answer
into the client's through the plan's `Answer` (with the speculative mode's acceptance
rate in `x-blazar-spec`), `stream` copies or translates a stream as it arrives, and
`events` hands a stream no client's HTTP request waits on (a realtime session's) to
its consumer, event by event. Both streams read the engine through the one loop,
`arrivals`, which notes what arrives on the trace. A client that goes away ends a
stream here; the caller's release closes the engine's connection, which makes the
child stop generating. An engine that breaks a stream off after its headers gets the
answer's error event (one per envelope).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from blazar.observe.speculation import HEADER, spec_header
from blazar.observe.trace import Trace, current, tail_object
from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.sse import SSEDecoder
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.request.child_calls import Reply, Upstream, decode, gate, refused


@dataclass(slots=True)  # not frozen, for its cost per request (`pipeline.Routed`)
class Sent:
    """An engine request as it goes out: its bytes, the body they encode, added headers."""

    data: bytes
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)  # not frozen, for its cost per request (`pipeline.Routed`)
class Call:
    """An engine call ready to go: the plan, the engine request and its bytes, the
    upstream it goes to, and what its answer is built with."""

    plan: Plan
    engine: EngineRequest
    sent: Sent
    upstream: Upstream
    answering: Answering

    def answer(self) -> Answer:
        return self.plan.answer(self.answering)


class Broken(Exception):
    """The engine's stream broke off (`arrivals`): `error` is what the client gets."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(error.message)
        self.error = error


def dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer past 64 bits, say: json takes what orjson refuses
        return json.dumps(body).encode()


async def fetch(call: Call) -> tuple[int, bytes]:
    """A whole exchange, noted on the trace (and gated by its sentinels)."""
    trace = current()
    engine, upstream = call.engine, call.upstream
    if trace is not None:
        trace.sending(engine.path, call.sent.body)
    reply: Reply | None = None
    try:
        reply = await upstream.post(engine.path, call.sent.data)
        payload = await reply.read_all()
    except upstream.errors as exc:
        raise upstream.failed(exc) from None
    finally:
        if reply is not None:
            upstream.release(reply)
    if trace is not None:  # read when the answer is gone, or now to enforce
        trace.answered(payload, reply.status)
        gate(reply.status)
    return reply.status, payload


async def exchange(request: web.Request, ask: Ask, call: Call) -> web.StreamResponse:
    """The call made for a client, and its answer: whole, or streamed as it arrives."""
    headers = ask.envelope.headers(request)  # a new dict: the answer's headers
    headers.update(call.sent.headers)
    if not call.engine.stream:
        status, payload = await fetch(call)
        return await whole(call.answer(), status, payload, headers)
    trace = current()
    upstream = call.upstream
    reply: Reply | None = None
    try:
        reply, body = await _opened(call, trace)
        answer = call.answer()
        if body is not None:  # an error, or an engine that answered whole
            if trace is not None:
                trace.answered(body, reply.status)
                gate(reply.status)
            return await whole(answer, reply.status, body, headers)
        return await stream(request, reply, upstream, answer, headers)
    finally:
        if reply is not None:  # kept if finished; else closed, and the child stops
            upstream.release(reply)


async def _opened(call: Call, trace: Trace | None) -> tuple[Reply, bytes | None]:
    """The call sent (noted on `trace`): its reply and, unless the reply is a 200 event
    stream (None: the caller reads it), its whole body. The caller releases the reply;
    one whose body did not arrive is released here."""
    engine, upstream = call.engine, call.upstream
    if trace is not None:
        trace.sending(engine.path, call.sent.body)
    try:
        reply = await upstream.post(engine.path, call.sent.data)
    except upstream.errors as exc:
        raise upstream.failed(exc) from None
    if reply.status == 200 and reply.content_type.startswith("text/event-stream"):
        return reply, None
    try:
        payload = await reply.read_all()
    except BaseException as exc:
        upstream.release(reply)
        if isinstance(exc, upstream.errors):
            raise upstream.failed(exc) from None
        raise
    return reply, payload


async def whole(
    answer: Answer, status: int, payload: bytes, headers: dict[str, str]
) -> web.Response:
    """A whole answer (`headers`: the caller's new dict, completed here), or the engine's
    refusal raised in the answer's words."""
    if status != 200:
        data = decode(payload)
        raise answer.refusal(status, data) or refused(status, data)
    mode = headers.get(HEADER)
    if mode is not None and mode != "off":  # the timings at the answer's end, not its text
        headers[HEADER] = spec_header(mode, tail_object(payload, "timings"))
    out = await answer.whole(payload)
    body = out if isinstance(out, bytes) else dumps(out)
    headers["Content-Type"] = "application/json"
    return web.Response(body=body, headers=headers)


async def arrivals(
    reply: Reply, upstream: Upstream, decoder: SSEDecoder | None, trace: Trace | None
) -> AsyncGenerator[Any, None]:
    """The one loop that reads an engine's stream: what arrives, noted on `trace` as it
    comes. With no `decoder` (a pass-through), each chunk as it came; with one, for each
    chunk the list of events it completes, decoded (JSON objects, or the text `[DONE]`),
    and the last ones when the stream ends. An engine that breaks the stream off is
    noted on the trace and raised as `Broken`, with the error the client gets."""
    while True:
        try:
            chunk = await reply.read()
        except upstream.errors as exc:
            failed = upstream.failed(exc)
            if trace is not None:
                trace.failed(failed.status, failed.message, failed.code)
            raise Broken(failed) from None
        if decoder is None:
            if not chunk:
                return
            if trace is not None:
                trace.chunk(chunk)
            yield chunk
            continue
        events = [event.data for event in (decoder.feed(chunk) if chunk else decoder.close())]
        if trace is not None:
            for data in events:
                trace.event(data)
        yield events
        if not chunk:
            return


async def stream(
    request: web.Request,
    reply: Reply,
    upstream: Upstream,
    answer: Answer,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Copy (or translate) the engine's stream as it arrives. A client that goes away
    ends it here (the caller closes the engine's connection: the child stops); an
    engine that breaks off gets the answer's error event."""
    content_type = answer.content_type or reply.content_type
    response = web.StreamResponse(
        headers={"Content-Type": content_type, "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)
    try:
        if answer.raw:
            rewrite = answer.rewrites
            async with aclosing(arrivals(reply, upstream, None, current())) as chunks:
                async for chunk in chunks:
                    out = answer.feed_bytes(chunk) if rewrite else chunk
                    if out:
                        await response.write(out)
        else:
            if first := answer.start():
                await response.write(first)
            decoder = SSEDecoder()
            async with aclosing(arrivals(reply, upstream, decoder, current())) as batches:
                async for batch in batches:
                    if out := b"".join([answer.feed(data) for data in batch]):
                        await response.write(out)
        if tail := await answer.end():
            await response.write(tail)
        await response.write_eof()
    except Broken as broken:
        with contextlib.suppress(ConnectionError):
            await response.write(answer.error(broken.error))
    except ConnectionError:  # the client went away
        pass
    return response


async def events(call: Call) -> AsyncGenerator[Any, None]:
    """The call's events decoded as they arrive (JSON objects, then the text `[DONE]`),
    each noted on the current trace; an engine that answers whole yields that one answer;
    an error is raised (in the answer's words where it has them). Use it under
    `contextlib.aclosing`: stopping early closes the engine's connection at once."""
    trace = current()
    upstream = call.upstream
    reply: Reply | None = None
    try:
        reply, payload = await _opened(call, trace)
        if payload is not None:
            if trace is not None:
                trace.answered(payload, reply.status)
            if reply.status != 200:
                data = decode(payload)
                raise call.answer().refusal(reply.status, data) or refused(reply.status, data)
            yield decode(payload)
            return
        try:
            async with aclosing(arrivals(reply, upstream, SSEDecoder(), trace)) as batches:
                async for batch in batches:
                    for data in batch:
                        yield data
        except Broken as broken:
            raise broken.error from None
    finally:
        if reply is not None:  # kept if finished; else closed, and the child stops
            upstream.release(reply)
