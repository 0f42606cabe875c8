"""The gateway: one aiohttp server in front of every ready model.

OpenAI requests are passed through to the instance the scheduler picks,
bytes untouched (the body is parsed once to read `model`, and re-encoded only
when a `model#adapter` request needs its `lora` field). They travel on
`ChildConnections`, the small HTTP/1.1 client in `blazar.serve.child_http`
kept for this hot path: keep-alive connections to each child, reused across
requests, and a response parsed as it arrives. Streams are copied chunk by
chunk as they arrive; a client that disconnects cancels the handler
(`handler_cancellation`), which closes the upstream connection, which makes
llama-server stop generating. Every response carries `x-request-id`.
`Gateway.session` (aiohttp's client) serves the routes that translate other
protocols. docs/performance.md says what this costs and why it is built this
way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from blazar import __version__
from blazar.serve import anthropic_api, ollama_api
from blazar.serve.child_http import (
    CONNECT_TIMEOUT,
    REUSE_IDLE,
    ChildConnections,
    Exchange,
    UpstreamError,
)
from blazar.serve.instance import InstanceFailed
from blazar.serve.scheduler import Lease, Scheduler, SchedulerError
from blazar.serve.upstream import TRACE, Control, add_retry_after, trace_id

PRIORITY = "x-blazar-priority"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ClientProblem(Exception):
    """A request the gateway refuses before it reaches a model (400)."""


_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 502: "api_error"}


def error_body(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error envelope."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def openai_error(request: web.Request, status: int, message: str, code: str) -> web.Response:
    headers = {TRACE: trace_id(request)}
    return web.json_response(error_body(status, message, code), status=status, headers=headers)


# -- the gateway ---------------------------------------------------------------------------


class Gateway:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.session: aiohttp.ClientSession | None = None
        self.children = ChildConnections()
        self.started = time.time()
        self.control: Control | None = None  # the daemon's hooks for /api/pull and friends

    async def open(self) -> None:
        # aiohttp's client, for the routes that translate (ollama, Anthropic): pooled, and
        # like ChildConnections it reuses no connection idle long enough to be closing.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=REUSE_IDLE, ttl_dns_cache=None)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=["User-Agent"],
        )

    async def close(self) -> None:
        self.children.close()
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[self._trace_header])
        app.router.add_get("/", self.root)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        for path, kind in (
            ("/v1/chat/completions", "chat"),
            ("/v1/completions", "completion"),
            ("/v1/embeddings", "embeddings"),
            ("/v1/responses", "chat"),
        ):
            app.router.add_post(path, self._proxy_route(path, kind))
        app.router.add_get("/api/blazar/ps", self.ps)
        app.router.add_post("/api/blazar/stop", self.stop)
        ollama_api.register(app, self)  # /api/*
        anthropic_api.register(app, self)  # /v1/messages
        return app

    @web.middleware
    async def _trace_header(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if not response.prepared:
            response.headers.setdefault(TRACE, trace_id(request))
        return response

    # -- plain endpoints ------------------------------------------------------

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Blazar is running\n")

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    async def models(self, request: web.Request) -> web.Response:
        created = int(self.started)
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "blazar"}
            for runtime in self.scheduler.runtimes.values()
            for name in (runtime.name, *runtime.aliases)
        ]
        return web.json_response({"object": "list", "data": data})

    async def ps(self, request: web.Request) -> web.Response:
        return web.json_response({"instances": self.scheduler.snapshot()})

    async def stop(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            model = body["model"]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'send {"model": NAME}'}, status=400)
        try:
            stopped = await self.scheduler.stop_model(str(model))
        except SchedulerError as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        return web.json_response({"model": model, "stopped": stopped})

    # -- OpenAI pass-through --------------------------------------------------

    def _proxy_route(self, path: str, kind: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.proxy(request, path, kind)

        return handler

    async def proxy(self, request: web.Request, path: str, kind: str) -> web.StreamResponse:
        body = await request.read()
        try:
            data = json.loads(body)
        except ValueError:
            return openai_error(request, 400, "the request body is not valid JSON", "invalid_json")
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            return openai_error(
                request,
                400,
                "'model' is required: a string naming a model",
                "invalid_request_error",
            )
        model = data["model"]
        try:
            pool, adapter = self.scheduler.lookup(model)
            self._check(pool.runtime, kind)
        except SchedulerError as exc:
            return openai_error(request, exc.status, str(exc), exc.code)
        except ClientProblem as exc:
            return openai_error(request, 400, str(exc), "invalid_request_error")
        if adapter is not None:
            index = pool.runtime.adapter_index(adapter)
            scale = pool.runtime.adapters[index].scale if index is not None else 1.0
            data["lora"] = [{"id": index, "scale": scale}]
            body = json.dumps(data).encode()
        priority = request.headers.get(PRIORITY, "").lower() == "high"
        try:
            lease = await self.scheduler.acquire(model, priority=priority)
        except SchedulerError as exc:
            response = openai_error(request, exc.status, str(exc), exc.code)
            add_retry_after(response.headers, exc.retry_after)
            return response
        except InstanceFailed as exc:
            return openai_error(
                request, 502, f"model '{model}' failed to start: {exc}", "upstream_error"
            )
        try:
            return await self._forward(request, lease, path, body)
        finally:
            self.scheduler.release(lease)

    @staticmethod
    def _check(runtime: Any, kind: str) -> None:
        if kind == "chat" and (refusal := runtime.chat_refusal("use /v1/completions, or ")):
            raise ClientProblem(refusal)
        if kind == "embeddings" and not runtime.embeddings:
            raise ClientProblem(
                f"model '{runtime.name}' is not served for embeddings: set embeddings = true "
                "for it in the manifest and apply"
            )

    async def _forward(
        self, request: web.Request, lease: Lease, path: str, body: bytes
    ) -> web.StreamResponse:
        base = lease.url
        exchange: Exchange | None = None
        response: web.StreamResponse | None = None
        try:
            exchange = await self.children.post(base, path, body)
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
            message = (
                f"model '{lease.runtime.name}' failed while answering: {exc or type(exc).__name__}"
            )
            if response is None or not response.prepared:
                return openai_error(request, 502, message, "upstream_error")
            # Headers are gone: end the stream with an error event clients raise on.
            event = json.dumps(error_body(502, message, "upstream_error"))
            try:
                await response.write(f"data: {event}\n\n".encode())
                await response.write_eof()
            except ConnectionError:
                pass
            return response
        finally:
            if exchange is not None:  # kept if finished; else closed, and the child stops
                self.children.release(base, exchange)
