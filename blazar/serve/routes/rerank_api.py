"""Rerank on the gateway: `POST /v1/rerank` and `/rerank` (llama-server's two spellings),
in the shape llama-server, Cohere and Jina clients use.

A model declared `pooling = "rank"` (with `embeddings = true`) runs a child started with
`--embeddings --pooling rank`, whose own `/v1/rerank` scores each document against the
query. The route parses the body into a `RerankAsk`; the pipeline does the rest as for
every model route (resolve, the key's models, the queue, the trace, the metrics): it
refuses (400) a model that is not a reranker, saying to declare `pooling = "rank"`
(`steps.require`, need `RERANK`). The request is checked and the answer shaped by
`blazar.protocols.rerank`: results best first, cut to `top_n`, documents when
`return_documents`, `usage` in tokens. An engine that speaks only OpenAI's API (a
remote vLLM, LiteLLM or LocalAI, which serve `/v1/rerank` too) gets the same request.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import EngineRequest, LoadOnly, rerank
from blazar.serve.http import parse_json_object
from blazar.serve.request import steps
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target

PATHS = ("/v1/rerank", "/rerank")


class RerankAnswer(Answer):
    """The engine's scores -> the client's results (`rerank.rerank_response`)."""

    content_type = "application/json"

    def __init__(self, answering: Answering, engine: EngineRequest) -> None:
        super().__init__(answering)
        self.engine = engine

    async def whole(self, payload: bytes) -> dict[str, Any]:
        return rerank.rerank_response(
            orjson.loads(payload),
            self.engine.hints,
            model=self.answering.model,
            id_=f"rerank-{uuid.uuid4().hex[:24]}",
        )


@dataclass
class RerankAsk(Ask):
    """A rerank request: checked when its plan is made, scored by the model's engine."""

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        return self._plan()

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        return self._plan()

    def _plan(self) -> Plan:
        engine = rerank.rerank_request(self.body)
        return Plan(engine, lambda answering: RerankAnswer(answering, engine))


async def ask(request: web.Request) -> Ask:
    """The client's body -> a `RerankAsk` (its fields are checked by the plan)."""
    raw = await request.read()
    body = parse_json_object(raw)
    model = body.get("model")
    return RerankAsk(
        model if isinstance(model, str) else "", request.path, body, raw, need=steps.RERANK
    )


def register(app: web.Application, services: Services) -> None:
    """Add the rerank routes to the gateway's app, through the one pipeline."""
    for path in PATHS:
        app.router.add_post(path, services.route(ask))
