"""ollama's inference API on the gateway: `/api/chat`, `/api/generate`, `/api/embed(dings)`.

`register` adds these routes (the model management routes are in
`ollama_admin` and `ollama_pull`). A request is translated by
`blazar.protocols.ollama` and then takes the gateway's one request path
(`blazar.serve.request.pipeline`: resolve, require, lease; `blazar.serve.request.child_calls`: the
call), and the engine's answer is translated back, whole or as NDJSON lines;
the final object's statistics come from the engine's timings plus the load and
total durations measured here.

A templated `/api/generate` answers with `context`, the token ids of the
conversation so far (the rendered prompt and the answer, from the child's
`/apply-template` and `/tokenize`), as ollama does; a request that sends one back
continues after those tokens. Tools and thinking need a template that has them
(`pipeline.require`: `"<model>" does not support tools`); `suffix` on a model
without fill-in-the-middle tokens is `"<model>" does not support insert`.

`keep_alive` goes to the scheduler when the lease is released (a negative value
keeps the model loaded: -1). A request with nothing to generate loads the model,
or with `keep_alive: 0` unloads it at once (as ollama does, without loading it
first). Failures are raised and answered as ollama's `{"error": "..."}` by the
gateway's error middleware; 503s carry `Retry-After`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from aiohttp import web

from blazar.observe.trace import current
from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, ollama
from blazar.serve.http import TRACE, name_in, now_rfc3339, read_json, trace_id
from blazar.serve.request import child_calls, images, pipeline
from blazar.serve.request.envelopes import OLLAMA
from blazar.serve.request.pipeline import Timed
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.child_http import UpstreamError
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target

NDJSON = "application/x-ndjson"
RAW_HINT = "send raw: true with a fully formatted prompt, or "
Feed = Callable[[Any, ollama.StreamState], list[dict[str, Any]]]
Finish = Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]
Build = Callable[[dict[str, Any], ModelRuntime], EngineRequest | LoadOnly]
Answer = Callable[[web.Request, Timed, EngineRequest, str], Awaitable[web.StreamResponse]]


def register(app: web.Application, services: Services) -> None:
    """Add ollama's inference routes to the gateway's app."""
    api = OllamaAPI(services)
    app.router.add_post("/api/chat", api.chat)
    app.router.add_post("/api/generate", api.generate)
    app.router.add_post("/api/embed", api.embed)
    app.router.add_post("/api/embeddings", api.embeddings)


def keep_alive(body: dict[str, Any]) -> float | None:
    """The request's keep_alive in seconds for the scheduler: None (the model's own), -1
    (forever) or seconds (0: unload after this request)."""
    value = body.get("keep_alive")
    if value is None:
        return None
    seconds = ollama.keep_alive_seconds(value)
    return -1.0 if seconds is None else seconds


def engine_error(status: int, payload: Any, req: EngineRequest | None = None) -> NoReturn:
    """Raise what the engine answered with an error, for ollama's envelope."""
    if req is not None and req.path == "/infill" and status == 501:
        model = req.hints.get("model", "the model")
        raise ProtocolError(
            400,
            f'"{model}" does not support insert: its GGUF has no fill-in-the-middle tokens '
            "(suffix needs them); use a code model with FIM",
        )
    raise child_calls.refused(status, payload)


class OllamaAPI:
    """The inference handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "generate")

    async def embed(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=False)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=True)

    # -- the shared steps -------------------------------------------------------------

    async def _load_only(
        self,
        request: web.Request,
        load: LoadOnly,
        target: Target,
        model: str,
        seconds: float | None,
        started: int,
    ) -> web.Response:
        scheduler = self.services.scheduler
        if seconds == 0:  # unload now; like ollama, never load a model just to unload it
            await scheduler.stop_model(model)
        else:
            timed = await pipeline.lease(
                scheduler, request, target, keep_alive=seconds, started=started
            )
            scheduler.release(timed.lease, keep_alive=seconds)
        body = ollama.load_response(
            load, model=model, created_at=now_rfc3339(), unloaded=seconds == 0
        )
        return web.json_response(body, headers={TRACE: trace_id(request)})

    async def _run(
        self, request: web.Request, build: Build, need: str, answer: Answer, hint: str = ""
    ) -> web.StreamResponse:
        """Translate, check, lease and answer one request."""
        started = time.perf_counter_ns()
        body = await read_json(request)
        scheduler = self.services.scheduler
        model = name_in(body, "model")  # ollama's own words when it is missing
        target = pipeline.resolve(scheduler, model, request)
        seconds = keep_alive(body)
        req = build(body, target.runtime)
        if isinstance(req, LoadOnly):
            return await self._load_only(request, req, target, model, seconds, started)
        req = await images.ollama_request(
            self.services.serving, target.runtime.has_vision, body, req
        )
        templated = "messages" in req.hints or req.path == "/v1/chat/completions"
        if need == pipeline.CHAT and templated:
            pipeline.require(target.runtime, need, alternative=hint)  # raw and infill need none
            for extra in ollama.needs(body):
                pipeline.require(target.runtime, extra, requested=model)
        if req.path == "/infill":
            req = EngineRequest(req.path, req.body, req.stream, {**req.hints, "model": model})
        timed = await pipeline.lease(
            scheduler, request, target, keep_alive=seconds, started=started
        )
        try:
            req = await self.services.admit(timed.lease, req, request.content_length or 0)
            return await answer(request, timed, req, model)
        finally:
            scheduler.release(timed.lease, keep_alive=seconds)

    # -- chat and generate ------------------------------------------------------------

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        def build(body: dict[str, Any], runtime: ModelRuntime) -> EngineRequest | LoadOnly:
            translate = ollama.chat_request if endpoint == "chat" else ollama.generate_request
            return translate(body, model_ctx=runtime.ctx, has_vision=runtime.has_vision)

        async def answer(
            request: web.Request, timed: Timed, req: EngineRequest, model: str
        ) -> web.StreamResponse:
            context = Context(self.services, timed, req) if "messages" in req.hints else None
            if endpoint == "generate" and context is not None:
                req = await context.request()
            if req.stream:
                state = ollama.StreamState(model, now_rfc3339(), endpoint)
                state.load_duration = timed.load_ns
                feed = ollama.chat_chunks if endpoint == "chat" else ollama.generate_chunks
                finish = context.finish if endpoint == "generate" and context else None
                return await self._stream(request, timed, req, state, feed, finish)
            status, payload = await child_calls.call(self.services.children, timed.lease, req)
            if status != 200 or not isinstance(payload, dict):
                engine_error(status, payload, req)
            translate = ollama.chat_response if endpoint == "chat" else ollama.generate_response
            out = translate(
                payload,
                model=model,
                created_at=now_rfc3339(),
                total_duration=timed.total(),
                load_duration=timed.load_ns,
            )
            if endpoint == "generate" and context is not None:
                out = await context.finish(out, str(out.get("response", "")))
            return web.json_response(out, headers={TRACE: trace_id(request)})

        hint = RAW_HINT if endpoint == "generate" else ""
        return await self._run(request, build, pipeline.CHAT, answer, hint)

    async def _stream(
        self,
        request: web.Request,
        timed: Timed,
        req: EngineRequest,
        state: ollama.StreamState,
        feed: Feed,
        finish: Finish | None = None,
    ) -> web.StreamResponse:
        """Stream the engine's answer as NDJSON; `finish` completes the final object (with
        everything the answer said), as `Context.finish` adds the conversation's tokens."""
        said: list[str] = []

        async def write(response: web.StreamResponse, obj: dict[str, Any]) -> None:
            if finish is not None:
                if obj.get("done"):
                    obj = await finish(obj, "".join(said))
                elif isinstance(obj.get("response"), str):
                    said.append(obj["response"])
            await response.write(ollama.ndjson(obj))

        async with child_calls.stream(self.services.children, timed.lease, req) as exchange:
            if not child_calls.is_event_stream(exchange):
                payload = await child_calls.error_body(exchange)
                engine_error(exchange.status, payload, req)
            response = web.StreamResponse(
                headers={
                    "Content-Type": NDJSON,
                    "Cache-Control": "no-cache",
                    TRACE: trace_id(request),
                }
            )
            await response.prepare(request)
            try:
                async for data in child_calls.events(exchange):
                    state.created_at = now_rfc3339()
                    state.total_duration = timed.total()
                    for obj in feed(data, state):
                        await write(response, obj)
                state.total_duration = timed.total()
                for obj in ollama.finish_stream(state):
                    await write(response, obj)
            except UpstreamError as exc:  # the engine failed mid-stream
                failed = child_calls.child_failed(state.model, exc)
                if (trace := current()) is not None:
                    trace.failed(failed.status, failed.message, failed.code)
                with contextlib.suppress(ConnectionError):
                    error = OLLAMA.body(failed.status, failed.message, None)
                    await response.write(ollama.ndjson(error))
            except ConnectionError:  # the client went away; leaving closes the engine request
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response

    # -- embeddings -------------------------------------------------------------------

    async def _embed(self, request: web.Request, *, legacy: bool) -> web.StreamResponse:
        def build(body: dict[str, Any], runtime: ModelRuntime) -> EngineRequest | LoadOnly:
            pipeline.require(runtime, pipeline.EMBEDDINGS)
            translate = ollama.embeddings_request if legacy else ollama.embed_request
            return translate(body, model_ctx=runtime.ctx)

        async def answer(
            request: web.Request, timed: Timed, req: EngineRequest, model: str
        ) -> web.StreamResponse:
            status, payload = await child_calls.call(self.services.children, timed.lease, req)
            if status != 200 or not isinstance(payload, dict):
                engine_error(status, payload)
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

        return await self._run(request, build, pipeline.EMBEDDINGS, answer)


class Context:
    """A templated `/api/generate`'s `context`: the tokens of the conversation so far.

    `request` puts the tokens a client sent back in front of the newly rendered
    messages (a `/completion` prompt may mix token ids and text); `finish` adds to
    the final object the tokens of everything the model has now seen and said, as
    ollama returns them (the prompt rendered by the template, then the answer)."""

    def __init__(self, services: Services, timed: Timed, req: EngineRequest) -> None:
        self.children, self.lease = services.children, timed.lease
        self.messages = req.hints["messages"]
        self.earlier: list[int] = list(req.hints.get("context") or [])
        self.req = req
        self.rendered: str | None = None

    async def _rendered(self) -> str:
        if self.rendered is None:
            self.rendered = await child_calls.apply_template(
                self.children, self.lease, self.messages
            )
        return self.rendered

    async def request(self) -> EngineRequest:
        if not self.earlier:
            return self.req
        prompt = [*self.earlier, await self._rendered()]
        return EngineRequest(self.req.path, {**self.req.body, "prompt": prompt}, self.req.stream)

    async def finish(self, final: dict[str, Any], said: str) -> dict[str, Any]:
        tokens = await child_calls.tokenize(
            self.children, self.lease, await self._rendered() + said
        )
        return {**final, "context": [*self.earlier, *tokens]}
