"""Desired state as plain values, derived from a validated manifest.

Planners read these instead of the pydantic models, so the manifest's shape
and the planning logic can change apart. `settings` are the runtime fields
of a resource (context, slots, pins...): a change there is an update in
place, never a new download.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specs.manifest import Manifest
from specs.names import parse_name

LATEST = "latest"
FORK = "fork"  # the install method of a lane declared with `lane = "ID"`
# mmproj is its own resource (`reconcilers.projectors`), not a setting of the model's bytes.
NOT_SETTINGS = {"source", "sha256", "failover", "enabled", "mmproj", "mmproj_sha256"}
AUTO_PROJECTOR = "auto"


@dataclass(frozen=True)
class DesiredEngine:
    name: str
    kind: str
    method: str
    version: str  # "latest" or a pin
    backend: str = "cpu"
    options: dict[str, Any] = field(default_factory=dict)  # feed, source, gate
    lane: str = ""  # the store's lane: a fork's offer id, else the kind

    @property
    def fork(self) -> bool:
        return self.method == FORK

    @property
    def lane_name(self) -> str:
        return self.lane or self.kind


@dataclass(frozen=True)
class DesiredModel:
    name: str
    source: str
    sha256: str | None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DesiredLora:
    name: str
    model: str
    source: str
    sha256: str | None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DesiredProjector:
    """A model's vision projector (`models.NAME.mmproj`), named after the model."""

    model: str  # the model's short name
    source: str  # as declared: a source, or "auto"
    sha256: str | None
    settings: dict[str, Any] = field(default_factory=dict)  # auto: the model's source


@dataclass(frozen=True)
class DesiredKey:
    name: str
    sha256: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class DesiredRouting:
    """`[engine_routing]` and `engines.catalog`, with each model's lane resolved."""

    mode: str = "auto"
    policy: str = "mainstream"  # mainstream | fastest: among lanes that can load a model
    fork_retire_days: int = 14
    catalog: str | None = None
    pins: dict[str, str] = field(default_factory=dict)  # model -> lane its `engine` names
    defaults: dict[str, str] = field(default_factory=dict)  # model -> its lane in manual mode


@dataclass(frozen=True)
class Desired:
    engines: tuple[DesiredEngine, ...] = ()
    models: tuple[DesiredModel, ...] = ()
    loras: tuple[DesiredLora, ...] = ()
    keys: tuple[DesiredKey, ...] = ()
    routing: DesiredRouting = field(default_factory=DesiredRouting)
    projectors: tuple[DesiredProjector, ...] = ()
    owner: str = ""  # the manifest's path: what the store records as having applied each


def desired_from_manifest(manifest: Manifest) -> Desired:
    """The plain desired state of a validated manifest."""
    engines = tuple(
        DesiredEngine(
            name=name,
            kind=engine.kind,
            method=FORK if engine.lane else engine.install,
            version=engine.version,
            backend=engine.backend,
            options={
                "feed": str(engine.feed) if engine.feed else None,
                "source": engine.source,
                "backend": engine.backend,
                "gate": engine.rollback_on_drop,
            },
            lane=engine.lane or "",
        )
        for name, engine in manifest.engines.items()
    )
    models = []
    for key, model in manifest.models.items():
        # failover and enabled are read by the gateway and the loader, not kept with the bytes.
        settings = model.model_dump(mode="json", exclude=NOT_SETTINGS)
        settings["engine"] = manifest.engine_for(key)
        if model.draft:  # the model it names, by its short name (an alias resolved)
            settings["draft"] = parse_name(manifest.resolve_model(model.draft) or model.draft).short
        models.append(DesiredModel(parse_name(key).short, model.source, model.sha256, settings))
    loras = []
    for key, lora in manifest.loras.items():
        base = manifest.resolve_model(lora.model) or lora.model
        chosen: dict[str, Any] = {"scale": lora.scale}
        if lora.always_on:  # only when set: adapters recorded before it existed stay unchanged
            chosen["always_on"] = True
        loras.append(DesiredLora(key, parse_name(base).short, lora.source, lora.sha256, chosen))
    keys = tuple(
        DesiredKey(name, key.sha256, tuple(key.models)) for name, key in manifest.keys.items()
    )
    projectors = tuple(
        DesiredProjector(
            parse_name(key).short,
            model.mmproj,
            model.mmproj_sha256,
            {"model_source": model.source} if model.mmproj == AUTO_PROJECTOR else {},
        )
        for key, model in manifest.models.items()
        if model.mmproj is not None
    )
    return Desired(
        engines,
        tuple(models),
        tuple(loras),
        keys,
        routing_of(manifest),
        projectors,
        owner=manifest.source,
    )


def routing_of(manifest: Manifest) -> DesiredRouting:
    """How models are routed to lanes: the mode, retirement, the catalog, pins by model."""
    pins, defaults = {}, {}
    for key, model in manifest.models.items():
        name = parse_name(key).short
        if model.engine is not None:
            pins[name] = manifest.lane_of(model.engine)
        default = manifest.engine_for(key)
        defaults[name] = manifest.lane_of(default) if default else "llamacpp"
    routing = manifest.engine_routing
    return DesiredRouting(
        mode=routing.mode,
        policy=routing.policy,
        fork_retire_days=routing.fork_retire_days,
        catalog=manifest.engine_catalog,
        pins=pins,
        defaults=defaults,
    )
