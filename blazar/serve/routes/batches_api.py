"""Anthropic's Message Batches API on the gateway: `/v1/messages/batches`.

- `POST /v1/messages/batches` (`{"requests": [{"custom_id", "params"}, ...]}`): every
  request's `params` is checked as `/v1/messages` checks it, and its model must be one
  this host serves that the request's key may use and that can answer it (a chat
  template, tools if it uses them); the first problem refuses the whole batch with a
  400 that names the request's custom_id. The batch is then queued
  (`blazar.serve.request.batches`) and answered as a `message_batch`.
- `GET /v1/messages/batches` (`limit`, `before_id`, `after_id`; newest first),
  `GET .../{id}`, `POST .../{id}/cancel`, `DELETE .../{id}` (an ended batch only),
  `GET .../{id}/results` (JSON Lines, once the batch has ended).

Each request runs as a `/v1/messages` request (`anthropic_api.MessagesAsk`, which is
why this module sits above that one) with no client waiting. With keys in use, a key
sees only its own batches. Errors come in Anthropic's envelope (the path is under
`/v1/messages`). Needs `blazar serve` (the store); without it, 501.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from blazar.protocols import LoadOnly, ProtocolError, anthropic
from blazar.protocols import anthropic_batches as shapes
from blazar.serve.http import KEY_NAME, parse_json_object
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.batch_store import BatchStore
from blazar.serve.request.batches import MessageBatches
from blazar.serve.request.envelopes import ANTHROPIC
from blazar.serve.request.grants import grant_of
from blazar.serve.routes.anthropic_api import MessagesAsk
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import Forward

PATH = "/v1/messages/batches"


def messages_ask(params: dict[str, Any]) -> Ask:
    """A batch request's params as the `/v1/messages` route would have made them."""
    req = anthropic.messages_request(params, has_vision=True)
    images = bool(anthropic.image_refs(params))
    return MessagesAsk(
        str(params["model"]), "/v1/messages", params, envelope=ANTHROPIC, req=req, images=images
    )


def register(app: web.Application, services: Services) -> None:
    """Add the batch routes; under `blazar serve`, the batches themselves."""
    api = BatchesAPI(services)
    app.router.add_post(PATH, api.create)
    app.router.add_get(PATH, api.list)
    app.router.add_get(PATH + "/{id}", api.retrieve)
    app.router.add_delete(PATH + "/{id}", api.delete)
    app.router.add_post(PATH + "/{id}/cancel", api.cancel)
    app.router.add_get(PATH + "/{id}/results", api.results)
    if services.control is not None:
        paths = services.control.paths
        batches = api.batches = MessageBatches(
            BatchStore(paths.db, paths.state / "apply.lock"),
            services.pipeline,
            messages_ask,
            in_flight=lambda: services.serving.batch_in_flight,
            expiry=lambda: services.serving.batch_expiry,
            retention=lambda: services.serving.batch_retention,
        )

        async def start(_: web.Application) -> None:
            await batches.start()

        app.on_startup.append(start)
        services.closing.append(batches.close)  # before the scheduler: queued ones stay


class BatchesAPI:
    """The handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.batches: MessageBatches | None = None

    def _batches(self) -> MessageBatches:
        if self.batches is None:
            raise ProtocolError(501, "message batches need `blazar serve`", "api_error")
        return self.batches

    @staticmethod
    def _who(request: web.Request) -> tuple[str | None, bool]:
        """(the key's name, whether keys are in use): a key sees only its own batches."""
        return request.get(KEY_NAME), grant_of(request) is not None

    @staticmethod
    def _answer(request: web.Request, body: Any) -> web.Response:
        return web.json_response(body, headers=ANTHROPIC.headers(request))

    def _check(self, request: web.Request, index: int, item: shapes.Request) -> None:
        """What `/v1/messages` would refuse of this request once its model is known."""
        pipeline = self.services.pipeline
        where = f"requests[{index}] (custom_id {item.custom_id!r})"
        try:
            ask = messages_ask(item.params)
            target = pipeline.resolve(request, ask.model)
            if isinstance(target, Forward):
                raise ProtocolError(
                    400,
                    f"model '{ask.model}' is served by remote '{target.remote.name}': a "
                    "batch runs on this host's models only",
                    "invalid_request_error",
                )
            plan = pipeline.plan(ask, target)
            if isinstance(plan, LoadOnly):
                raise ProtocolError(400, "nothing to generate", "invalid_request_error")
            steps.require(target.runtime, plan.need or ask.need, plan.needs, requested=ask.model)
        except Exception as exc:
            known = steps.failure(exc)
            if known is None or known.status >= 500:  # serve is starting: retry the batch
                raise
            raise ProtocolError(400, f"{where}: {known.message}", "invalid_request_error") from None

    async def create(self, request: web.Request) -> web.Response:
        batches = self._batches()
        requests = shapes.batch_requests(parse_json_object(await request.read()))
        for index, item in enumerate(requests):
            self._check(request, index, item)
        key, _ = self._who(request)
        batch = batches.submit(requests, key)
        return self._answer(request, batch.to_api(str(request.url.origin())))

    async def list(self, request: web.Request) -> web.Response:
        limit, before, after = shapes.page_bounds(request.query)
        key, keyed = self._who(request)
        found = {b.id: b for b in self._batches().visible(key, keyed=keyed)}
        ids, more = shapes.page(list(found), limit, before, after)
        base = str(request.url.origin())
        return self._answer(request, shapes.list_body([found[i].to_api(base) for i in ids], more))

    async def retrieve(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        batch = self._batches().get(request.match_info["id"], key, keyed=keyed)
        return self._answer(request, batch.to_api(str(request.url.origin())))

    async def cancel(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        batch = self._batches().cancel(request.match_info["id"], key, keyed=keyed)
        return self._answer(request, batch.to_api(str(request.url.origin())))

    async def delete(self, request: web.Request) -> web.Response:
        key, keyed = self._who(request)
        batch_id = request.match_info["id"]
        self._batches().delete(batch_id, key, keyed=keyed)
        return self._answer(request, {"id": batch_id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        key, keyed = self._who(request)
        batches = self._batches()
        batch = batches.get(request.match_info["id"], key, keyed=keyed)
        if batch.status != shapes.ENDED:
            raise ProtocolError(
                400,
                f"message batch '{batch.id}' is {batch.status}: its results come once it "
                "has ended (processing_status 'ended')",
                "invalid_request_error",
            )
        response = web.StreamResponse(
            headers={"Content-Type": "application/x-jsonlines", **ANTHROPIC.headers(request)}
        )
        await response.prepare(request)
        async for line in batches.results(batch):
            await response.write(line)
        await response.write_eof()
        return response
