"""Anthropic's Messages API on the gateway: `POST /v1/messages` and `/v1/messages/count_tokens`.

As decided in docs/compatibility.md, requests pass through to the instance's native
`/v1/messages` (llama-server speaks Anthropic's shapes there), except those with LoRA
adapters on or model defaults that endpoint would drop: they go to its chat endpoint
through `blazar.protocols.anthropic_chat`, as they do for an engine or remote that
speaks only OpenAI's API. `blazar.protocols.anthropic` validates them as Anthropic's
API does (refusing what the engine would accept wrongly, such as a request without
`max_tokens`) and normalizes what comes back, whole or event by event. Each request
takes the gateway's one request path (`blazar.serve.request.pipeline`: slots, queue,
`x-blazar-priority`, keep_alive, the preflight; tools need a template that renders
them); `count_tokens` too, since the model's own tokenizer and chat template count.
Failures are answered as Anthropic's `{"type": "error", "error": {...}}`: 404
not_found_error, 400 invalid_request_error, 503 overloaded_error with `Retry-After`,
502 api_error when a child fails.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError, anthropic, anthropic_chat
from blazar.serve.http import parse_json_object
from blazar.serve.request import images, steps
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.request.envelopes import ANTHROPIC
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target
from specs.serving import Serving


def register(app: web.Application, services: Services) -> None:
    """Add the Anthropic routes to the gateway's app."""
    app.router.add_post("/v1/messages", services.route(_asker(count=False)))
    app.router.add_post("/v1/messages/count_tokens", services.route(_asker(count=True)))


def _asker(*, count: bool) -> Any:
    path = "/v1/messages/count_tokens" if count else "/v1/messages"

    async def ask(request: web.Request) -> Ask:
        raw = await request.read()
        body = parse_json_object(raw)
        translate = anthropic.count_tokens_request if count else anthropic.messages_request
        # Valid as Anthropic's API says, or a 400 before all; images are checked against
        # the model once it is known (`resolved`).
        req = translate(body, has_vision=True)
        return MessagesAsk(
            str(body["model"]), path, body, envelope=ANTHROPIC, req=req, images=b"image" in raw
        )

    return ask


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


class MessagesAnswer(Answer):
    """The engine's answer as Anthropic's message, whole or as its events; `bridged`: the
    engine answered a chat completion (its chat endpoint, or an OpenAI-only upstream)."""

    def __init__(self, answering: Answering, *, count: bool, bridged: bool) -> None:
        super().__init__(answering, ANTHROPIC)
        self.count, self.bridged = count, bridged
        self.message_id = message_id()
        self.state = anthropic.StreamState(model=answering.model, message_id=self.message_id)
        self.events = anthropic_chat.ChatEvents() if bridged else None

    async def whole(self, payload: bytes) -> dict[str, Any]:
        data = orjson.loads(payload)
        out: dict[str, Any] = anthropic_chat.message_from_chat(data) if self.bridged else data
        if self.count:
            return out
        return anthropic.message_response(
            out, model=self.answering.model, message_id=self.message_id
        )

    def feed(self, data: Any) -> bytes:
        items = self.events.feed(data) if self.events is not None else [data]
        return b"".join(
            anthropic.sse(event)
            for item in items
            for event in anthropic.stream_events(item, self.state)
        )

    async def end(self) -> bytes:
        return b"".join(anthropic.sse(event) for event in anthropic.finish_stream(self.state))


@dataclass
class MessagesAsk(Ask):
    """`/v1/messages` or `/v1/messages/count_tokens`, validated."""

    req: EngineRequest | None = None

    @property
    def counting(self) -> bool:
        return self.path.endswith("count_tokens")

    def _plan(self, req: EngineRequest, bridged: bool) -> Plan:
        count = self.counting
        return Plan(
            req,
            lambda answering: MessagesAnswer(answering, count=count, bridged=bridged),
            anthropic.needs(self.body),
        )

    async def resolved(self, runtime: ModelRuntime, serving: Serving) -> None:
        assert self.req is not None
        self.req = await images.anthropic_request(serving, runtime.has_vision, self.req)

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        assert self.req is not None
        # The engine's /v1/messages would drop a `lora` list and most sampling defaults:
        # requests that need them go to its chat endpoint instead (`anthropic_chat`).
        bridged = not self.counting and (
            runtime.lora_field(target.adapters) is not None
            or any(k not in steps.MESSAGES_PARAMS for k in runtime.params)
        )
        req = anthropic_chat.chat_request(self.req) if bridged else self.req
        return self._plan(req, bridged)

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        if self.counting:
            raise ProtocolError(
                400,
                f"{self.path} is not offered by an engine or remote that speaks only "
                "OpenAI's API: count tokens on a Blazar or llama-server",
            )
        made = anthropic.messages_request(self.body, has_vision=True)
        return self._plan(anthropic_chat.chat_request(made), bridged=True)
