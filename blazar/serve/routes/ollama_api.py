"""ollama's inference API on the gateway: `/api/chat`, `/api/generate`, `/api/embed(dings)`.

`register` adds these routes (the model management routes are in `ollama_admin` and
`ollama_pull`). A request is translated by `blazar.protocols.ollama` into an `Ask`,
which takes the gateway's one request path (`blazar.serve.request.pipeline`), and the
engine's answer is translated back, whole or as NDJSON lines; the final object's
statistics come from the engine's timings plus the load and total durations measured
on the way.

A templated `/api/generate` answers with `context`, the token ids of the conversation
so far (the rendered prompt and the answer, from the child's `/apply-template` and
`/tokenize`, helper calls that are not traced as the request's exchange), as ollama
does; a request that sends one back continues after those tokens. Tools and thinking
need a template that has them (`"<model>" does not support tools`); `suffix` on a
model without fill-in-the-middle tokens is `"<model>" does not support insert`.

`keep_alive` (the body's, or the `x-blazar-keep-alive` header) goes to the scheduler
when the lease is released (-1 keeps the model loaded). A request with nothing to
generate loads the model, or with `keep_alive: 0` unloads it at once (as ollama does,
without loading it first). For an engine or remote that speaks only OpenAI's API,
chat and generate go through `/v1/chat/completions` (`openai`). Failures are answered
as ollama's `{"error": "..."}`; 503s carry `Retry-After`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, ollama
from blazar.serve.http import name_in, now_rfc3339, parse_json_object
from blazar.serve.request import images, steps
from blazar.serve.request.asks import Answer, Answering, Ask, Helpers, Plan
from blazar.serve.request.envelopes import OLLAMA
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target
from specs.serving import Serving

NDJSON = "application/x-ndjson"
RAW_HINT = "send raw: true with a fully formatted prompt, or "
BIG_CTX = 1 << 30  # an OpenAI-only upstream checks context sizes; nothing is refused here
Translate = Callable[..., EngineRequest | LoadOnly]


def register(app: web.Application, services: Services) -> None:
    """Add ollama's inference routes to the gateway's app."""
    for path, make in (
        ("/api/chat", _chat),
        ("/api/generate", _generate),
        ("/api/embed", _embed),
        ("/api/embeddings", _embeddings),
    ):
        app.router.add_post(path, services.route(_asker(path, make)))


def _asker(path: str, make: Callable[[str, dict[str, Any]], Ask]) -> Any:
    async def ask(request: web.Request) -> Ask:
        raw = await request.read()
        made = make(path, parse_json_object(raw))
        made.images = b"image" in raw
        return made

    return ask


def _chat(path: str, body: dict[str, Any]) -> Ask:
    return GenerateAsk(name_in(body, "model"), path, body, envelope=OLLAMA, endpoint="chat")


def _generate(path: str, body: dict[str, Any]) -> Ask:
    return GenerateAsk(
        name_in(body, "model"), path, body, envelope=OLLAMA, endpoint="generate", hint=RAW_HINT
    )


def _embed(path: str, body: dict[str, Any]) -> Ask:
    return EmbedAsk(name_in(body, "model"), path, body, envelope=OLLAMA, need=steps.EMBEDDINGS)


def _embeddings(path: str, body: dict[str, Any]) -> Ask:
    return EmbedAsk(
        name_in(body, "model"), path, body, envelope=OLLAMA, need=steps.EMBEDDINGS, legacy=True
    )


class Context:
    """A templated `/api/generate`'s `context`: the tokens of the conversation so far.

    `request` puts the tokens a client sent back in front of the newly rendered
    messages (a `/completion` prompt may mix token ids and text); `finish` adds to the
    final object the tokens of everything the model has now seen and said, as ollama
    returns them (the prompt rendered by the template, then the answer)."""

    def __init__(self, req: EngineRequest) -> None:
        self.req = req
        self.messages = req.hints["messages"]
        self.earlier: list[int] = list(req.hints.get("context") or [])
        self.rendered: str | None = None

    async def _rendered(self, child: Helpers) -> str:
        if self.rendered is None:
            self.rendered = await child.apply_template(self.messages)
        return self.rendered

    async def request(self, answering: Answering) -> EngineRequest:
        if not self.earlier or answering.child is None:
            return self.req
        prompt = [*self.earlier, await self._rendered(answering.child)]
        return EngineRequest(self.req.path, {**self.req.body, "prompt": prompt}, self.req.stream)

    async def finish(self, final: dict[str, Any], said: str, child: Helpers) -> dict[str, Any]:
        tokens = await child.tokenize(await self._rendered(child) + said)
        return {**final, "context": [*self.earlier, *tokens]}


class GenerateAnswer(Answer):
    """The engine's chat or completion answer as ollama's, whole or NDJSON lines."""

    content_type = NDJSON

    def __init__(
        self, answering: Answering, endpoint: str, req: EngineRequest, context: Context | None
    ) -> None:
        super().__init__(answering, OLLAMA)
        self.endpoint, self.req, self.context = endpoint, req, context
        self.state = ollama.StreamState(answering.model, now_rfc3339(), endpoint)
        self.state.load_duration = answering.load_ns
        self.chunks = ollama.chat_chunks if endpoint == "chat" else ollama.generate_chunks
        self.said: list[str] = []
        self.final: dict[str, Any] | None = None  # held until `end` completes it

    async def whole(self, payload: bytes) -> dict[str, Any]:
        data = orjson.loads(payload)
        translate = ollama.chat_response if self.endpoint == "chat" else ollama.generate_response
        out = translate(
            data,
            model=self.answering.model,
            created_at=now_rfc3339(),
            total_duration=self.answering.total(),
            load_duration=self.answering.load_ns,
        )
        if self.context is not None and self.answering.child is not None:
            out = await self.context.finish(out, str(out.get("response", "")), self.answering.child)
        return out

    def _lines(self, objects: list[dict[str, Any]]) -> bytes:
        out = []
        for obj in objects:
            if self.context is not None:
                if obj.get("done"):
                    self.final = obj
                    continue
                if isinstance(obj.get("response"), str):
                    self.said.append(obj["response"])
            out.append(ollama.ndjson(obj))
        return b"".join(out)

    def feed(self, data: Any) -> bytes:
        state = self.state
        state.created_at = now_rfc3339()
        state.total_duration = self.answering.total()
        return self._lines(self.chunks(data, state))

    async def end(self) -> bytes:
        self.state.total_duration = self.answering.total()
        out = self._lines(ollama.finish_stream(self.state))
        if self.final is not None and self.context is not None and self.answering.child is not None:
            final = await self.context.finish(self.final, "".join(self.said), self.answering.child)
            out += ollama.ndjson(final)
        return out

    def refusal(self, status: int, payload: Any) -> ProtocolError | None:
        if self.req.path == "/infill" and status == 501:
            return ProtocolError(
                400,
                f'"{self.answering.model}" does not support insert: its GGUF has no '
                "fill-in-the-middle tokens (suffix needs them); use a code model with FIM",
            )
        return None


@dataclass
class GenerateAsk(Ask):
    """`/api/chat` or `/api/generate`."""

    endpoint: str = "chat"

    def _translate(self, model_ctx: int, *, has_vision: bool) -> EngineRequest | LoadOnly:
        translate: Translate = (
            ollama.chat_request if self.endpoint == "chat" else ollama.generate_request
        )
        return translate(self.body, model_ctx=model_ctx, has_vision=has_vision)

    async def resolved(self, runtime: ModelRuntime, serving: Serving) -> None:
        await images.ollama_images(serving, runtime.has_vision, self.body)

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        req = self._translate(runtime.slot_ctx, has_vision=runtime.has_vision)
        if isinstance(req, LoadOnly):
            return req
        templated = "messages" in req.hints or req.path == "/v1/chat/completions"
        context = None
        if self.endpoint == "generate" and "messages" in req.hints:
            context = Context(req)
        endpoint = self.endpoint
        return Plan(
            req,
            lambda answering: GenerateAnswer(answering, endpoint, req, context),
            ollama.needs(self.body) if templated else (),
            need=steps.CHAT if templated else steps.ANY,
            prepare=context.request if context is not None and context.earlier else None,
        )

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        req = self._translate(runtime.ctx if runtime is not None else BIG_CTX, has_vision=True)
        if isinstance(req, LoadOnly):
            return req
        if req.path != "/v1/chat/completions":
            raise ProtocolError(
                400,
                "raw, suffix and context need llama-server's own endpoints, which an engine "
                "or remote that speaks only OpenAI's API does not offer; send messages to "
                "/api/chat instead",
            )
        endpoint = self.endpoint
        return Plan(
            req,
            lambda answering: GenerateAnswer(answering, endpoint, req, None),
            ollama.needs(self.body),
        )

    def loaded(self, load: LoadOnly, *, unloaded: bool) -> dict[str, Any]:
        return ollama.load_response(
            load, model=self.model, created_at=now_rfc3339(), unloaded=unloaded
        )


class EmbedAnswer(Answer):
    def __init__(self, answering: Answering, legacy: bool, dimensions: Any) -> None:
        super().__init__(answering, OLLAMA)
        self.legacy, self.dimensions = legacy, dimensions

    async def whole(self, payload: bytes) -> dict[str, Any]:
        data = orjson.loads(payload)
        if self.legacy:
            return ollama.embeddings_response(data)
        return ollama.embed_response(
            data,
            model=self.answering.model,
            total_duration=self.answering.total(),
            load_duration=self.answering.load_ns,
            dimensions=self.dimensions,
        )


@dataclass
class EmbedAsk(Ask):
    """`/api/embed` (or the legacy `/api/embeddings`)."""

    legacy: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        return self._plan(runtime.slot_ctx)

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        return self._plan(runtime.slot_ctx if runtime is not None else BIG_CTX)

    def _plan(self, model_ctx: int) -> Plan | LoadOnly:
        translate = ollama.embeddings_request if self.legacy else ollama.embed_request
        req = translate(self.body, model_ctx=model_ctx)
        if isinstance(req, LoadOnly):
            return req
        legacy, dimensions = self.legacy, req.hints.get("dimensions")
        return Plan(req, lambda answering: EmbedAnswer(answering, legacy, dimensions))

    def loaded(self, load: LoadOnly, *, unloaded: bool) -> dict[str, Any]:
        return ollama.load_response(
            load, model=self.model, created_at=now_rfc3339(), unloaded=unloaded
        )
