"""The ports: the only way reconcilers touch the world.

`blazar.wiring` supplies real implementations (store, registry, engine
lanes, model sources); tests supply in-memory fakes. Observed state comes
back as the plain values below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class ObservedEngine:
    kind: str
    tag: str
    method: str
    version: str
    active: bool


@dataclass(frozen=True)
class ObservedModel:
    name: str  # short form: name, or name:tag
    sha256: str
    source: str
    size: int
    managed: bool  # created by apply (a manifest owns it) rather than `blazar import`
    settings: dict[str, Any] = field(default_factory=dict)  # runtime fields last applied


@dataclass(frozen=True)
class ObservedLora:
    name: str
    model: str
    sha256: str
    source: str
    managed: bool
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ObservedKey:
    name: str
    sha256: str
    models: tuple[str, ...]
    managed: bool


class EnginesPort(Protocol):
    def observe(self) -> list[ObservedEngine]: ...

    def expected_tag(self, method: str, version: str, backend: str) -> str:
        """The tag a pinned version installs as (no I/O)."""
        ...

    def install(self, kind: str, method: str, version: str | None, options: dict[str, Any]) -> str:
        """Install an engine; return its tag."""
        ...

    def activate(self, kind: str, tag: str) -> None: ...


class ModelsPort(Protocol):
    def observe(self) -> list[ObservedModel]: ...

    def fetch(
        self,
        name: str,
        source: str,
        sha256: str | None,
        settings: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        """Fetch, verify and register a model, replacing any model of that name."""
        ...

    def record_settings(self, name: str, source: str, settings: dict[str, Any]) -> None:
        """Take the model over (managed) and record its source and runtime settings."""
        ...

    def remove(self, name: str) -> None: ...


class LorasPort(Protocol):
    def observe(self) -> list[ObservedLora]: ...

    def fetch(
        self,
        name: str,
        model: str,
        source: str,
        sha256: str | None,
        settings: dict[str, Any],
        progress: Progress | None,
    ) -> None: ...

    def record_settings(self, name: str, source: str, settings: dict[str, Any]) -> None: ...

    def remove(self, name: str) -> None: ...


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
