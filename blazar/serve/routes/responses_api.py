"""OpenAI's Responses API on the gateway: `POST /v1/responses`, and what it cannot find.

A request is validated and translated by `blazar.protocols.openai_responses`
into a `/v1/chat/completions` request (docs/compatibility.md says why not the
engine's own `/v1/responses`), takes the gateway's one request path
(`blazar.serve.request.pipeline`: resolve, require a chat template, and tools or
thinking when the request uses them, lease), and the engine's answer is built
back into a Response, whole or as the Responses event stream
(`blazar.protocols.openai_responses_stream`).

The gateway keeps the newest responses in memory (`Recent`: at most
RECENT_COUNT of them and RECENT_BYTES in all, until serve restarts), unless a
request says `store: false`: `GET`/`DELETE /v1/responses/{id}` and its
`input_items` read them, and `previous_response_id` continues one (its whole
conversation is put before the new `input`), and `POST /v1/responses/{id}`
replaces its `metadata` (`blazar_sdk`'s `metadata_update`). Each is readable only
with the key that made it. `cancel` is for background responses, which Blazar refuses to
make. Failures are raised and answered in
OpenAI's envelope by the gateway's error middleware; a child that fails
mid-stream gets an `error` event.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import LoadOnly, ProtocolError, openai_requests, openai_responses
from blazar.protocols.openai_responses import ResponsesRequest, responses_request
from blazar.protocols.openai_responses_stream import ResponseStream, response_object
from blazar.protocols.sse import encode
from blazar.serve.http import KEY_NAME, parse_json_object, read_json
from blazar.serve.request import images
from blazar.serve.request.asks import Answer, Answering, Ask, Plan
from blazar.serve.request.envelopes import OPENAI
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import ModelRuntime
from blazar.serve.supervisor.scheduler import Target
from specs.serving import Serving

NO_TEMPLATE_HINT = "use /v1/completions, or "
RECENT_COUNT = 1000
RECENT_BYTES = 64 << 20
NOT_KEPT = (
    "no response '{id}' to {what}: it was made with store: false, deleted, made with "
    "another key, or is older than the {count} newest responses this gateway keeps in "
    "memory (until it restarts); send the whole conversation as input instead"
)
FINAL = ("response.completed", "response.incomplete", "response.failed")
HISTORY_ITEMS = ("message", "function_call", "function_call_output", "reasoning")


@dataclass
class Kept:
    """A stored response: what was asked (`items`), the whole conversation it answered
    (`history`: a continuation's earlier turns, then `items`), its owner and its size."""

    owner: str | None
    response: dict[str, Any]
    items: list[dict[str, Any]]
    history: list[dict[str, Any]]
    size: int

    def conversation(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: the history and the output."""
        output = [i for i in self.response.get("output") or [] if i.get("type") in HISTORY_ITEMS]
        return [*self.history, *output]


class Recent:
    """The newest responses, in memory: at most `count`, `size` bytes of JSON in all."""

    def __init__(self, count: int = RECENT_COUNT, size: int = RECENT_BYTES) -> None:
        self.count, self.size = count, size
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def keep(
        self,
        owner: str | None,
        response: dict[str, Any],
        items: list[dict[str, Any]],
        history: list[dict[str, Any]],
    ) -> None:
        size = len(orjson.dumps([response, history], default=str))
        if size > self.size:
            return  # larger than everything kept together: not kept
        self._kept[response["id"]] = Kept(owner, response, items, history, size)
        self._bytes += size
        while len(self._kept) > self.count or self._bytes > self.size:
            _, gone = self._kept.popitem(last=False)
            self._bytes -= gone.size

    def find(self, response_id: str, owner: str | None) -> Kept | None:
        kept = self._kept.get(response_id)
        return kept if kept is not None and kept.owner == owner else None

    def set_metadata(self, kept: Kept, metadata: dict[str, str]) -> None:
        """Replace a kept response's metadata; it counts as the newest, at its new size."""
        kept.response["metadata"] = metadata
        size = len(orjson.dumps([kept.response, kept.history], default=str))
        self._bytes += size - kept.size
        kept.size = size
        self._kept.move_to_end(kept.response["id"])
        while self._bytes > self.size and len(self._kept) > 1:
            _, gone = self._kept.popitem(last=False)
            self._bytes -= gone.size

    def drop(self, response_id: str, owner: str | None) -> bool:
        if self.find(response_id, owner) is None:
            return False
        self._bytes -= self._kept.pop(response_id).size
        return True


def register(app: web.Application, services: Services) -> None:
    """Add the Responses routes to the gateway's app."""
    api = ResponsesAPI(services)
    app.router.add_post("/v1/responses", services.route(api.asker()))
    app.router.add_get("/v1/responses/{id}", api.retrieve)
    app.router.add_post("/v1/responses/{id}", api.update)
    app.router.add_delete("/v1/responses/{id}", api.delete)
    app.router.add_get("/v1/responses/{id}/input_items", api.input_items)
    app.router.add_post("/v1/responses/{id}/cancel", api.cancel)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _event(event: dict[str, Any]) -> bytes:
    return encode(event, str(event["type"]))


class ResponsesAPI:
    """The Responses handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.recent = Recent()

    def _kept(self, request: web.Request, what: str, response_id: str | None = None) -> Kept:
        rid = response_id or request.match_info["id"]
        kept = self.recent.find(rid, request.get(KEY_NAME))
        if kept is None:
            message = NOT_KEPT.format(id=rid, what=what, count=self.recent.count)
            raise ProtocolError(404, message, "response_not_found")
        return kept

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("stream") not in (None, "false"):
            raise ProtocolError(
                400,
                "stream: replaying a stored response as events is not supported; "
                "GET it without stream",
                "invalid_request_error",
            )
        kept = self._kept(request, "read")
        return web.json_response(kept.response, headers=OPENAI.headers(request))

    async def delete(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["id"]
        self._kept(request, "delete")
        self.recent.drop(rid, request.get(KEY_NAME))
        body = {"id": rid, "object": "response", "deleted": True}
        return web.json_response(body, headers=OPENAI.headers(request))

    async def update(self, request: web.Request) -> web.StreamResponse:
        """`{"metadata": {...}}` replaces a stored response's metadata (OpenAI's bounds)."""
        kept = self._kept(request, "update")
        body = await read_json(request)
        if set(body) != {"metadata"}:
            raise ProtocolError(
                400,
                'send {"metadata": {KEY: VALUE, ...}}: only metadata can be updated',
                "invalid_request_error",
            )
        self.recent.set_metadata(kept, openai_responses.check_metadata(body["metadata"]))
        return web.json_response(kept.response, headers=OPENAI.headers(request))

    async def input_items(self, request: web.Request) -> web.StreamResponse:
        kept = self._kept(request, "list the input items of")
        query = request.query
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ProtocolError(400, "order: expected asc or desc", "invalid_request_error")
        raw_limit = query.get("limit", "20")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
            raise ProtocolError(
                400, "limit: expected a whole number from 1 to 100", "invalid_request_error"
            )
        items = kept.items if order == "asc" else kept.items[::-1]
        after = query.get("after")
        if after is not None:
            ids = [i.get("id") for i in items]
            if after not in ids:
                raise ProtocolError(
                    400,
                    f"after: no input item '{after}' in this response",
                    "invalid_request_error",
                )
            items = items[ids.index(after) + 1 :]
        page = items[: int(raw_limit)]
        body = {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }
        return web.json_response(body, headers=OPENAI.headers(request))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        self._kept(request, "cancel")
        raise ProtocolError(
            400,
            "only background responses can be cancelled, and Blazar makes none: this "
            "one has finished",
            "invalid_request_error",
        )

    def asker(self) -> Any:
        async def ask(request: web.Request) -> Ask:
            body = parse_json_object(await request.read())
            req = responses_request(body)  # the request as sent is valid, or a 400 before all
            items = openai_responses.input_items(body, _item_id)
            history = items
            previous = body.get("previous_response_id")
            if isinstance(previous, str):
                earlier = self._kept(request, "continue", previous).conversation()
                history = [*earlier, *items]
                req = responses_request({**body, "input": history})
            owner = request.get(KEY_NAME)

            def keep(response: dict[str, Any]) -> None:  # before the client can see it ends
                if response.get("store"):
                    self.recent.keep(owner, response, items, history)

            has_images = bool(openai_requests.image_refs(req.engine.body))
            return ResponsesAsk(
                str(body["model"]),
                "/v1/responses",
                body,
                hint=NO_TEMPLATE_HINT,
                req=req,
                keep=keep,
                images=has_images,
            )

        return ask


class ResponsesAnswer(Answer):
    """The engine's chat answer built into a Response, whole or as its event stream."""

    def __init__(
        self, answering: Answering, req: ResponsesRequest, keep: Callable[[dict[str, Any]], None]
    ) -> None:
        super().__init__(answering)
        self.req, self.keep = req, keep
        self.response_id, self.created_at = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.state = ResponseStream(self.response_id, self.created_at, answering.model, req.echo)

    async def whole(self, payload: bytes) -> dict[str, Any]:
        out = response_object(
            orjson.loads(payload),
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.answering.model,
            echo=self.req.echo,
        )
        self.keep(out)
        return out

    def _send(self, events: list[dict[str, Any]]) -> bytes:
        for event in events:
            if event["type"] in FINAL:  # kept before the client sees the end
                self.keep(event["response"])
        return b"".join(_event(e) for e in events)

    def start(self) -> bytes:
        return self._send(self.state.start())

    def feed(self, data: Any) -> bytes:
        return self._send(self.state.feed(data))

    async def end(self) -> bytes:
        return self._send(self.state.finish())

    def error(self, failed: ProtocolError) -> bytes:
        return _event(self.state.error(failed.code or "server_error", failed.message))


@dataclass
class ResponsesAsk(Ask):
    """`POST /v1/responses`, translated onto the engine's chat endpoint."""

    req: ResponsesRequest | None = None
    keep: Callable[[dict[str, Any]], None] = field(default=lambda _: None)

    async def resolved(self, runtime: ModelRuntime, serving: Serving) -> None:
        """The user messages' images (now the chat's `image_url` parts) fetched and
        checked as chat's are; refused for a model without a projector."""
        req = self.req
        assert req is not None
        if not runtime.has_vision:
            raise ProtocolError(
                400,
                f"input_image: model '{self.model}' has no vision projector; declare one "
                f"(`blazar mmproj {runtime.name} SOURCE`), use a model served with one, or "
                "send text only",
                "invalid_request_error",
            )
        _, body = await images.openai_body(serving, True, b"", req.engine.body)
        self.req = replace(req, engine=replace(req.engine, body=body))

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        return self.openai(runtime)

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        req, keep = self.req, self.keep
        assert req is not None
        return Plan(req.engine, lambda answering: ResponsesAnswer(answering, req, keep), req.needs)
