"""`[keys.NAME]`: API keys, declared by their hash only; part of the manifest
(`specs.manifest.Manifest`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specs.fields import KeyModels, Sha256
from specs.tables import Table


class Key(Table):
    """An API key (`blazar keys add NAME` makes one); only its sha256 is ever written down.
    Once one key is declared, every route but `GET /health` needs a key."""

    sha256: Sha256 = Field(description="sha256 of the key (64 lowercase hex digits).")
    scope: Literal["inference", "admin"] = Field(
        default="inference",
        description="inference: model routes and listings; admin: also pull, create, copy, "
        "delete, blob uploads, stopping models and managing keys.",
    )
    models: KeyModels = Field(
        default=["*"],
        description="Models (names or aliases) the key may use; ['*'] is every model. Others "
        "answer 404 to it, as if absent, and listings show it only these.",
    )
    rpm: int | None = Field(
        default=None,
        ge=1,
        description="Requests per minute the key may make (bursts up to this many); beyond "
        "it: 429 with Retry-After. Default: no limit.",
    )
    description: str | None = Field(default=None, description="Who or what the key is for.")
    created: str | None = Field(
        default=None, description="When `blazar keys add` made it (ISO 8601, UTC)."
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )
