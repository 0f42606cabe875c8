"""OpenAI's Responses API on the gateway: `POST /v1/responses`, and what it cannot find.

A request is validated and translated by `blazar.protocols.openai_responses`
into a `/v1/chat/completions` request (docs/compatibility.md says why not the
engine's own `/v1/responses`), takes the gateway's one request path
(`blazar.serve.pipeline`: resolve, require a chat template, and tools or
thinking when the request uses them, lease), and the engine's answer is built
back into a Response, whole or as the Responses event stream
(`blazar.protocols.openai_responses_stream`).

Blazar keeps no responses: `GET`/`DELETE /v1/responses/{id}`, its `input_items`
and `cancel` answer a 404 in OpenAI's shape that says so (and a request with
`previous_response_id` is refused). Failures are raised and answered in
OpenAI's envelope by the gateway's error middleware; a child that fails
mid-stream gets an `error` event.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.protocols.openai_responses import ResponsesRequest, responses_request
from blazar.protocols.openai_responses_stream import ResponseStream, response_object
from blazar.protocols.sse import encode
from blazar.serve import engine, pipeline
from blazar.serve.child_http import UpstreamError
from blazar.serve.envelopes import OPENAI
from blazar.serve.http import read_json
from blazar.serve.pipeline import Timed
from blazar.serve.services import Services

NO_TEMPLATE_HINT = "use /v1/completions, or "
NOT_STORED = (
    "Blazar does not store responses, so there is no response '{id}' to {what}; keep "
    "what you need from the answer, and send the whole conversation as input"
)


def register(app: web.Application, services: Services) -> None:
    """Add the Responses routes to the gateway's app."""
    api = ResponsesAPI(services)
    app.router.add_post("/v1/responses", api.create)
    app.router.add_get("/v1/responses/{id}", api.not_stored)
    app.router.add_delete("/v1/responses/{id}", api.not_stored)
    app.router.add_get("/v1/responses/{id}/input_items", api.not_stored)
    app.router.add_post("/v1/responses/{id}/cancel", api.not_stored)


def _event(event: dict[str, Any]) -> bytes:
    return encode(event, str(event["type"]))


class ResponsesAPI:
    """The Responses handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def not_stored(self, request: web.Request) -> web.StreamResponse:
        what = {"GET": "read", "DELETE": "delete"}.get(request.method, "cancel")
        message = NOT_STORED.format(id=request.match_info["id"], what=what)
        raise ProtocolError(404, message, "response_not_found")

    async def create(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter_ns()
        body = await read_json(request)
        req = responses_request(body)
        model = str(body["model"])
        scheduler = self.services.scheduler
        target = pipeline.resolve(scheduler, model, request)
        pipeline.require(target.runtime, pipeline.CHAT, alternative=NO_TEMPLATE_HINT)
        for need in req.needs:
            pipeline.require(target.runtime, need, requested=model)
        timed = await pipeline.lease(scheduler, request, target, started=started)
        try:
            return await self._answer(request, timed, req, model)
        finally:
            scheduler.release(timed.lease)

    async def _answer(
        self, request: web.Request, timed: Timed, req: ResponsesRequest, model: str
    ) -> web.StreamResponse:
        response_id, created_at = f"resp_{uuid.uuid4().hex}", int(time.time())
        if req.engine.stream:
            stream = ResponseStream(response_id, created_at, model, req.echo)
            return await self._stream(request, timed, req, stream)
        status, payload = await engine.call(self.services.children, timed.lease, req.engine)
        if status != 200 or not isinstance(payload, dict):
            raise engine.refused(status, payload)
        out = response_object(
            payload, response_id=response_id, created_at=created_at, model=model, echo=req.echo
        )
        return web.json_response(out, headers=OPENAI.headers(request))

    async def _stream(
        self, request: web.Request, timed: Timed, req: ResponsesRequest, state: ResponseStream
    ) -> web.StreamResponse:
        async with engine.stream(self.services.children, timed.lease, req.engine) as exchange:
            if not engine.is_event_stream(exchange):
                raise engine.refused(exchange.status, await engine.error_body(exchange))
            headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            response = web.StreamResponse(headers={**headers, **OPENAI.headers(request)})
            await response.prepare(request)
            try:
                for event in state.start():
                    await response.write(_event(event))
                async for data in engine.events(exchange):
                    for event in state.feed(data):
                        await response.write(_event(event))
                for event in state.finish():
                    await response.write(_event(event))
            except UpstreamError as exc:  # the engine failed mid-stream
                failed = engine.child_failed(state.model, exc)
                error = state.error(failed.code or "server_error", failed.message)
                with contextlib.suppress(ConnectionError):
                    await response.write(_event(error))
            except ConnectionError:  # the client went away; leaving closes the engine request
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response
