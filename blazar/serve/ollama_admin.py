"""ollama's model listings and simple edits on the gateway: tags, ps, show, version, copy, delete.

`GET /api/tags`, `GET /api/ps`, `POST /api/show` and `GET /api/version` read the
store and the scheduler and answer through the builders in
`blazar.protocols.ollama`. `POST /api/copy` adds the destination name to the
source model's `aliases` in the manifest; `DELETE /api/delete` is `blazar rm`
(for an alias, it drops only the alias); both go through `manifest_ops` in a
worker thread, then ask the daemon for a pass. `POST /api/push` is refused:
Blazar serves models, it does not publish them. Pulls, creates and blob uploads
live in `ollama_pull`. The helpers here answer Blazar's errors in ollama's shape
(`{"error": ...}`: 404 for an unknown model, 400 for what Blazar cannot do).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.protocols import ProtocolError, ollama
from blazar.reconcile import InvalidManifest
from blazar.serve import manifest_ops
from blazar.serve.scheduler import Pool, Scheduler, SchedulerError
from blazar.serve.upstream import TRACE, Control, read_json, trace_id
from specs.names import InvalidName, parse_name
from specs.sources import InvalidSource

if TYPE_CHECKING:
    from blazar.serve.gateway import Gateway
    from blazar.store import ModelRecord

OLLAMA_VERSION = "0.12.6"  # the ollama release whose /api/* these routes follow
FOREVER = timedelta(days=365 * 100)  # ollama shows keep_alive -1 as an expiry far away
Failure = (ProtocolError, SchedulerError, BlazarError, InvalidName, InvalidSource)
T = TypeVar("T")
Handler = Callable[[T, web.Request], Awaitable[web.StreamResponse]]


def register(app: web.Application, gateway: Gateway) -> None:
    """Add the listing, copy, delete and push routes to the gateway's app."""
    api = OllamaAdmin(gateway)
    app.router.add_get("/api/tags", api.tags)
    app.router.add_get("/api/ps", api.ps)
    app.router.add_post("/api/show", api.show)
    app.router.add_get("/api/version", api.version)
    app.router.add_post("/api/copy", api.copy)
    app.router.add_delete("/api/delete", api.delete)
    app.router.add_post("/api/push", api.push)


def control_of(gateway: Gateway) -> Control:
    """The daemon's hooks; routes that edit the manifest need `blazar serve`."""
    if gateway.control is None:
        raise ProtocolError(501, "model management needs `blazar serve`")
    return gateway.control


def status_of(exc: BaseException) -> int:
    """The HTTP status an error is answered with."""
    if isinstance(exc, ProtocolError | SchedulerError):
        return exc.status
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, InvalidInput | InvalidManifest | InvalidName | InvalidSource):
        return 400
    return 500


def message_of(exc: BaseException) -> str:
    return exc.message if isinstance(exc, ProtocolError) else str(exc)


def guarded(handler: Handler[T]) -> Handler[T]:
    """Answer Blazar's errors in ollama's shape, with their status."""

    async def wrapped(self: T, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except Failure as exc:
            body = ollama.error(message_of(exc))
            return web.json_response(
                body, status=status_of(exc), headers={TRACE: trace_id(request)}
            )

    return wrapped


def name_in(body: dict[str, Any], *keys: str) -> str:
    for key in keys:
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
    raise ProtocolError(400, f"{keys[0]} is required")


def free_name(scheduler: Scheduler, name: str, pool: Pool) -> None:
    """Refuse a new name for `pool`'s model that already names another model."""
    try:
        taken, _ = scheduler.lookup(name)
    except SchedulerError:
        return
    if taken is not pool:
        raise InvalidInput(
            f"'{name}' already names model '{taken.runtime.name}': delete it first "
            "(`ollama rm`, `blazar rm`) or choose another name"
        )


def _info(record: ModelRecord) -> ollama.ModelInfo:
    return ollama.ModelInfo.from_record(asdict(record))


def _rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


class OllamaAdmin:
    """The management handlers; one instance per gateway app."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def control(self) -> Control:
        return control_of(self.gateway)

    # -- listings -------------------------------------------------------------

    @guarded
    async def tags(self, request: web.Request) -> web.StreamResponse:
        records = self.control.store.list_models()
        infos = [_info(r) for r in records]
        by_name = {r.ref.short: info for r, info in zip(records, infos, strict=True)}
        for runtime in self.gateway.scheduler.runtimes.values():
            base = by_name.get(runtime.name)
            if base is None:
                continue
            for alias in runtime.aliases:  # names given by /api/copy or the manifest
                ref = parse_name(alias)
                infos.append(replace(base, name=ref.name, tag=ref.tag))
        return web.json_response(ollama.tags(infos))

    @guarded
    async def ps(self, request: web.Request) -> web.StreamResponse:
        now = datetime.now(UTC)
        running, seen = [], set()
        for row in self.gateway.scheduler.snapshot():
            if row["retired"] or row["model"] in seen:
                continue
            seen.add(row["model"])
            ref = parse_name(row["model"])
            record = self.control.store.find_model(ref)
            info = _info(record) if record else ollama.ModelInfo(ref.name, ref.tag)
            runtime = self.gateway.scheduler.runtimes.get(row["model"])
            remaining = row["keep_alive_remaining"]
            if remaining is None and row["in_flight"] and runtime and not row["pinned"]:
                remaining = runtime.keep_alive if runtime.keep_alive >= 0 else None
            expires = now + (FOREVER if remaining is None else timedelta(seconds=remaining))
            running.append(
                ollama.RunningModel(info, _rfc3339(expires), int(row["ctx"]), size=row["size"])
            )
        return web.json_response(ollama.ps(running))

    @guarded
    async def show(self, request: web.Request) -> web.StreamResponse:
        model = name_in(await read_json(request), "model", "name")
        pool, _ = self.gateway.scheduler.lookup(model)
        runtime = pool.runtime
        ref = parse_name(runtime.name)
        record = self.control.store.find_model(ref)
        if record is None:
            raise NotFound(f"model '{model}' not found")
        info = _info(record)
        if runtime.chat_template is not None or runtime.template_problem is not None:
            # The manifest's template is the one applied (none, when it cannot be read).
            info = replace(info, chat_template=runtime.chat_template)
        body = ollama.show(info, context_length=runtime.ctx, embedding=runtime.embeddings)
        return web.json_response(body)

    async def version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(ollama.version(OLLAMA_VERSION))

    @guarded
    async def push(self, request: web.Request) -> web.StreamResponse:
        raise ProtocolError(
            400,
            "push is not supported: Blazar serves models and does not publish them to a "
            "registry; upload the GGUF to Hugging Face (`hf upload`) and pull it from there",
        )

    # -- copy and delete ------------------------------------------------------

    @guarded
    async def copy(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        source, destination = name_in(body, "source"), name_in(body, "destination")
        pool, _ = self.gateway.scheduler.lookup(source)
        alias = parse_name(destination).short
        free_name(self.gateway.scheduler, alias, pool)
        await asyncio.to_thread(
            manifest_ops.add_alias, self.control.manifest, pool.runtime.name, alias
        )
        await self.control.refresh(f"copy {source} -> {alias}")
        return web.Response(headers={TRACE: trace_id(request)})

    @guarded
    async def delete(self, request: web.Request) -> web.StreamResponse:
        model = name_in(await read_json(request), "model", "name")
        control = self.control
        await asyncio.to_thread(manifest_ops.remove_model, control.paths, control.manifest, model)
        await control.refresh(f"delete {model}")
        return web.Response(headers={TRACE: trace_id(request)})
