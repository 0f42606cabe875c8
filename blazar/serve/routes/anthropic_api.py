"""Anthropic's Messages API on the gateway: `POST /v1/messages` and `/v1/messages/count_tokens`.

As decided in docs/compatibility.md, requests pass through to the instance's
native `/v1/messages` (llama-server speaks Anthropic's shapes there), except
those with LoRA adapters on, which that endpoint would ignore: they go to its
chat endpoint through `blazar.protocols.anthropic_chat`.
`blazar.protocols.anthropic` validates them as Anthropic's API does (refusing
what the engine would accept wrongly, such as a request without `max_tokens`)
and normalizes what comes back, whole or event by event. Each request takes the
gateway's one request path (`blazar.serve.request.pipeline`: slots, queue,
`x-blazar-priority`; tools need a template that renders them); `count_tokens`
too, since the model's own tokenizer and chat template count. `anthropic-version`
is accepted; `x-api-key` is checked by the access middleware
(`blazar.serve.gateway.access`) when keys are declared. `keep_alive` (a body field or the
`x-blazar-keep-alive` header) is honoured as on ollama's routes, and
`pipeline.admit` runs the prompt preflight and the sessions' slot routing.
Failures are raised and answered as Anthropic's `{"type": "error", "error":
{...}}` by the gateway's error middleware:
404 not_found_error, 400 invalid_request_error, 503 overloaded_error with
`Retry-After`, 502 api_error when a child fails.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from aiohttp import web

from blazar.observe.trace import current
from blazar.protocols import EngineRequest, anthropic, anthropic_chat
from blazar.serve.http import read_json
from blazar.serve.request import child_calls, images, pipeline
from blazar.serve.request.envelopes import ANTHROPIC
from blazar.serve.request.pipeline import Timed
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.child_http import UpstreamError

SSE = "text/event-stream"


def register(app: web.Application, services: Services) -> None:
    """Add the Anthropic routes to the gateway's app."""
    api = AnthropicAPI(services)
    app.router.add_post("/v1/messages", api.messages)
    app.router.add_post("/v1/messages/count_tokens", api.count_tokens)


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


class AnthropicAPI:
    """The Messages handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, count=False)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, count=True)

    async def _handle(self, request: web.Request, *, count: bool) -> web.StreamResponse:
        started = time.perf_counter_ns()
        scheduler = self.services.scheduler
        body = await read_json(request)
        translate = anthropic.count_tokens_request if count else anthropic.messages_request
        req = translate(body, has_vision=True)  # images are checked against the model below
        model = str(body["model"])
        target = pipeline.resolve(scheduler, model, request)
        pipeline.require(target.runtime, pipeline.CHAT)
        vision = target.runtime.has_vision
        req = await images.anthropic_request(self.services.serving, vision, req)
        for need in anthropic.needs(body):
            pipeline.require(target.runtime, need, requested=model)
        seconds = pipeline.keep_alive(request, body)
        timed = await pipeline.lease(
            scheduler, request, target, keep_alive=seconds, started=started
        )
        # The engine's /v1/messages would drop a `lora` list and most sampling defaults:
        # requests that need them go to its chat endpoint instead (`anthropic_chat`).
        bridged = not count and (
            timed.lease.lora is not None
            or any(k not in pipeline.MESSAGES_PARAMS for k in target.runtime.params)
        )
        if bridged:
            req = anthropic_chat.chat_request(req)
        try:
            req = await self.services.admit(timed.lease, req, request.content_length or 0)
            return await self._answer(request, timed, req, model, count, bridged)
        finally:
            scheduler.release(timed.lease, keep_alive=seconds)

    async def _answer(
        self,
        request: web.Request,
        timed: Timed,
        req: EngineRequest,
        model: str,
        count: bool,
        bridged: bool,
    ) -> web.StreamResponse:
        if req.stream:
            return await self._stream(request, timed, req, model, bridged)
        status, payload = await child_calls.call(self.services.children, timed.lease, req)
        if status != 200 or not isinstance(payload, dict):
            raise child_calls.refused(status, payload)
        out: dict[str, Any] = anthropic_chat.message_from_chat(payload) if bridged else payload
        if not count:
            out = anthropic.message_response(out, model=model, message_id=message_id())
        return web.json_response(out, headers=ANTHROPIC.headers(request))

    async def _stream(
        self, request: web.Request, timed: Timed, req: EngineRequest, model: str, bridged: bool
    ) -> web.StreamResponse:
        state = anthropic.StreamState(model=model, message_id=message_id())
        bridge = anthropic_chat.ChatEvents() if bridged else None
        async with child_calls.stream(self.services.children, timed.lease, req) as exchange:
            if not child_calls.is_event_stream(exchange):
                payload = await child_calls.error_body(exchange)
                raise child_calls.refused(exchange.status, payload)
            headers = {"Content-Type": SSE, "Cache-Control": "no-cache"}
            response = web.StreamResponse(headers={**headers, **ANTHROPIC.headers(request)})
            await response.prepare(request)
            try:
                async for data in child_calls.events(exchange):
                    for item in bridge.feed(data) if bridge is not None else [data]:
                        for event in anthropic.stream_events(item, state):
                            await response.write(anthropic.sse(event))
                for event in anthropic.finish_stream(state):
                    await response.write(anthropic.sse(event))
            except UpstreamError as exc:  # the engine failed mid-stream
                failed = child_calls.child_failed(model, exc)
                if (trace := current()) is not None:
                    trace.failed(failed.status, failed.message, failed.code)
                error = ANTHROPIC.body(failed.status, failed.message, None)
                with contextlib.suppress(ConnectionError):
                    await response.write(anthropic.sse(error))
            except ConnectionError:  # the client went away; leaving closes the engine request
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
