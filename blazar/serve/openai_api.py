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

`keep_alive` (a body field, or the `x-blazar-keep-alive` header) is honoured as on
ollama's routes. After the lease, `pipeline.admit` runs the prompt preflight and the
sessions' slot routing; it counts nothing for a body whose size proves it fits, so
the bytes stay untouched unless a slot must be named. With `serving.singleflight`,
identical concurrent deterministic requests share one engine call (`_shared`).

Failures before any byte is sent are raised and answered in OpenAI's envelope
by the gateway's error middleware; a child that fails mid-stream gets an error
event, since the headers are gone.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve import pipeline
from blazar.serve.child_http import Exchange, UpstreamError
from blazar.serve.engine import child_failed
from blazar.serve.envelopes import OPENAI
from blazar.serve.http import TRACE, trace_id
from blazar.serve.scheduler import Lease, Target
from blazar.serve.services import Services
from blazar.serve.singleflight import deterministic

ROUTES = (
    ("/v1/chat/completions", pipeline.CHAT),
    ("/v1/completions", pipeline.ANY),
    ("/v1/embeddings", pipeline.EMBEDDINGS),
    ("/v1/responses", pipeline.CHAT),
)
NO_TEMPLATE_HINT = "use /v1/completions, or "


def own_id(payload: bytes) -> bytes:
    """An answer shared by singleflight, under a new id of the same kind (chatcmpl-...)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return payload
    prefix = data["id"].split("-", 1)[0] if "-" in data["id"] else "chatcmpl"
    return json.dumps({**data, "id": f"{prefix}-{uuid.uuid4().hex[:24]}"}).encode()


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
        target = pipeline.resolve(scheduler, data.get("model"))
        pipeline.require(target.runtime, need, alternative=NO_TEMPLATE_HINT)
        seconds = pipeline.keep_alive(request, data)
        if target.runtime.singleflight and deterministic(data):
            return await self._shared(request, target, path, body, data, seconds)
        timed = await pipeline.lease(scheduler, request, target, keep_alive=seconds)
        try:
            body = await self._admitted(timed.lease, path, body, data)
            return await self._forward(request, timed.lease.url, target.runtime.name, path, body)
        finally:
            scheduler.release(timed.lease, keep_alive=seconds)

    async def _admitted(self, lease: Lease, path: str, body: bytes, data: dict[str, Any]) -> bytes:
        """The bytes to send: as they came, unless the adapter or a slot must be named."""
        services = self.services
        slot = await pipeline.admit(
            services.prompts, services.sessions, lease, path, data, len(body)
        )
        if lease.adapter is None and slot is None:
            return body
        out = pipeline.engine_body(lease, data)
        return json.dumps(out if slot is None else {**out, "id_slot": slot}).encode()

    async def _shared(
        self,
        request: web.Request,
        target: Target,
        path: str,
        body: bytes,
        data: dict[str, Any],
        seconds: float | None,
    ) -> web.Response:
        """Singleflight: one engine call for identical concurrent deterministic requests;
        each client after the first gets the answer under an id of its own."""
        scheduler, model = self.services.scheduler, target.runtime.name

        async def call() -> tuple[int, str, bytes]:
            timed = await pipeline.lease(scheduler, request, target, keep_alive=seconds)
            try:
                sent = await self._admitted(timed.lease, path, body, data)
                return await self._whole(timed.lease.url, model, path, sent)
            finally:
                scheduler.release(timed.lease, keep_alive=seconds)

        key = (model, target.adapter, path, body)
        (status, content_type, payload), leader = await self.services.singleflight.share(key, call)
        if not leader and status == 200:
            payload = own_id(payload)
        headers = {"Content-Type": content_type, TRACE: trace_id(request)}
        return web.Response(body=payload, status=status, headers=headers)

    async def _whole(self, base: str, model: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        children = self.services.children
        exchange: Exchange | None = None
        try:
            exchange = await children.post(base, path, body)
            payload = await exchange.read_all()
            return exchange.status, exchange.content_type or "application/json", payload
        except (UpstreamError, ConnectionError) as exc:
            raise child_failed(model, exc) from None
        finally:
            if exchange is not None:
                children.release(base, exchange)

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
