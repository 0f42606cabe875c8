"""What the API key of a request may see: its name, scope, models and request rate.

The access middleware (`blazar.serve.gateway.access`) authenticates a request and
stores its key's `Grant` under `GRANT` (and the key's name under
`http.KEY_NAME`); no grant means keys are off. `pipeline.resolve` answers a
model the grant does not list exactly as it answers an unknown one (404, the
served names filtered), and the listings (`/v1/models`, `/api/tags`,
`/api/ps`, `/api/blazar/ps`) show only what it lists, so a key does not reveal
what else is served.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from specs.references import canonical

INFERENCE, ADMIN = "inference", "admin"


@dataclass(frozen=True)
class Grant:
    """One declared key, as the gateway enforces it (the key's sha256 is not kept here)."""

    name: str
    scope: str  # inference | admin
    models: frozenset[str] | None  # canonical names (`x:latest`); None: every model
    rpm: int | None

    @classmethod
    def of(cls, name: str, scope: str, models: Iterable[str], rpm: int | None) -> Grant:
        listed = list(models)
        every = not listed or "*" in listed
        return cls(name, scope, None if every else frozenset(map(canonical, listed)), rpm)

    def sees(self, name: str, aliases: Iterable[str] = ()) -> bool:
        """Whether the model known by `name` (or any of its aliases) is one it may use."""
        if self.models is None:
            return True
        return canonical(name) in self.models or any(canonical(a) in self.models for a in aliases)


GRANT = web.RequestKey("grant", Grant)


def grant_of(request: web.Request) -> Grant | None:
    """The request's grant; None when the gateway declares no key."""
    return request.get(GRANT)


def sees(request: web.Request, name: str, aliases: Iterable[str] = ()) -> bool:
    """Whether the request's key may use (and so see) the model `name`."""
    grant = request.get(GRANT)
    return grant is None or grant.sees(name, aliases)
