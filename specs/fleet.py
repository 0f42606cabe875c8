"""`[remotes.NAME]` and `[kubernetes]`: other servers this host forwards to, and how
`blazar render kubernetes` renders the manifest; part of `specs.manifest.Manifest`."""

from __future__ import annotations

from pydantic import Field, model_validator

from specs.durations import Duration
from specs.fields import EnvName, HttpUrl, ModelName, NonEmpty
from specs.problems import FieldError
from specs.sizes import Size
from specs.tables import Table


class Remote(Table):
    """Another Blazar, or any OpenAI-compatible server: the gateway lists its models and
    forwards requests for them, and models name it in `failover` (docs/fleet.md)."""

    url: HttpUrl = Field(
        description="Base URL of the remote server, such as https://big-box:11435 (a "
        "trailing /v1 is dropped: requests keep their own paths)."
    )
    key_env: EnvName | None = Field(
        default=None,
        description="Environment variable holding the key sent to it (`Authorization: "
        "Bearer`); never the key itself. Unset or empty in serve's environment: no key is sent.",
    )
    models: list[ModelName] = Field(
        default=[],
        description="The model names to take from it. Default: every model its /v1/models "
        "lists (a name this host serves itself stays local).",
    )
    timeout: Duration = Field(
        default=5.0,
        description="Connect timeout, and the limit of each health probe: a request for a "
        "remote that does not answer fails within it.",
    )
    health_interval: Duration = Field(
        default=10.0,
        description="How often its /health is probed; two failures in a row mark it down "
        "(requests never wait on a down remote), one success up again.",
    )
    enabled: bool = Field(
        default=True, description="false removes it (a host overlay uses it: docs/fleet.md)."
    )

    @model_validator(mode="after")
    def _positive(self) -> Remote:
        for name in ("timeout", "health_interval"):
            if not getattr(self, name) > 0:
                raise FieldError(name, f"{name} must be a positive duration, such as '5s'")
        return self


class Kubernetes(Table):
    """How `blazar render kubernetes` renders this manifest (docs/fleet.md); nothing else
    reads it."""

    replicas: int = Field(
        default=1,
        ge=1,
        description="Pods of the Deployment, each a whole Blazar. Above 1 they share the "
        "model store's volume (ReadWriteMany: the storage class must offer it).",
    )
    image: NonEmpty | None = Field(
        default=None,
        description="The container image (built from packaging/Containerfile). Default: "
        "blazar:VERSION.",
    )
    storage_class: NonEmpty | None = Field(
        default=None,
        description="storageClassName of the model store's PersistentVolumeClaim. Default: "
        "the cluster's default class.",
    )
    storage: Size | None = Field(
        default=None,
        description="The model store's size. Default: the models' and adapters' sizes (from "
        "this host's store or blazar.lock) plus room for engines and a fifth more.",
    )
    cpu: NonEmpty = Field(default="1", description="The container's CPU request.")
