"""ollama's inference API on the gateway: `/api/chat`, `/api/generate`, `/api/embed(dings)`.

`register` adds every ollama route to the gateway's app (the model management
routes are in `ollama_admin` and `ollama_pull`). A request is translated by
`blazar.protocols.ollama`, goes through the scheduler like an OpenAI request
(`upstream.acquire`: slots, queue, priority), and the engine's answer is
translated back, whole or as NDJSON lines; the final object's statistics come
from the engine's timings plus the load and total durations measured here.

`keep_alive` goes to the scheduler when the lease is released (a negative value
keeps the model loaded: -1). A request with nothing to generate loads the model,
or with `keep_alive: 0` unloads it at once (as ollama does, without loading it
first). Errors are ollama's `{"error": "..."}` with the status the scheduler, the
translator or the engine chose; 503s carry `Retry-After`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, ollama
from blazar.serve import ollama_admin, ollama_pull, upstream
from blazar.serve.runtime import ModelRuntime
from blazar.serve.upstream import TRACE, Timed, add_retry_after, trace_id

if TYPE_CHECKING:
    from blazar.serve.gateway import Gateway

NDJSON = "application/x-ndjson"
Feed = Callable[[Any, ollama.StreamState], list[dict[str, Any]]]


def register(app: web.Application, gateway: Gateway) -> None:
    """Add the ollama routes (`/api/*`) to the gateway's app."""
    api = OllamaAPI(gateway)
    app.router.add_post("/api/chat", api.chat)
    app.router.add_post("/api/generate", api.generate)
    app.router.add_post("/api/embed", api.embed)
    app.router.add_post("/api/embeddings", api.embeddings)
    ollama_admin.register(app, gateway)
    ollama_pull.register(app, gateway)


def error(
    request: web.Request, status: int, message: str, retry_after: float | None = None
) -> web.Response:
    """ollama's error response; a 503 says when to retry."""
    headers = {TRACE: trace_id(request)}
    add_retry_after(headers, retry_after)
    return web.json_response(ollama.error(message), status=status, headers=headers)


def keep_alive(body: dict[str, Any]) -> float | None:
    """The request's keep_alive in seconds for the scheduler: None (the model's own), -1
    (forever) or seconds (0: unload after this request)."""
    value = body.get("keep_alive")
    if value is None:
        return None
    seconds = ollama.keep_alive_seconds(value)
    return -1.0 if seconds is None else seconds


def _chat_refusal(runtime: ModelRuntime, raw_hint: bool) -> str | None:
    hint = "send raw: true with a fully formatted prompt, or " if raw_hint else ""
    return runtime.chat_refusal(hint)


def _embed_refusal(runtime: ModelRuntime) -> str | None:
    if runtime.embeddings:
        return None
    return (
        f"model '{runtime.name}' is not served for embeddings: set embeddings = true for it "
        "in the manifest and apply"
    )


class OllamaAPI:
    """The inference handlers; one instance per gateway app."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self.gateway.session is not None
        return self.gateway.session

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "generate")

    async def embed(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=False)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=True)

    # -- shared steps ---------------------------------------------------------

    async def _prepare(
        self, request: web.Request
    ) -> tuple[dict[str, Any], str, ModelRuntime, float | None]:
        """Body, model name, its runtime and keep_alive; ProtocolError/SchedulerError if not."""
        body = await upstream.read_json(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ProtocolError(400, "model is required")
        pool, _ = self.gateway.scheduler.lookup(model)
        return body, model, pool.runtime, keep_alive(body)

    async def _load_only(
        self, request: web.Request, load: LoadOnly, model: str, seconds: float | None, started: int
    ) -> web.Response:
        scheduler = self.gateway.scheduler
        if seconds == 0:  # unload now; like ollama, never load a model just to unload it
            await scheduler.stop_model(model)
        else:
            timed = await upstream.acquire(
                scheduler, request, model, started=started, keep_alive=seconds
            )
            scheduler.release(timed.lease, keep_alive=seconds)
        body = ollama.load_response(
            load, model=model, created_at=upstream.now_rfc3339(), unloaded=seconds == 0
        )
        return web.json_response(body, headers={TRACE: trace_id(request)})

    async def _run(
        self,
        request: web.Request,
        build: Callable[[dict[str, Any], ModelRuntime], EngineRequest | LoadOnly],
        refuse: Callable[[EngineRequest, ModelRuntime], str | None],
        answer: Callable[[web.Request, Timed, EngineRequest, str], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Translate, refuse, schedule and answer one request, mapping every failure."""
        started = time.perf_counter_ns()
        model = "?"
        try:
            body, model, runtime, seconds = await self._prepare(request)
            req = build(body, runtime)
            if isinstance(req, LoadOnly):
                return await self._load_only(request, req, model, seconds, started)
            refusal = refuse(req, runtime)
            if refusal is not None:
                return error(request, 400, refusal)
            timed = await upstream.acquire(
                self.gateway.scheduler, request, model, started=started, keep_alive=seconds
            )
        except ProtocolError as exc:
            return error(request, exc.status, exc.message)
        except Exception as exc:
            known = upstream.failure(exc, model)
            if known is None:
                raise
            return error(request, *known)
        try:
            return await answer(request, timed, req, model)
        except (aiohttp.ClientError, ConnectionError) as exc:
            status, message, _ = upstream.failure(exc, model) or (502, str(exc), None)
            return error(request, status, message)
        finally:
            self.gateway.scheduler.release(timed.lease, keep_alive=seconds)

    # -- chat and generate ----------------------------------------------------

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        def build(body: dict[str, Any], runtime: ModelRuntime) -> EngineRequest | LoadOnly:
            translate = ollama.chat_request if endpoint == "chat" else ollama.generate_request
            return translate(body, model_ctx=runtime.ctx)

        def refuse(req: EngineRequest, runtime: ModelRuntime) -> str | None:
            if req.path != "/v1/chat/completions":
                return None  # raw prompts and infill need no template
            return _chat_refusal(runtime, raw_hint=endpoint == "generate")

        async def answer(
            request: web.Request, timed: Timed, req: EngineRequest, model: str
        ) -> web.StreamResponse:
            if req.stream:
                state = ollama.StreamState(model, upstream.now_rfc3339(), endpoint)
                state.load_duration = timed.load_ns
                feed = ollama.chat_chunks if endpoint == "chat" else ollama.generate_chunks
                return await self._stream(request, timed, req, state, feed)
            status, payload = await upstream.call(self.session, timed.lease, req)
            if status != 200 or not isinstance(payload, dict):
                return self._engine_error(request, status, payload)
            translate = ollama.chat_response if endpoint == "chat" else ollama.generate_response
            out = translate(
                payload,
                model=model,
                created_at=upstream.now_rfc3339(),
                total_duration=timed.total(),
                load_duration=timed.load_ns,
            )
            return web.json_response(out, headers={TRACE: trace_id(request)})

        return await self._run(request, build, refuse, answer)

    def _engine_error(self, request: web.Request, status: int, payload: Any) -> web.Response:
        status, body = ollama.error_from_engine(status if status >= 400 else 502, payload)
        return web.json_response(body, status=status, headers={TRACE: trace_id(request)})

    async def _stream(
        self,
        request: web.Request,
        timed: Timed,
        req: EngineRequest,
        state: ollama.StreamState,
        feed: Feed,
    ) -> web.StreamResponse:
        async with upstream.stream(self.session, timed.lease, req) as engine:
            if not upstream.is_event_stream(engine):
                payload = await upstream.error_body(engine)
                return self._engine_error(request, engine.status, payload)
            response = web.StreamResponse(
                headers={
                    "Content-Type": NDJSON,
                    "Cache-Control": "no-cache",
                    TRACE: trace_id(request),
                }
            )
            await response.prepare(request)
            try:
                async for data in upstream.events(engine):
                    state.created_at = upstream.now_rfc3339()
                    state.total_duration = timed.total()
                    for obj in feed(data, state):
                        await response.write(ollama.ndjson(obj))
                state.total_duration = timed.total()
                for obj in ollama.finish_stream(state):
                    await response.write(ollama.ndjson(obj))
            except aiohttp.ClientError as exc:  # the engine failed mid-stream
                message = (
                    f"model '{state.model}' failed while answering: {exc or type(exc).__name__}"
                )
                with contextlib.suppress(ConnectionError):
                    await response.write(ollama.ndjson(ollama.error(message)))
            except ConnectionError:  # the client went away; leaving closes the engine request
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response

    # -- embeddings -----------------------------------------------------------

    async def _embed(self, request: web.Request, *, legacy: bool) -> web.StreamResponse:
        def build(body: dict[str, Any], runtime: ModelRuntime) -> EngineRequest | LoadOnly:
            if (refusal := _embed_refusal(runtime)) is not None:
                raise ProtocolError(400, refusal)
            translate = ollama.embeddings_request if legacy else ollama.embed_request
            return translate(body, model_ctx=runtime.ctx)

        async def answer(
            request: web.Request, timed: Timed, req: EngineRequest, model: str
        ) -> web.StreamResponse:
            status, payload = await upstream.call(self.session, timed.lease, req)
            if status != 200 or not isinstance(payload, dict):
                return self._engine_error(request, status, payload)
            if legacy:
                out = ollama.embeddings_response(payload)
            else:
                out = ollama.embed_response(
                    payload,
                    model=model,
                    total_duration=timed.total(),
                    load_duration=timed.load_ns,
                    dimensions=req.hints.get("dimensions"),
                )
            return web.json_response(out, headers={TRACE: trace_id(request)})

        return await self._run(request, build, lambda req, runtime: None, answer)
