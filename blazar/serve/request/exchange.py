"""Steps 7 and 8 of the request path: an engine request sent, and its answer built.

`blazar.serve.request.pipeline` calls these once a request has its upstream (a leased
child, `child_calls.ChildUpstream`, or a remote, `forward.RemoteUpstream`) and its
bytes (`Sent`): `fetch` posts a whole request and notes it on the trace (gated by the
sentinels with serving.sentinel_enforce), `whole` turns a whole answer into the
client's through the plan's `Answer` (with the speculative mode's acceptance rate in
`x-blazar-spec`), and `stream` copies or translates a stream as it arrives. A client
that goes away ends a stream here; the caller's release closes the engine's connection,
which makes the child stop generating. An engine that breaks a stream off after its
headers gets the answer's error event (one per envelope).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from blazar.observe.speculation import HEADER, spec_header
from blazar.observe.trace import Trace, current
from blazar.protocols import EngineRequest
from blazar.protocols.sse import SSEDecoder
from blazar.serve.request.asks import Answer, Ask, Done, Plan
from blazar.serve.request.child_calls import Reply, Upstream, decode, gate, refused


@dataclass(frozen=True)
class Sent:
    """An engine request as it goes out: its bytes, the body they encode, added headers."""

    data: bytes
    body: dict[str, Any]
    headers: dict[str, str]


def dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer past 64 bits, say: json takes what orjson refuses
        return json.dumps(body).encode()


async def fetch(upstream: Upstream, engine: EngineRequest, sent: Sent) -> tuple[int, bytes]:
    """A whole exchange, noted on the trace (and gated by its sentinels)."""
    trace = current()
    if trace is not None:
        trace.sending(engine.path, sent.body)
    reply: Reply | None = None
    try:
        reply = await upstream.post(engine.path, sent.data)
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


async def exchange(
    request: web.Request,
    ask: Ask,
    plan: Plan,
    engine: EngineRequest,
    upstream: Upstream,
    sent: Sent,
    done: Done,
) -> web.StreamResponse:
    headers = {**ask.envelope.headers(request), **sent.headers}
    if not engine.stream:
        status, payload = await fetch(upstream, engine, sent)
        return await whole(plan.answer(done), status, payload, headers)
    trace = current()
    reply: Reply | None = None
    try:
        reply, body = await _opened(upstream, engine, sent, trace)
        answer = plan.answer(done)
        if body is not None:  # an error, or an engine that answered whole
            if trace is not None:
                trace.answered(body, reply.status)
                gate(reply.status)
            return await whole(answer, reply.status, body, headers)
        return await stream(request, reply, upstream, answer, headers)
    finally:
        if reply is not None:  # kept if finished; else closed, and the child stops
            upstream.release(reply)


async def _opened(
    upstream: Upstream, engine: EngineRequest, sent: Sent, trace: Trace | None
) -> tuple[Reply, bytes | None]:
    """A request sent (noted on `trace`): its reply and, unless the reply is a 200 event
    stream (None: the caller reads it), its whole body. The caller releases the reply;
    one whose body did not arrive is released here."""
    if trace is not None:
        trace.sending(engine.path, sent.body)
    try:
        reply = await upstream.post(engine.path, sent.data)
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
    if status != 200:
        data = decode(payload)
        raise answer.refusal(status, data) or refused(status, data)
    mode = headers.get(HEADER)
    if mode is not None and mode != "off":
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            headers[HEADER] = spec_header(mode, orjson.loads(payload).get("timings"))
    out = await answer.whole(payload)
    body = out if isinstance(out, bytes) else dumps(out)
    return web.Response(body=body, headers={"Content-Type": "application/json", **headers})


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
    trace = current()
    content_type = answer.content_type or reply.content_type
    response = web.StreamResponse(
        headers={"Content-Type": content_type, "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)
    decoder = None if answer.raw else SSEDecoder()
    rewrite = answer.rewrites
    try:
        if decoder is not None and (first := answer.start()):
            await response.write(first)
        while True:
            try:
                chunk = await reply.read()
            except upstream.errors as exc:
                failed = upstream.failed(exc)
                if trace is not None:
                    trace.failed(failed.status, failed.message, failed.code)
                await response.write(answer.error(failed))
                return response
            if not chunk:
                break
            if decoder is None:
                if trace is not None:
                    trace.chunk(chunk)
                out = answer.feed_bytes(chunk) if rewrite else chunk
            else:
                parts = []
                for event in decoder.feed(chunk):
                    if trace is not None:
                        trace.event(event.data)
                    parts.append(answer.feed(event.data))
                out = b"".join(parts)
            if out:
                await response.write(out)
        tail = b""
        if decoder is not None:
            for event in decoder.close():
                if trace is not None:
                    trace.event(event.data)
                tail += answer.feed(event.data)
        tail += await answer.end()
        if tail:
            await response.write(tail)
        await response.write_eof()
    except ConnectionError:  # the client went away
        pass
    return response


async def events(
    upstream: Upstream, engine: EngineRequest, sent: Sent, answer: Answer
) -> AsyncGenerator[Any, None]:
    """The engine's events decoded as they arrive (JSON objects, then the text `[DONE]`),
    each noted on the current trace; an engine that answers whole yields that one answer;
    an error is raised (in `answer`'s words where it has them)."""
    trace = current()
    reply: Reply | None = None
    try:
        reply, payload = await _opened(upstream, engine, sent, trace)
        if payload is not None:
            if trace is not None:
                trace.answered(payload, reply.status)
            if reply.status != 200:
                data = decode(payload)
                raise answer.refusal(reply.status, data) or refused(reply.status, data)
            yield decode(payload)
            return
        decoder = SSEDecoder()
        while True:
            try:
                chunk = await reply.read()
            except upstream.errors as exc:
                failed = upstream.failed(exc)
                if trace is not None:
                    trace.failed(failed.status, failed.message, failed.code)
                raise failed from None
            for event in decoder.feed(chunk) if chunk else decoder.close():
                if trace is not None:
                    trace.event(event.data)
                yield event.data
            if not chunk:
                return
    finally:
        if reply is not None:  # kept if finished; else closed, and the child stops
            upstream.release(reply)
