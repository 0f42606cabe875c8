"""The ports: the only way reconcilers touch the world.

`blazar.reconcile.ports` supplies real implementations (store, registry, engine
lanes, model sources); tests supply in-memory fakes. Observed state comes
back as the plain values below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # named in the ports' bases as strings: `reconcilers.desired` reads the
    # manifest (pydantic), which `blazar status`, importing the ports, must not pay for
    from reconcilers.desired import DesiredLora, DesiredModel, DesiredProjector  # noqa: F401

Progress = Callable[[int, int | None], None]
Declared = TypeVar("Declared", contravariant=True)


@dataclass(frozen=True)
class ObservedEngine:
    kind: str
    tag: str
    method: str
    version: str
    active: bool


@dataclass(frozen=True)
class ObservedLane:
    """An engine lane on the host: a kind of server, where its builds come from, its state."""

    lane: str  # llamacpp, or a fork's offer id
    kind: str  # the server's contract: llamacpp
    origin: str  # mainstream | fork
    state: str = "active"  # active | retiring | retired
    since: str = ""  # when it entered `state` (ISO 8601, UTC)
    reason: str = ""
    active: str | None = None  # tag of the lane's active engine
    build: int | None = None  # its mainstream build number (b11549 -> 11549), if known
    tags: tuple[str, ...] = ()  # every engine installed in the lane
    adds: tuple[str, ...] = ()  # architectures a fork lane was installed for
    upstream: int | None = None  # the mainstream build that added them (from the catalog)
    support: dict[str, bool] = field(default_factory=dict)  # the active engine's, recorded
    in_use: tuple[int, ...] = ()  # pids of processes running one of its engines


@dataclass(frozen=True)
class OfferView:
    """A catalog offer, as planning and routing see it."""

    id: str
    kind: str
    architectures: tuple[str, ...]
    commit: str


@dataclass(frozen=True)
class ObservedModel:
    name: str  # short form: name, or name:tag
    sha256: str
    source: str
    size: int
    managed: bool  # created by apply (a manifest owns it) rather than `blazar import`
    settings: dict[str, Any] = field(default_factory=dict)  # runtime fields last applied
    architecture: str | None = None  # the GGUF's general.architecture
    owner: str | None = None  # the manifest that applied it last (None: not recorded)


@dataclass(frozen=True)
class ObservedLora:
    name: str
    model: str
    sha256: str
    source: str
    managed: bool
    settings: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None


@dataclass(frozen=True)
class ObservedProjector:
    model: str  # the model's short name
    sha256: str
    source: str  # as declared when it was fetched
    managed: bool
    settings: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None


@dataclass(frozen=True)
class ObservedKey:
    name: str
    sha256: str
    models: tuple[str, ...]
    managed: bool
    owner: str | None = None


class EnginesPort(Protocol):
    def observe(self) -> list[ObservedEngine]: ...

    def expected_tag(self, method: str, version: str, backend: str) -> str:
        """The tag a pinned version installs as (no I/O)."""
        ...

    def install(self, kind: str, method: str, version: str | None, options: dict[str, Any]) -> str:
        """Install an engine; return its tag."""
        ...

    def activate(self, kind: str, tag: str) -> None: ...

    def lanes(self, architectures: set[str]) -> list[ObservedLane]:
        """Every lane, with the recorded support of each active engine for `architectures`
        (probing a mainstream engine once for an architecture it was never asked about)."""
        ...

    def offers(self, catalog: str | None) -> list[OfferView]:
        """The catalog's usable offers (empty when it cannot be read)."""
        ...

    def install_fork(self, lane: str, backend: str, catalog: str | None) -> str:
        """Fetch, verify and build the catalog offer `lane`; return the new engine's tag."""
        ...

    def set_lane_state(self, lane: str, state: str, reason: str, since: str) -> None: ...

    def remove_lane(self, lane: str) -> None:
        """Delete a retired fork lane's engines (its row stays, as history)."""
        ...


class HeldPort(Protocol[Declared]):
    """Files held for the manifest (models, adapters, projectors): what applying one does.
    The port reads what it needs from the declaration (name, source, sha256, settings)."""

    def fetch(self, declared: Declared, progress: Progress | None) -> None:
        """Fetch, verify and register it, replacing what its name held."""
        ...

    def record(self, declared: Declared) -> None:
        """Take the held one over (managed) and record its source and runtime settings."""
        ...

    def remove(self, name: str) -> None: ...


class ModelsPort(HeldPort["DesiredModel"], Protocol):
    def observe(self) -> list[ObservedModel]: ...


class LorasPort(HeldPort["DesiredLora"], Protocol):
    def observe(self) -> list[ObservedLora]: ...


class ProjectorsPort(HeldPort["DesiredProjector"], Protocol):
    """Named after their model: `remove` takes the model's name."""

    def observe(self) -> list[ObservedProjector]: ...


class KeysPort(Protocol):
    def observe(self) -> list[ObservedKey]: ...

    def put(self, name: str, sha256: str, models: tuple[str, ...]) -> None: ...

    def remove(self, name: str) -> None: ...


class StatusPort(Protocol):
    def set_condition(
        self, kind: str, name: str, ready: bool, reason: str, message: str
    ) -> None: ...


@dataclass
class Ports:
    engines: EnginesPort
    models: ModelsPort
    loras: LorasPort
    keys: KeysPort
    status: StatusPort
    projectors: ProjectorsPort
