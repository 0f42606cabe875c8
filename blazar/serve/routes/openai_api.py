"""OpenAI's API on the gateway: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`
and `/v1/models` (`/v1/responses` is translated, in `responses_api`).

Requests are passed through to the instance the scheduler picks, bytes
untouched: the body is parsed once (`http.parse_json_object`, which refuses
bodies nested too deep and numbers JSON does not allow) to read `model` and to
check it (`openai_requests.shape_request`: what the engine would accept and
then ignore is refused, a request for tools needs a template that has them),
and re-encoded only when the engine must be asked differently or LoRA adapters
are on for the request (`model+adapter`, or the model's always-on ones) and need
its `lora` field, or model defaults apply (`pipeline.engine_body`). The
few answers that differ from OpenAI's (legacy completions: `cmpl-` ids, legacy
`logprobs`, `echo`) are reshaped on the way back (`openai_completions`). They
travel on `ChildConnections` (`blazar.serve.supervisor.child_http`), kept for this hot
path: keep-alive connections to each child, and a response parsed as it
arrives. Streams are copied chunk by chunk as they arrive; a client that
disconnects cancels the handler (`handler_cancellation`), which closes the
upstream connection, which makes llama-server stop generating.
docs/performance.md says what this costs and why it is built this way.

The request's trace (`blazar.observe.trace`) gets references to the body and
the answer's bytes, and a clock reading per chunk; they are read once the answer
is gone (`blazar.serve.state.tracing`), or at once for serving.sentinel_enforce.

`keep_alive` (a body field, or the `x-blazar-keep-alive` header) is honoured as on
ollama's routes. After the lease, `pipeline.admit` runs the prompt preflight and the
sessions' slot routing; it counts nothing for a body whose size proves it fits, so
the bytes stay untouched unless a slot must be named. With `serving.singleflight`,
identical concurrent deterministic requests share one engine call (`_shared`).

Failures before any byte is sent are raised and answered in OpenAI's envelope
by the gateway's error middleware; a child that fails mid-stream gets an error
event, since the headers are gone. An engine 500 that is the client's mistake
(a message it could not parse) is answered as a 400, since SDKs retry a 5xx.

`/v1/models` answers in Anthropic's shapes for a request with `anthropic-version`
(`blazar.protocols.model_lists`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from blazar.observe.trace import current
from blazar.protocols import ProtocolError, model_lists
from blazar.protocols.openai_completions import IdRenamer, ReplyStream, reshape_body
from blazar.protocols.openai_requests import Reply, Shaping, engine_refusal, shape_request
from blazar.serve.http import TRACE, parse_json_object, trace_id
from blazar.serve.request import images, pipeline
from blazar.serve.request.child_calls import child_failed, gate
from blazar.serve.request.envelopes import ANTHROPIC, OPENAI, wants_anthropic
from blazar.serve.request.grants import sees
from blazar.serve.request.singleflight import deterministic
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.child_http import Exchange, UpstreamError
from blazar.serve.supervisor.scheduler import Lease, Target

ROUTES = (
    ("/v1/chat/completions", pipeline.CHAT),
    ("/v1/completions", pipeline.ANY),
    ("/v1/embeddings", pipeline.EMBEDDINGS),
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
    app.router.add_get("/v1/models/{model:.+}", api.model)
    for path, need in ROUTES:
        app.router.add_post(path, api.route(path, need))


class OpenAIAPI:
    """The pass-through handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def _names(self, request: web.Request) -> list[model_lists.ServedName]:
        runtimes = self.services.scheduler.runtimes
        names = [
            model_lists.ServedName(name, runtime.ctx)
            for runtime in runtimes.values()
            if sees(request, runtime.name, runtime.aliases)  # a key lists only its models
            for name in (runtime.name, *runtime.aliases, *runtime.variants)
        ]
        local = {n.name for n in names} | {f"{n.name}:latest" for n in names}
        for name, remote in self.services.fleet.listing(lambda n: n in local):
            if sees(request, name, ()):
                names.append(model_lists.ServedName(name, 0, remote=remote.name))
        return names

    def _created_at(self) -> str:
        return (
            datetime.fromtimestamp(int(self.services.started), UTC)
            .isoformat()
            .replace("+00:00", "Z")
        )

    async def models(self, request: web.Request) -> web.Response:
        if wants_anthropic(request):
            page = model_lists.anthropic_page(
                self._names(request), self._created_at(), request.query
            )
            return web.json_response(page, headers=ANTHROPIC.headers(request))
        return web.json_response(
            model_lists.openai_list(self._names(request), int(self.services.started))
        )

    async def model(self, request: web.Request) -> web.Response:
        """One model by the name it is served under (`models.retrieve`); 404 if none."""
        wanted = request.match_info["model"]
        found = next((n for n in self._names(request) if n.name == wanted), None)
        if found is None:
            served = ", ".join(sorted(n.name for n in self._names(request))) or "none"
            raise ProtocolError(
                404, f"model '{wanted}' not found; models served here: {served}", "model_not_found"
            )
        if wants_anthropic(request):
            body = model_lists.anthropic_model(found, self._created_at())
            return web.json_response(body, headers=ANTHROPIC.headers(request))
        return web.json_response(model_lists.openai_model(found, int(self.services.started)))

    def route(self, path: str, need: str) -> pipeline.Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.proxy(request, path, need)

        return handler

    async def proxy(self, request: web.Request, path: str, need: str) -> web.StreamResponse:
        body = await request.read()
        data = parse_json_object(body)
        scheduler = self.services.scheduler
        target = pipeline.resolve(scheduler, data.get("model"), request)
        pipeline.require(target.runtime, need, alternative=NO_TEMPLATE_HINT)
        vision = target.runtime.has_vision
        body, data = await images.openai_body(self.services.serving, vision, body, data)
        shaping = shape_request(path, data, has_vision=vision)
        for extra in shaping.needs:
            pipeline.require(target.runtime, extra, requested=data["model"])
        seconds = pipeline.keep_alive(request, data)
        if target.runtime.singleflight and deterministic(data):
            return await self._shared(request, target, path, body, data, seconds, shaping)
        timed = await pipeline.lease(scheduler, request, target, keep_alive=seconds)
        if (trace := current()) is not None:
            trace.sending(path, data)
        try:
            body = await self._admitted(timed.lease, path, body, data, shaping)
            return await self._forward(
                request, timed.lease.url, target.runtime.name, path, body, shaping.reply
            )
        finally:
            scheduler.release(timed.lease, keep_alive=seconds)

    async def _admitted(
        self, lease: Lease, path: str, body: bytes, data: dict[str, Any], shaping: Shaping
    ) -> bytes:
        """The bytes to send: as they came, unless the request must be asked differently
        (`shape_request`), adapters or model defaults added, or a slot named (sessions)."""
        services = self.services
        slot = await pipeline.admit(
            services.prompts, services.sessions, lease, path, data, len(body)
        )
        asked = shaping.body if shaping.body is not None else data
        sent = pipeline.engine_body(lease, asked, path)
        if sent is data and slot is None:
            return body  # the common case: the client's bytes as they came
        return json.dumps(sent if slot is None else {**sent, "id_slot": slot}).encode()

    async def _shared(
        self,
        request: web.Request,
        target: Target,
        path: str,
        body: bytes,
        data: dict[str, Any],
        seconds: float | None,
        shaping: Shaping,
    ) -> web.Response:
        """Singleflight: one engine call for identical concurrent deterministic requests;
        each client after the first gets the answer under an id of its own."""
        scheduler, model = self.services.scheduler, target.runtime.name

        async def call() -> tuple[int, str, bytes]:
            timed = await pipeline.lease(scheduler, request, target, keep_alive=seconds)
            try:
                sent = await self._admitted(timed.lease, path, body, data, shaping)
                return await self._fetch(timed.lease.url, model, path, sent)
            finally:
                scheduler.release(timed.lease, keep_alive=seconds)

        key = (model, pipeline.adapters_text(target), target.replica, path, body)
        (status, content_type, payload), leader = await self.services.singleflight.share(key, call)
        if not leader and status == 200:
            payload = own_id(payload)
        return self._whole(request, status, content_type, payload, shaping.reply)

    async def _fetch(self, base: str, model: str, path: str, body: bytes) -> tuple[int, str, bytes]:
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

    def _whole(
        self,
        request: web.Request,
        status: int,
        content_type: str,
        payload: bytes,
        reply: Reply | None,
    ) -> web.Response:
        """A whole answer: reshaped if it must be; an engine 5xx that is the client's
        mistake as a 400."""
        if status >= 400:
            refusal = engine_refusal(status, _decoded(payload))
            if refusal is not None:
                raise ProtocolError(400, refusal, "invalid_request_error")
        elif status == 200 and reply is not None:
            payload = reshape_body(payload, reply)
        return web.Response(
            body=payload,
            status=status,
            headers={"Content-Type": content_type, TRACE: trace_id(request)},
        )

    async def _forward(
        self,
        request: web.Request,
        base: str,
        model: str,
        path: str,
        body: bytes,
        reply: Reply | None = None,
    ) -> web.StreamResponse:
        children = self.services.children
        exchange: Exchange | None = None
        response: web.StreamResponse | None = None
        trace = current()
        try:
            exchange = await children.post(base, path, body)
            content_type = exchange.content_type or "application/json"
            if not content_type.startswith("text/event-stream"):
                payload = await exchange.read_all()
                if trace is not None:  # read when the answer is gone, or now to enforce
                    trace.answered(payload, exchange.status)
                    gate(exchange.status)
                return self._whole(request, exchange.status, content_type, payload, reply)
            response = web.StreamResponse(
                status=exchange.status,
                headers={
                    "Content-Type": content_type,
                    "Cache-Control": "no-cache",
                    TRACE: trace_id(request),
                },
            )
            await response.prepare(request)
            if reply is None:
                while chunk := await exchange.read():
                    await response.write(chunk)
                    if trace is not None:
                        trace.chunk(chunk)
            else:
                rewriter = ReplyStream(reply) if reply.rewrites_events else IdRenamer()
                while chunk := await exchange.read():
                    if trace is not None:
                        trace.chunk(chunk)
                    if out := rewriter.feed(chunk):
                        await response.write(out)
                if tail := rewriter.close():
                    await response.write(tail)
            await response.write_eof()
            return response
        except (UpstreamError, ConnectionError) as exc:
            failed = child_failed(model, exc)
            if response is None or not response.prepared:
                raise failed from None
            if trace is not None:
                trace.failed(failed.status, failed.message, failed.code)
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


def _decoded(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None
