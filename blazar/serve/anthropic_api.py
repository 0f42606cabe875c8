"""Anthropic's Messages API on the gateway: `POST /v1/messages` and `/v1/messages/count_tokens`.

As decided in docs/compatibility.md, requests pass through to the instance's
native `/v1/messages` (llama-server speaks Anthropic's shapes there):
`blazar.protocols.anthropic` validates them as Anthropic's API does (refusing
what the engine would accept wrongly, such as a request without `max_tokens`)
and normalizes what comes back, whole or event by event. Each request takes a
lease from the scheduler like an OpenAI request (slots, queue,
`x-blazar-priority`); `count_tokens` too, since the model's own tokenizer and
chat template count. `anthropic-version` and `x-api-key` are accepted (API keys
are not checked yet). Errors are Anthropic's `{"type": "error", "error": {...}}`:
404 not_found_error, 400 invalid_request_error, 503 overloaded_error with
`Retry-After`, 502 api_error when a child fails.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from blazar.protocols import EngineRequest, ProtocolError, anthropic
from blazar.serve import upstream
from blazar.serve.upstream import TRACE, Timed, add_retry_after, trace_id

if TYPE_CHECKING:
    from blazar.serve.gateway import Gateway

SSE = "text/event-stream"


def register(app: web.Application, gateway: Gateway) -> None:
    """Add the Anthropic routes to the gateway's app."""
    api = AnthropicAPI(gateway)
    app.router.add_post("/v1/messages", api.messages)
    app.router.add_post("/v1/messages/count_tokens", api.count_tokens)


def _headers(request: web.Request) -> dict[str, str]:
    trace = trace_id(request)
    return {TRACE: trace, "request-id": trace}  # the SDK reads request-id


def error(
    request: web.Request,
    status: int,
    message: str,
    type_: str | None = None,
    retry_after: float | None = None,
) -> web.Response:
    """Anthropic's error response; a 503 says when to retry."""
    headers = _headers(request)
    add_retry_after(headers, retry_after)
    body = anthropic.error(status, type_, message)
    return web.json_response(body, status=status, headers=headers)


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


class AnthropicAPI:
    """The Messages handlers; one instance per gateway app."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self.gateway.session is not None
        return self.gateway.session

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, count=False)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, count=True)

    async def _handle(self, request: web.Request, *, count: bool) -> web.StreamResponse:
        started = time.perf_counter_ns()
        model = "?"
        scheduler = self.gateway.scheduler
        try:
            body = await upstream.read_json(request)
            translate = anthropic.count_tokens_request if count else anthropic.messages_request
            req = translate(body)
            model = str(body["model"])
            pool, _ = scheduler.lookup(model)
            if refusal := pool.runtime.chat_refusal():
                return error(request, 400, refusal)
            timed = await upstream.acquire(scheduler, request, model, started=started)
        except ProtocolError as exc:
            return error(request, exc.status, exc.message, exc.code)
        except Exception as exc:
            known = upstream.failure(exc, model)
            if known is None:
                raise
            status, message, retry_after = known
            return error(request, status, message, retry_after=retry_after)
        try:
            return await self._answer(request, timed, req, model, count)
        except (aiohttp.ClientError, ConnectionError) as exc:
            status, message, _ = upstream.failure(exc, model) or (502, str(exc), None)
            return error(request, status, message)
        finally:
            scheduler.release(timed.lease)

    async def _answer(
        self, request: web.Request, timed: Timed, req: EngineRequest, model: str, count: bool
    ) -> web.StreamResponse:
        if req.stream:
            return await self._stream(request, timed, req, model)
        status, payload = await upstream.call(self.session, timed.lease, req)
        if status != 200 or not isinstance(payload, dict):
            return self._engine_error(request, status, payload)
        out: dict[str, Any] = payload
        if not count:
            out = anthropic.message_response(payload, model=model, message_id=message_id())
        return web.json_response(out, headers=_headers(request))

    def _engine_error(self, request: web.Request, status: int, payload: Any) -> web.Response:
        status, body = anthropic.error_from_engine(status if status >= 400 else 502, payload)
        return web.json_response(body, status=status, headers=_headers(request))

    async def _stream(
        self, request: web.Request, timed: Timed, req: EngineRequest, model: str
    ) -> web.StreamResponse:
        state = anthropic.StreamState(model=model, message_id=message_id())
        async with upstream.stream(self.session, timed.lease, req) as engine:
            if not upstream.is_event_stream(engine):
                return self._engine_error(request, engine.status, await upstream.error_body(engine))
            response = web.StreamResponse(
                headers={"Content-Type": SSE, "Cache-Control": "no-cache", **_headers(request)}
            )
            await response.prepare(request)
            try:
                async for data in upstream.events(engine):
                    for event in anthropic.stream_events(data, state):
                        await response.write(anthropic.sse(event))
                for event in anthropic.finish_stream(state):
                    await response.write(anthropic.sse(event))
            except aiohttp.ClientError as exc:  # the engine failed mid-stream
                message = f"model '{model}' failed while answering: {exc or type(exc).__name__}"
                with contextlib.suppress(ConnectionError):
                    await response.write(anthropic.sse(anthropic.error(502, None, message)))
            except ConnectionError:  # the client went away; leaving closes the engine request
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
