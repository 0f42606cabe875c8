"""The gateway: one aiohttp server in front of every ready model.

OpenAI requests are passed through to the instance the scheduler picks,
bytes untouched (the body is parsed once to read `model`, and re-encoded only
when a `model#adapter` request needs its `lora` field). They travel on
`ChildConnections`, a small HTTP/1.1 client kept for this hot path: keep-alive
connections to each child, reused across requests, and a response parsed as it
arrives. Streams are copied chunk by chunk as they arrive; a client that
disconnects cancels the handler (`handler_cancellation`), which closes the
upstream connection, which makes llama-server stop generating. Every response
carries `x-request-id`. `Gateway.session` (aiohttp's client) serves the routes
that translate other protocols. docs/performance.md says what this costs and
why it is built this way.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from blazar import __version__
from blazar.serve import anthropic_api, ollama_api
from blazar.serve.instance import InstanceFailed
from blazar.serve.scheduler import Lease, Scheduler, SchedulerError
from blazar.serve.upstream import Control

TRACE = "x-request-id"
PRIORITY = "x-blazar-priority"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# llama-server closes a keep-alive connection after 5 s idle: reuse none that old, so a
# request is never sent on a connection the child is closing at that moment.
REUSE_IDLE = 4.0
CONNECT_TIMEOUT = 10.0
READ_AHEAD = 1 << 20  # bytes read from a child beyond what a slow client took: then pause


class ClientProblem(Exception):
    """A request the gateway refuses before it reaches a model (400)."""


def _trace(request: web.Request) -> str:
    trace = request.get("trace")
    if isinstance(trace, str):
        return trace
    trace = request.headers.get(TRACE) or uuid.uuid4().hex
    request["trace"] = trace
    return trace


_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 502: "api_error"}


def error_body(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error envelope."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def openai_error(request: web.Request, status: int, message: str, code: str) -> web.Response:
    headers = {TRACE: _trace(request)}
    return web.json_response(error_body(status, message, code), status=status, headers=headers)


# -- the client for the pass-through -----------------------------------------------------


class UpstreamError(Exception):
    """A child did not answer: refused the connection, closed it, or sent bad HTTP."""


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK, _CHUNK_END, _TRAILER, _TO_CLOSE, _DONE = range(8)


class _Exchange(asyncio.Protocol):
    """One connection to a child, one request at a time (HTTP/1.1 keep-alive).

    `data_received` parses the response as it comes: the status line and headers,
    then a body framed by Content-Length, by chunks, or by the connection's end. Body
    bytes queue up for `read`, which hands over whatever has arrived: nothing is held
    back waiting for more.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.idle_in: list[_Exchange] | None = None  # the pool's list, while it waits there
        self._waiter: asyncio.Future[None] | None = None
        self._begin()

    def _begin(self) -> None:
        self.status = 0
        self.content_type = ""
        self.keep_alive = True
        self.chunked = False
        self.received = False  # any byte of this exchange's response
        self.complete = False
        self._state = _HEAD
        self._buffer = bytearray()
        self._remaining = 0
        self._pieces: list[bytes] = []
        self._queued = 0
        self._paused = False
        self._error: UpstreamError | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._buffer += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(UpstreamError(f"the child sent a malformed response ({exc})"))
            self.close()
        if self._queued > READ_AHEAD and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_in is not None:  # closed by the child while idle: out of the pool
            self.idle_in.remove(self)
            self.idle_in = None
        if self._state == _TO_CLOSE:
            self._finish()
        elif not self.complete:
            self._fail(UpstreamError(str(exc) if exc else "Server disconnected"))
        self._wake()

    # -- parsing ------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buffer
        while buf:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > 1 << 16:
                        raise ValueError("response headers over 64 KiB")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._head(head)
            elif state in (_LENGTH, _CHUNK):
                piece = bytes(buf[: self._remaining])
                del buf[: len(piece)]
                self._push(piece)
                self._remaining -= len(piece)
                if self._remaining == 0:
                    if state == _LENGTH:
                        self._finish()
                    else:
                        self._state = _CHUNK_END
            elif state in (_CHUNK_SIZE, _TRAILER):
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == _TRAILER:
                    if not line:
                        self._finish()
                    continue
                self._remaining = int(line.split(b";", 1)[0], 16)
                self._state = _CHUNK if self._remaining else _TRAILER
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("a chunk without its CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TO_CLOSE:
                self._push(bytes(buf))
                buf.clear()
            else:  # _DONE: bytes after the response; this connection is not reused
                self.keep_alive = False
                buf.clear()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        if not version.startswith(b"HTTP/1."):
            raise ValueError(f"not HTTP/1.x: {lines[0][:40]!r}")
        self.status = int(status)
        if self.status < 200:  # an interim response (100 Continue): the real one follows
            return
        length: int | None = None
        self.keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-type":
                self.content_type = value.strip().decode("latin-1")
            elif name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif name == b"connection":
                self.keep_alive = b"close" not in value.lower()
        if self.chunked:
            self._state = _CHUNK_SIZE
        elif self.status in (204, 304) or length == 0:
            self._finish()
        elif length is not None:
            self._state, self._remaining = _LENGTH, length
        else:
            self._state, self.keep_alive = _TO_CLOSE, False

    def _push(self, piece: bytes) -> None:
        if piece:
            self._pieces.append(piece)
            self._queued += len(piece)

    def _finish(self) -> None:
        self._state, self.complete = _DONE, True

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # -- the exchange ------------------------------------------------------------------

    async def send(self, request: bytes) -> None:
        """Send a request; return once the response's status line and headers are in."""
        assert self.transport is not None
        self._begin()
        self.transport.write(request)
        while self._state == _HEAD:
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at
        the end of the body."""
        while not self._pieces:
            if self.complete:
                return b""
            await self._wait()
        pieces, self._pieces, self._queued = self._pieces, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def read_all(self) -> bytes:
        parts = []
        while part := await self.read():
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class ChildConnections:
    """Keep-alive HTTP/1.1 connections to the children, reused across requests."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Exchange]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}

    def address(self, base_url: str) -> tuple[str, int]:
        found = self._addresses.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            found = self._addresses[base_url] = (parts.hostname or "", parts.port or 80)
        return found

    async def post(self, base_url: str, path: str, body: bytes) -> _Exchange:
        """Send a JSON POST; return the exchange with the response's head read. Give the
        exchange back with `release` (in a `finally`: that closes one left unfinished)."""
        host, port = address = self.address(base_url)
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        exchange = self._reuse(address)
        if exchange is not None:
            try:
                await exchange.send(request)
                return exchange
            except UpstreamError:
                exchange.close()
                if exchange.received:
                    raise
                # The child closed this idle connection as it was reused: once more, anew.
            except BaseException:
                exchange.close()
                raise
        exchange = await self._connect(host, port)
        try:
            await exchange.send(request)
        except BaseException:
            exchange.close()
            raise
        return exchange

    def release(self, base_url: str, exchange: _Exchange) -> None:
        """Keep a finished exchange's connection for the next request, or close it."""
        # llama-server closes the connection after a streamed (chunked) response, though
        # it says keep-alive: one reused then would fail. So chunked ones are not kept.
        if not exchange.complete or not exchange.keep_alive or exchange.closed or exchange.chunked:
            exchange.close()
            return
        exchange.idle_since = time.monotonic()
        exchange.idle_in = self._idle.setdefault(self.address(base_url), [])
        exchange.idle_in.append(exchange)

    def _reuse(self, address: tuple[str, int]) -> _Exchange | None:
        idle = self._idle.get(address)
        while idle:
            exchange = idle.pop()
            exchange.idle_in = None
            if not exchange.closed and time.monotonic() - exchange.idle_since < REUSE_IDLE:
                return exchange
            exchange.close()
        return None

    async def _connect(self, host: str, port: int) -> _Exchange:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, exchange = await loop.create_connection(_Exchange, host, port)
        except TimeoutError:
            raise UpstreamError(f"Cannot connect to {host}:{port}: timed out") from None
        except OSError as exc:
            raise UpstreamError(f"Cannot connect to {host}:{port}: {exc}") from None
        return exchange

    def close(self) -> None:
        for idle in self._idle.values():
            for exchange in idle:
                exchange.idle_in = None
                exchange.close()
        self._idle.clear()


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
            response.headers.setdefault(TRACE, _trace(request))
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
            if exc.retry_after is not None:
                response.headers["Retry-After"] = str(int(max(1, exc.retry_after)))
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
        if kind == "chat" and not runtime.can_chat:
            raise ClientProblem(
                f"model '{runtime.name}' has no chat template (its GGUF carries none) and the "
                "manifest declares none: use /v1/completions, or set chat_template for it in "
                f"the manifest (e.g. `blazar config set models.{runtime.name}.chat_template "
                "chatml`) and apply"
            )
        if kind == "embeddings" and not runtime.embeddings:
            raise ClientProblem(
                f"model '{runtime.name}' is not served for embeddings: set embeddings = true "
                "for it in the manifest and apply"
            )

    async def _forward(
        self, request: web.Request, lease: Lease, path: str, body: bytes
    ) -> web.StreamResponse:
        base = lease.url
        exchange: _Exchange | None = None
        response: web.StreamResponse | None = None
        try:
            exchange = await self.children.post(base, path, body)
            content_type = exchange.content_type or "application/json"
            if not content_type.startswith("text/event-stream"):
                payload = await exchange.read_all()
                return web.Response(
                    body=payload,
                    status=exchange.status,
                    headers={"Content-Type": content_type, TRACE: _trace(request)},
                )
            response = web.StreamResponse(
                status=exchange.status,
                headers={
                    "Content-Type": content_type,
                    "Cache-Control": "no-cache",
                    TRACE: _trace(request),
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
