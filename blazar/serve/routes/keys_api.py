"""API key management on the gateway: `GET /api/keys`, `POST /api/keys`, `DELETE /api/keys/NAME`.

Admin scope (`access.PREFIXES`). They edit the manifest serve watches, as
`blazar keys` does (`blazar.manifest.keys`, in a worker thread), then run a pass so
the access layer uses the new key set before they answer. With no key declared
they answer 403: the first key is made with `blazar keys add` on the host, so
an open gateway cannot be claimed by whoever reaches it first. Removing the
last key is a 409: the gateway refuses to go authless over HTTP (`blazar keys
rm --force` on the host can). `POST` answers the new key, once; it is never
shown again, nor logged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from blazar.manifest import keys as api_keys
from blazar.protocols import ProtocolError
from blazar.serve.http import TRACE, read_json, trace_id
from blazar.serve.routes.services import Services
from specs.manifest import Manifest

NO_KEYS = "key management needs at least one key first (`blazar keys add NAME --scope admin`)"


def register(app: web.Application, services: Services) -> None:
    """Add the key management routes to the gateway's app."""
    api = KeysAPI(services)
    app.router.add_get("/api/keys", api.list)
    app.router.add_post("/api/keys", api.add)
    app.router.add_delete("/api/keys/{name}", api.remove)


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    """The `add_key` arguments a request body gives, checked for type (the manifest checks
    the rest: names, scopes, models declared)."""
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(400, 'send {"name": NAME} (and scope, models, rpm, description)')
    scope = body.get("scope", "inference")
    if scope not in api_keys.SCOPES:
        raise ProtocolError(400, f"scope must be one of {', '.join(api_keys.SCOPES)}")
    models = body.get("models", ["*"])
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ProtocolError(400, 'models must be a list of model names, or ["*"]')
    rpm = body.get("rpm")
    if rpm is not None and (isinstance(rpm, bool) or not isinstance(rpm, int) or rpm < 1):
        raise ProtocolError(400, "rpm must be a positive integer")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise ProtocolError(400, "description must be a string")
    return {"name": name, "scope": scope, "models": models, "rpm": rpm, "description": description}


class KeysAPI:
    """The key handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def _declared(self) -> Manifest:
        control = self.services.need_control()
        manifest = await asyncio.to_thread(api_keys.declared, control.manifest)
        if not manifest.keys:
            raise ProtocolError(403, NO_KEYS, "permission_denied")
        return manifest

    async def list(self, request: web.Request) -> web.StreamResponse:
        manifest = await self._declared()
        usage = self.services.need_control().store.key_usage()
        keys = [info.to_dict() for info in api_keys.list_keys(manifest, usage)]
        return web.json_response({"keys": keys}, headers={TRACE: trace_id(request)})

    async def add(self, request: web.Request) -> web.StreamResponse:
        fields = _fields(await read_json(request))
        await self._declared()
        control = self.services.need_control()
        name = fields.pop("name")
        secret = await asyncio.to_thread(
            api_keys.add_key, control.paths, control.manifest, name, **fields
        )
        await control.refresh(f"key {name} added")
        shown = {"name": name, "key": secret, **fields}
        return web.json_response(shown, status=201, headers={TRACE: trace_id(request)})

    async def remove(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        await self._declared()
        control = self.services.need_control()
        await asyncio.to_thread(api_keys.remove_key, control.paths, control.manifest, name)
        await control.refresh(f"key {name} removed")
        return web.json_response(
            {"name": name, "removed": True}, headers={TRACE: trace_id(request)}
        )
