"""Calls from the gateway to a leased child, on the one child client (`ChildConnections`).

The translating routes (ollama, Anthropic, OpenAI's Responses) post the
`EngineRequest` a translator built and read JSON (`call`) or server-sent events
(`stream`, `events`), and ask the child small native questions (`apply_template`,
`tokenize`); the OpenAI pass-through forwards bytes with `ChildConnections`
directly (`blazar.serve.routes.openai_api`). Either way a child that fails is a
`ProtocolError`: 502 when it refused, closed or garbled the connection, 504
when it stayed silent past `serving.upstream_timeout` (a limit between chunks).
A stream is closed however the caller leaves it, which makes llama-server stop
generating for a client that went away. What is sent and what comes back is noted
on the request's trace (`blazar.observe.trace`); `gate` applies
serving.sentinel_enforce to a whole answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from blazar.observe import sentinels
from blazar.observe.trace import current
from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.openai_requests import engine_refusal
from blazar.protocols.sse import SSEDecoder
from blazar.serve.request.pipeline import engine_body
from blazar.serve.supervisor.child_http import (
    ChildConnections,
    Exchange,
    UpstreamError,
    UpstreamTimeout,
)
from blazar.serve.supervisor.scheduler import Lease


def child_failed(model: str, exc: BaseException) -> ProtocolError:
    """The error a client gets when its model's child failed while answering."""
    if isinstance(exc, UpstreamTimeout):
        return ProtocolError(
            504,
            f"model '{model}' timed out: {exc} (serving.upstream_timeout); retry, or raise "
            "the timeout in the manifest",
            "upstream_timeout",
        )
    detail = str(exc) or type(exc).__name__
    return ProtocolError(502, f"model '{model}' failed while answering: {detail}", "upstream_error")


def refused(status: int, payload: Any) -> ProtocolError:
    """An engine's error answer (llama-server's OpenAI shape, or text) as a ProtocolError,
    which each route's envelope answers: the engine's status and message, or a 400 that
    says what the client can fix (`openai_requests.engine_refusal`)."""
    status = status if status >= 400 else 502
    explained = engine_refusal(status, payload)
    if explained is not None:
        return ProtocolError(400, explained)
    message = payload
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        message = inner.get("message", inner) if isinstance(inner, dict) else inner
    return ProtocolError(status, str(message))


def decode(payload: bytes) -> Any:
    """A child's body as JSON, or as text when it is not JSON."""
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")


def gate(status: int) -> None:
    """With serving.sentinel_enforce, a whole answer that fails the sentinels is a 422 that
    names what they found (in the route's protocol shape, by the errors middleware)."""
    trace = current()
    if status == 200 and trace is not None and trace.enforce and (found := trace.gate()):
        raise ProtocolError(422, sentinels.gate_message(found), "sentinel_failed")


async def call(children: ChildConnections, lease: Lease, req: EngineRequest) -> tuple[int, Any]:
    """Post a whole (non-streamed) request; return the engine's status and decoded body."""
    body = json.dumps(engine_body(lease, req.body, req.path)).encode()
    exchange: Exchange | None = None
    trace = current()
    if trace is not None:
        trace.sending(req.path, req.body)
    try:
        exchange = await children.post(lease.url, req.path, body)
        status, payload = exchange.status, decode(await exchange.read_all())
    except (UpstreamError, ConnectionError) as exc:
        raise child_failed(lease.runtime.name, exc) from None
    finally:
        if exchange is not None:
            children.release(lease.url, exchange)
    if trace is not None:
        trace.answered(payload, status)
        gate(status)
    return status, payload


async def _helper(children: ChildConnections, lease: Lease, path: str, body: Any) -> Any:
    """A small native call (template, tokens) on the leased child; its JSON answer."""
    status, payload = await call(children, lease, EngineRequest(path, body, False))
    if status != 200 or not isinstance(payload, dict):
        raise refused(status, payload)
    return payload


async def apply_template(children: ChildConnections, lease: Lease, messages: Any) -> str:
    """The prompt the model's chat template renders for `messages` (`/apply-template`)."""
    payload = await _helper(children, lease, "/apply-template", {"messages": messages})
    return str(payload.get("prompt", ""))


async def tokenize(children: ChildConnections, lease: Lease, text: str) -> list[int]:
    """The model's token ids for `text` as a prompt: special tokens parsed, and the
    beginning-of-sequence token first where the model adds one (`/tokenize`)."""
    body = {"content": text, "add_special": True}
    payload = await _helper(children, lease, "/tokenize", body)
    return [int(t) for t in payload.get("tokens", []) if isinstance(t, int)]


@asynccontextmanager
async def stream(
    children: ChildConnections, lease: Lease, req: EngineRequest
) -> AsyncIterator[Exchange]:
    """Post a streamed request; the exchange is given back (closed, unless finished)
    however the caller leaves, a client that went away included."""
    body = json.dumps(engine_body(lease, req.body, req.path)).encode()
    if (trace := current()) is not None:
        trace.sending(req.path, req.body)
    try:
        exchange = await children.post(lease.url, req.path, body)
    except (UpstreamError, ConnectionError) as exc:
        raise child_failed(lease.runtime.name, exc) from None
    try:
        yield exchange
    finally:
        children.release(lease.url, exchange)


def is_event_stream(exchange: Exchange) -> bool:
    return exchange.status == 200 and exchange.content_type.startswith("text/event-stream")


async def error_body(exchange: Exchange) -> Any:
    """The decoded body of an engine response that is not a stream (an error, usually)."""
    payload = decode(await exchange.read_all())
    if (trace := current()) is not None:
        trace.answered(payload, exchange.status)
    return payload


async def events(exchange: Exchange) -> AsyncIterator[Any]:
    """The data of each server-sent event as it arrives (parsed JSON, or `DONE`).

    Raises UpstreamError when the child fails mid-stream; the caller, whose headers
    are gone by then, ends its own stream with an error event."""
    decoder = SSEDecoder()
    trace = current()
    while chunk := await exchange.read():
        for event in decoder.feed(chunk):
            if trace is not None:
                trace.event(event.data)
            yield event.data
    for event in decoder.close():
        if trace is not None:
            trace.event(event.data)
        yield event.data
