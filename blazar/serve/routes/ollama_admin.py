"""ollama's model listings and simple edits on the gateway: tags, ps, show, version, copy, delete.

`GET /api/tags` (each model, its aliases, and `name:tag+adapter` for each of its
LoRA adapters), `GET /api/ps`, `POST /api/show` and `GET /api/version` read the
store and the scheduler and answer through the builders in
`blazar.protocols.ollama`. `POST /api/copy` adds the destination name to the
source model's `aliases` in the manifest; `DELETE /api/delete` is `blazar rm`
(for an alias, it drops only the alias); both go through `manifest_ops` in a
worker thread, then ask the daemon for a pass. `POST /api/push` is refused:
Blazar serves models, it does not publish them. Pulls, creates and blob uploads
live in `ollama_pull`. Failures are raised and answered in ollama's shape
(`{"error": ...}`: 404 for an unknown model, 400 for what Blazar cannot do) by
the gateway's error middleware.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aiohttp import web

from blazar.errors import NotFound
from blazar.manifest import ops as manifest_ops
from blazar.protocols import ProtocolError, ollama
from blazar.serve.http import TRACE, name_in, read_json, trace_id
from blazar.serve.request.grants import sees
from blazar.serve.request.steps import free_name
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import Forward
from specs.names import parse_name

if TYPE_CHECKING:
    from blazar.store.db import ModelRecord

OLLAMA_VERSION = "0.12.6"  # the ollama release whose /api/* these routes follow
FOREVER = timedelta(days=365 * 100)  # ollama shows keep_alive -1 as an expiry far away


def register(app: web.Application, services: Services) -> None:
    """Add the listing, copy, delete and push routes to the gateway's app."""
    api = OllamaAdmin(services)
    app.router.add_get("/api/tags", api.tags)
    app.router.add_get("/api/ps", api.ps)
    app.router.add_post("/api/show", api.show)
    app.router.add_get("/api/version", api.version)
    app.router.add_post("/api/copy", api.copy)
    app.router.add_delete("/api/delete", api.delete)
    app.router.add_post("/api/push", api.push)


def _info(record: ModelRecord) -> ollama.ModelInfo:
    return ollama.ModelInfo.from_record(asdict(record))


def _ref(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def _rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def memory_sizes(row: dict[str, Any]) -> tuple[int | None, int]:
    """Pure: `/api/ps`'s `size` and `size_vram` of a `Scheduler.snapshot()` row, as ollama
    reports them: the bytes the model takes (its footprint: measured once a child of it
    ran, else estimated; its file's size when there is none), and of those the ones on
    GPUs (all of them when it was placed on GPUs, none on host RAM)."""
    size = row.get("footprint") or row.get("size")
    on_gpu = any(str(d).startswith("gpu:") for d in row.get("devices") or ())
    return size, (size or 0) if on_gpu else 0


class OllamaAdmin:
    """The management handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    # -- listings -------------------------------------------------------------

    async def tags(self, request: web.Request) -> web.StreamResponse:
        runtimes = self.services.scheduler.runtimes
        records = [  # a key lists only the models it may use
            r
            for r in self.services.need_control().store.list_models()
            if sees(request, r.ref.short, getattr(runtimes.get(r.ref.short), "aliases", ()))
        ]
        infos = [_info(r) for r in records]
        by_name = {r.ref.short: info for r, info in zip(records, infos, strict=True)}
        for runtime in runtimes.values():
            base = by_name.get(runtime.name)
            if base is None:
                continue
            for alias in runtime.aliases:  # names given by /api/copy or the manifest
                ref = parse_name(alias)
                infos.append(replace(base, name=ref.name, tag=ref.tag))
            own = parse_name(runtime.name)
            for adapter in runtime.adapters:  # `name:tag+adapter`: the model with it on
                infos.append(replace(base, tag=f"{own.tag}+{adapter.name}"))
        body = ollama.tags(infos)
        local = {i.ref for i in infos}
        for name, remote in self.services.fleet.listing(lambda n: _ref(n) in local):
            if sees(request, name, ()):  # models served from remotes (docs/fleet.md)
                body["models"].append(ollama.remote_tag(name, remote.url))
        return web.json_response(body)

    async def ps(self, request: web.Request) -> web.StreamResponse:
        store = self.services.need_control().store
        scheduler = self.services.scheduler
        now = datetime.now(UTC)
        running, seen = [], set()
        for row in scheduler.snapshot():
            if row["retired"] or row["model"] in seen:
                continue
            runtime = scheduler.runtimes.get(row["model"])
            if not sees(request, row["model"], runtime.aliases if runtime else ()):
                continue
            seen.add(row["model"])
            ref = parse_name(row["model"])
            record = store.find_model(ref)
            info = _info(record) if record else ollama.ModelInfo(ref.name, ref.tag)
            remaining = row["keep_alive_remaining"]
            if remaining is None and row["in_flight"] and runtime and not row["pinned"]:
                remaining = runtime.keep_alive if runtime.keep_alive >= 0 else None
            kept = remaining is None or remaining >= FOREVER.total_seconds()  # no overflow
            expires = now + (FOREVER if kept else timedelta(seconds=remaining))
            size, vram = memory_sizes(row)
            running.append(
                ollama.RunningModel(
                    info, _rfc3339(expires), int(row["ctx"]), size=size, size_vram=vram
                )
            )
        return web.json_response(ollama.ps(running))

    async def show(self, request: web.Request) -> web.StreamResponse:
        model = name_in(await read_json(request), "model", "name")
        where = self.services.pipeline.resolve(request, model)
        if isinstance(where, Forward):  # a remote's model: its details are the remote's
            return await self.services.pipeline.forward(request, None, where)
        runtime = where.runtime
        record = self.services.need_control().store.find_model(parse_name(runtime.name))
        if record is None:
            raise NotFound(f"model '{model}' not found")
        info = _info(record)
        if runtime.chat_template is not None or runtime.template_problem is not None:
            # The manifest's template is the one applied (none, when it cannot be read).
            info = replace(info, chat_template=runtime.chat_template)
        body = ollama.show(
            info,
            context_length=runtime.slot_ctx,
            embedding=runtime.embeddings,
            has_vision=runtime.has_vision,
        )
        return web.json_response(body)

    async def version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(ollama.version(OLLAMA_VERSION))

    async def push(self, request: web.Request) -> web.StreamResponse:
        raise ProtocolError(
            400,
            "push is not supported: Blazar serves models and does not publish them to a "
            "registry; upload the GGUF to Hugging Face (`hf upload`) and pull it from there",
        )

    # -- copy and delete ------------------------------------------------------

    async def copy(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        source, destination = name_in(body, "source"), name_in(body, "destination")
        control = self.services.need_control()
        target = self.services.pipeline.resolve_here(request, source)
        alias = parse_name(destination).short
        if alias == target.runtime.name:
            raise ProtocolError(
                400,
                f"copy: '{destination}' is the name of model '{source}' itself; copy it to "
                "a new name",
            )
        free_name(self.services.scheduler, alias, target)
        await asyncio.to_thread(
            manifest_ops.add_alias, control.manifest, target.runtime.name, alias
        )
        await control.refresh(f"copy {source} -> {alias}")
        return web.Response(headers={TRACE: trace_id(request)})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        model = name_in(await read_json(request), "model", "name")
        control = self.services.need_control()
        await asyncio.to_thread(manifest_ops.remove_model, control.paths, control.manifest, model)
        await control.refresh(f"delete {model}")
        return web.Response(headers={TRACE: trace_id(request)})
