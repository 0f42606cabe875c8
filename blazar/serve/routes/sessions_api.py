"""Blazar's sessions API on the gateway: `/api/blazar/sessions` (`blazar session ...`).

- `GET /api/blazar/sessions`: every saved and banked session;
- `POST /api/blazar/sessions` `{"model", "name", "slot"?, "replica"?}`: save a slot of
  a loaded model (by default the one that served it last) as session `name`;
- `POST /api/blazar/sessions/{name}/restore` `{"model"}`: load the model if needed and
  restore the session into a free slot; the next request continuing it is served from
  the cache;
- `DELETE /api/blazar/sessions/{name}`: remove it and its file.

The work is `blazar.serve.state.sessions`'; this module reads bodies and leases the slot a
restore writes into. Answers are ollama-shaped errors (`/api/*`), raised as usual.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.serve.http import read_json, wants_priority
from blazar.serve.request.pipeline import Routed
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import Forward
from blazar.serve.state.sessions import Sessions, incompatibility
from blazar.store.db import SessionRecord

BASE = "/api/blazar/sessions"


def register(app: web.Application, services: Services) -> None:
    """Add the sessions routes to the gateway's app."""
    api = SessionsAPI(services)
    app.router.add_get(BASE, api.list_)
    app.router.add_post(BASE, api.save)
    app.router.add_post(BASE + "/{name}/restore", api.restore)
    app.router.add_delete(BASE + "/{name}", api.remove)


def record_json(record: SessionRecord) -> dict[str, Any]:
    return asdict(record)


def optional_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(400, f"'{key}' must be an integer, got {value!r}")
    return value


class SessionsAPI:
    def __init__(self, services: Services) -> None:
        self.services = services

    def _sessions(self) -> Sessions:
        if self.services.sessions is None:
            raise ProtocolError(501, "sessions need `blazar serve`")
        return self.services.sessions

    async def list_(self, request: web.Request) -> web.Response:
        records = self._sessions().records()
        return web.json_response({"sessions": [record_json(r) for r in records]})

    async def save(self, request: web.Request) -> web.Response:
        sessions = self._sessions()
        body = await read_json(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(400, 'send {"model": MODEL, "name": NAME} (and "slot": N)')
        target = self.services.pipeline.resolve_here(request, body.get("model"))
        replica = optional_int(body, "replica") or 0
        slot = optional_int(body, "slot")
        record = await sessions.save(target.pool, name, slot=slot, replica=replica)
        return web.json_response(record_json(record))

    async def restore(self, request: web.Request) -> web.Response:
        sessions = self._sessions()
        body = await read_json(request)
        record = sessions.find(request.match_info["name"])
        pipeline = self.services.pipeline
        target = pipeline.resolve_here(request, body.get("model") or record.model)
        if (problem := incompatibility(record, target.runtime)) is not None:
            raise ProtocolError(400, problem)  # before loading anything
        routed = Routed(target, None, None, wants_priority(request))
        leased = await pipeline.lease(request, routed)
        if isinstance(leased, Forward):  # a session is this host's: never restored elsewhere
            raise ProtocolError(503, f"model '{target.runtime.name}' cannot load here now")
        with leased:
            slot = await sessions.restore(leased.lease, record)
        replica = leased.lease.member.instance.spec.replica
        return web.json_response(
            {
                **record_json(record),
                "slot": slot,
                "replica": replica,
                "loaded_ms": leased.load_ns / 1e6,
            }
        )

    async def remove(self, request: web.Request) -> web.Response:
        record = self._sessions().remove(request.match_info["name"])
        return web.json_response(record_json(record))
