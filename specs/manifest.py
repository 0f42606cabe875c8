"""The manifest: pydantic models of the desired state a host should have.

`specs.loader` builds a Manifest from TOML or YAML files (with file:line
errors); the reconcilers read it to plan; `specs.schema` exports its JSON
Schema and the generated reference, docs/manifest.md, from the field
descriptions below. Types are strict: `ctx = "4096"` is an error, not 4096.
Fields marked "(not supported yet)" are validated, and a manifest that sets one is
refused by diff, apply and serve (`specs.support`) rather than silently ignored.
Every resource table has `enabled`: the loader drops one set to false (host overlays).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ModelWrapValidatorHandler, PrivateAttr, model_validator

from specs.engines import Engine, EngineRouting
from specs.fields import (
    EngineName,
    GroupName,
    KeyName,
    LoraName,
    McpName,
    ModelName,
    RemoteName,
)
from specs.fleet import Kubernetes, Remote
from specs.groups import Group
from specs.keys import Key
from specs.mcp import McpServer
from specs.models import Lora, Model
from specs.problems import Finding, FindingsError, Location, Path
from specs.references import (
    canonical,
    default_candidates,
    default_kind,
    reference_findings,
    resolve_engine,
)
from specs.serving import Serving
from specs.tables import Table


class Manifest(Table):
    """The desired state of one host: the whole manifest, possibly merged from several files."""

    schema_url: str | None = Field(
        default=None,
        alias="$schema",
        description="JSON Schema for editors; ignored by Blazar.",
    )
    version: Literal[1] = Field(default=1, description="Manifest format version.")
    serving: Serving = Field(default_factory=Serving, description="The gateway.")
    engines: dict[EngineName, Engine] = Field(
        default_factory=dict,
        description='Engine lanes by name. Beside them, `catalog = "PATH or URL"` names the '
        "catalog of fork lanes (default: the one shipped with Blazar).",
        json_schema_extra={"properties": {"catalog": {"type": "string", "minLength": 1}}},
    )
    engine_routing: EngineRouting = Field(
        default_factory=EngineRouting, description="How models are routed to engine lanes."
    )
    models: dict[ModelName, Model] = Field(
        default_factory=dict,
        description="Models by name (name or name:tag).",
    )
    loras: dict[LoraName, Lora] = Field(
        default_factory=dict,
        description="LoRA adapters by name.",
    )
    groups: dict[GroupName, Group] = Field(
        default_factory=dict,
        description="Groups of models by name: one at a time (exclusive) or loaded as one "
        "(together); `blazar coreside` shows what can be resident at once.",
    )
    keys: dict[KeyName, Key] = Field(
        default_factory=dict,
        description="API keys by name.",
    )
    remotes: dict[RemoteName, Remote] = Field(
        default_factory=dict,
        description="Remote servers (other Blazars, OpenAI-compatible servers) by name.",
    )
    mcp: dict[McpName, McpServer] = Field(
        default_factory=dict,
        description="MCP servers by name: tools the gateway offers models (docs/mcp.md).",
    )
    kubernetes: Kubernetes = Field(
        default_factory=Kubernetes,
        description="How `blazar render kubernetes` renders the manifest.",
    )
    _origins: dict[Path, Location] = PrivateAttr(default_factory=dict)
    _source: str = PrivateAttr(default="")
    _engine_catalog: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _catalog(cls, data: Any, handler: ModelWrapValidatorHandler[Manifest]) -> Manifest:
        """`engines.catalog` is a string beside the lane tables, not a lane."""
        catalog = None
        engines = data.get("engines") if isinstance(data, dict) else None
        if isinstance(engines, dict) and "catalog" in engines:
            engines = dict(engines)
            catalog = engines.pop("catalog")
            if not isinstance(catalog, str) or not catalog.strip():
                raise FindingsError(
                    [Finding(("engines", "catalog"), "engines.catalog must be a path or URL")]
                )
            data = {**data, "engines": engines}
        manifest = handler(data)
        manifest._engine_catalog = catalog
        return manifest

    @model_validator(mode="after")
    def _references(self) -> Manifest:
        findings = reference_findings(self.model_dump(by_alias=True))
        if findings:
            raise FindingsError(findings)
        return self

    def __eq__(self, other: object) -> bool:
        """Equal when they declare the same; where they were declared does not matter."""
        if not isinstance(other, Manifest):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # tables of resources are not hashable

    @property
    def origins(self) -> dict[Path, Location]:
        """Where each table and field was declared: origins[("models", "gemma")]."""
        return self._origins

    def with_origins(self, origins: dict[Path, Location]) -> Manifest:
        """This manifest, remembering where its parts were declared (the loader calls it)."""
        self._origins = dict(origins)
        return self

    def with_source(self, source: str) -> Manifest:
        """This manifest, remembering the file or directory it was loaded from (the loader
        calls it): what the store records as having applied each resource."""
        self._source = source
        return self

    @property
    def source(self) -> str:
        """The resolved path this manifest was loaded from ("" for one built in memory)."""
        return self._source

    def location_of(self, *path: str | int) -> Location | None:
        """The location of `path`, or of its nearest declared parent."""
        for end in range(len(path), -1, -1):
            if (found := self._origins.get(tuple(path[:end]))) is not None:
                return found
        return None

    def resolve_model(self, ref: str) -> str | None:
        """The declared model a name or alias refers to (`gemma:latest` finds `gemma`)."""
        key = canonical(ref)
        for name, model in self.models.items():
            if canonical(name) == key or any(canonical(a) == key for a in model.aliases):
                return name
        return None

    def declared_model(self, ref: str) -> Model | None:
        """The declaration a name or alias refers to; None when none is declared."""
        key = self.resolve_model(ref)
        return self.models[key] if key is not None else None

    def engine_for(self, model: str) -> str | None:
        """The engine `model` runs on when not routed by architecture: its own, the only one
        declared of its kind, or the default lane of its kind ('llamacpp' for chat); None
        when several are declared and it names none (auto routing chooses)."""
        doc = self.model_dump(include={"engines", "engine_routing"})  # not every model's
        declared = self.models[model]
        return resolve_engine(
            declared.model_dump(),
            default_candidates(doc, declared.kind),
            default_kind(doc, declared.kind),
        )

    def lane_of(self, engine: str) -> str:
        """The store's lane for engine `engine` (a fork's offer id, else its kind)."""
        declared = self.engines.get(engine)
        return declared.lane_name if declared is not None else engine

    @property
    def engine_catalog(self) -> str | None:
        """`engines.catalog`: the catalog of fork lanes, when the manifest names one."""
        return self._engine_catalog

    def ctx_for(self, model: str) -> int:
        """The context size `model` is served with."""
        return self.models[model].ctx or self.serving.default_ctx

    def slots_for(self, model: str) -> int:
        """Parallel sequences per instance of `model`."""
        return self.models[model].slots or self.serving.default_slots

    def groups_of(self, model: str) -> list[str]:
        """The groups `model` (a declared name) is in, in declaration order."""
        return [g for g, group in self.groups.items() if model in self.group_members(g)]

    def group_members(self, group: str) -> list[str]:
        """The declared names of a group's models (aliases resolved; the validator
        refused a member that names no declared model)."""
        return [n for ref in self.groups[group].models if (n := self.resolve_model(ref))]

    def keep_alive_for(self, model: str) -> float:
        """Seconds `model` stays loaded when idle (-1: forever)."""
        own = self.models[model].keep_alive
        return self.serving.keep_alive if own is None else own
