"""OpenAI's API on the gateway: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`
and `/v1/models` (`/v1/responses` is translated, in `responses_api`).

Requests pass through to the engine, bytes untouched where nothing must change: the
body is parsed once (`http.parse_json_object`, which refuses bodies nested too deep
and numbers JSON does not allow) to read `model` and to check it
(`openai_requests.shape_request`: what the engine would accept and then ignore is
refused, a request for tools needs a template that has them), and it is re-encoded
only when the engine must be asked differently, adapters or model defaults apply, the
preflight caps the output or the sessions name a slot (the pipeline decides). The few
answers that differ from OpenAI's (legacy completions: `cmpl-` ids, legacy
`logprobs`, `echo`) are reshaped on the way back (`openai_completions`), and the
answer names the model as the client asked for it (`tiny+fox`, an alias), not as
the engine calls it. Everything else is the pipeline's (`blazar.serve.request.pipeline`):
streams copied chunk by chunk, a client that disconnects cancelling the engine's
request, singleflight for identical deterministic requests (`serving.singleflight`),
failures in OpenAI's envelope. docs/performance.md says what this path costs.

`/v1/models` answers in Anthropic's shapes for a request with `anthropic-version`
(`blazar.protocols.model_lists`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, model_lists
from blazar.protocols.openai_completions import (
    IdRenamer,
    Renamer,
    ReplyStream,
    model_renamer,
    reshape_body,
)
from blazar.protocols.openai_requests import Reply, shape_request
from blazar.serve.http import parse_json_object
from blazar.serve.request import images, steps
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.request.envelopes import ANTHROPIC, wants_anthropic
from blazar.serve.request.grants import sees
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target
from specs.serving import Serving

ROUTES = (
    ("/v1/chat/completions", steps.CHAT),
    ("/v1/completions", steps.ANY),
    ("/v1/embeddings", steps.EMBEDDINGS),
)
NO_TEMPLATE_HINT = "use /v1/completions, or "


def own_id(payload: bytes) -> bytes:
    """An answer shared by singleflight, under a new id of the same kind (chatcmpl-...,
    cmpl-... for a legacy completion)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return payload
    prefix = data["id"].split("-", 1)[0] if "-" in data["id"] else "chatcmpl"
    return json.dumps({**data, "id": f"{prefix}-{uuid.uuid4().hex[:24]}"}).encode()


class OpenAIAnswer(Answer):
    """The engine's OpenAI answer, passed through: reshaped only where it must be."""

    content_type = None  # the engine's
    raw = True

    def __init__(self, answering: Answering, reply: Reply | None, served: str) -> None:
        super().__init__(answering)
        self.reply = reply
        self.rename = answering.model != served
        self.served = served
        self.rewrites = reply is not None or self.rename
        self.rewriter: ReplyStream | Renamer | None = None
        if reply is not None:
            self.rewriter = ReplyStream(reply) if reply.rewrites_events else IdRenamer()
        self.renamer = model_renamer(served, answering.model) if self.rename else None

    async def whole(self, payload: bytes) -> bytes:
        if self.reply is not None:
            payload = reshape_body(payload, self.reply)
        if self.answering.shared:  # once reshaped: a legacy completion's id is cmpl- by then
            payload = own_id(payload)
        if self.renamer is not None:
            payload = self.renamer.feed(payload) + self.renamer.close()
        return payload

    def feed_bytes(self, chunk: bytes) -> bytes:
        if self.rewriter is not None:
            chunk = self.rewriter.feed(chunk)
        return self.renamer.feed(chunk) if self.renamer is not None else chunk

    async def end(self) -> bytes:
        tail = self.rewriter.close() if self.rewriter is not None else b""
        if self.renamer is not None:
            tail = self.renamer.feed(tail) + self.renamer.close()
        return tail


@dataclass
class OpenAIAsk(Ask):
    """A pass-through request: the body is the engine's, nearly always as it came."""

    async def resolved(self, runtime: ModelRuntime, serving: Serving) -> None:
        raw = self.raw if self.raw is not None else b""
        self.raw, self.body = await images.openai_body(serving, runtime.has_vision, raw, self.body)

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        shaping = shape_request(self.path, self.body, has_vision=runtime.has_vision)
        body = shaping.body if shaping.body is not None else self.body
        engine = EngineRequest(self.path, body, body.get("stream") is True)
        reply, served = shaping.reply, runtime.name
        return Plan(engine, lambda answering: OpenAIAnswer(answering, reply, served), shaping.needs)

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        """An OpenAI-only engine gets the client's request as it came."""
        engine = EngineRequest(self.path, self.body, self.body.get("stream") is True)
        served = runtime.name if runtime is not None else self.model
        return Plan(engine, lambda answering: OpenAIAnswer(answering, None, served))


def register(app: web.Application, services: Services) -> None:
    """Add the OpenAI routes to the gateway's app."""
    api = OpenAIAPI(services)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/v1/models/{model:.+}", api.model)
    for path, need in ROUTES:
        app.router.add_post(path, services.route(api.asker(path, need)))


class OpenAIAPI:
    """The handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def asker(self, path: str, need: str) -> Any:
        hint = NO_TEMPLATE_HINT if need == steps.CHAT else ""

        async def ask(request: web.Request) -> Ask:
            raw = await request.read()
            body = parse_json_object(raw)
            model = body.get("model")
            return OpenAIAsk(
                model if isinstance(model, str) else "",
                path,
                body,
                raw,
                need=need,
                hint=hint,
                shareable=True,
                images=b"image" in raw,
            )

        return ask

    def _names(self, request: web.Request) -> list[model_lists.ServedName]:
        runtimes = self.services.scheduler.runtimes
        names = [
            model_lists.ServedName(name, runtime.slot_ctx)
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
