"""OpenAI's API on the gateway: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/responses` and `/v1/models`.

Requests are passed through to the instance the scheduler picks, bytes
untouched: the body is parsed once to read `model`, and re-encoded only when a
`model#adapter` request needs its `lora` field (`pipeline.engine_body`). They
travel on `ChildConnections` (`blazar.serve.child_http`), kept for this hot
path: keep-alive connections to each child, and a response parsed as it
arrives. Streams are copied chunk by chunk as they arrive; a client that
disconnects cancels the handler (`handler_cancellation`), which closes the
upstream connection, which makes llama-server stop generating.
docs/performance.md says what this costs and why it is built this way.

Failures before any byte is sent are raised and answered in OpenAI's envelope
by the gateway's error middleware; a child that fails mid-stream gets an error
event, since the headers are gone.
"""

from __future__ import annotations

import json

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve import pipeline
from blazar.serve.child_http import Exchange, UpstreamError
from blazar.serve.engine import child_failed
from blazar.serve.envelopes import OPENAI
from blazar.serve.grants import sees
from blazar.serve.http import TRACE, trace_id
from blazar.serve.services import Services

ROUTES = (
    ("/v1/chat/completions", pipeline.CHAT),
    ("/v1/completions", pipeline.ANY),
    ("/v1/embeddings", pipeline.EMBEDDINGS),
    ("/v1/responses", pipeline.CHAT),
)
NO_TEMPLATE_HINT = "use /v1/completions, or "


def register(app: web.Application, services: Services) -> None:
    """Add the OpenAI routes to the gateway's app."""
    api = OpenAIAPI(services)
    app.router.add_get("/v1/models", api.models)
    for path, need in ROUTES:
        app.router.add_post(path, api.route(path, need))


class OpenAIAPI:
    """The pass-through handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def models(self, request: web.Request) -> web.Response:
        created = int(self.services.started)
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "blazar"}
            for runtime in self.services.scheduler.runtimes.values()
            if sees(request, runtime.name, runtime.aliases)  # a key lists only its models
            for name in (runtime.name, *runtime.aliases)
        ]
        return web.json_response({"object": "list", "data": data})

    def route(self, path: str, need: str) -> pipeline.Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.proxy(request, path, need)

        return handler

    async def proxy(self, request: web.Request, path: str, need: str) -> web.StreamResponse:
        body = await request.read()
        try:
            data = json.loads(body)
        except ValueError:
            raise ProtocolError(400, "the request body is not valid JSON", "invalid_json") from None
        if not isinstance(data, dict):
            raise ProtocolError(400, "the request body must be a JSON object", "invalid_json")
        scheduler = self.services.scheduler
        target = pipeline.resolve(scheduler, data.get("model"), request)
        pipeline.require(target.runtime, need, alternative=NO_TEMPLATE_HINT)
        timed = await pipeline.lease(scheduler, request, target)
        try:
            if timed.lease.adapter is not None:
                body = json.dumps(pipeline.engine_body(timed.lease, data)).encode()
            return await self._forward(request, timed.lease.url, target.runtime.name, path, body)
        finally:
            scheduler.release(timed.lease)

    async def _forward(
        self, request: web.Request, base: str, model: str, path: str, body: bytes
    ) -> web.StreamResponse:
        children = self.services.children
        exchange: Exchange | None = None
        response: web.StreamResponse | None = None
        try:
            exchange = await children.post(base, path, body)
            content_type = exchange.content_type or "application/json"
            if not content_type.startswith("text/event-stream"):
                payload = await exchange.read_all()
                return web.Response(
                    body=payload,
                    status=exchange.status,
                    headers={"Content-Type": content_type, TRACE: trace_id(request)},
                )
            response = web.StreamResponse(
                status=exchange.status,
                headers={
                    "Content-Type": content_type,
                    "Cache-Control": "no-cache",
                    TRACE: trace_id(request),
                },
            )
            await response.prepare(request)
            while chunk := await exchange.read():
                await response.write(chunk)
            await response.write_eof()
            return response
        except (UpstreamError, ConnectionError) as exc:
            failed = child_failed(model, exc)
            if response is None or not response.prepared:
                raise failed from None
            # Headers are gone: end the stream with an error event clients raise on.
            event = json.dumps(OPENAI.body(failed.status, failed.message, failed.code))
            try:
                await response.write(f"data: {event}\n\n".encode())
                await response.write_eof()
            except ConnectionError:
                pass
            return response
        finally:
            if exchange is not None:  # kept if finished; else closed, and the child stops
                children.release(base, exchange)
