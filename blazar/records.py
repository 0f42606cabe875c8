"""What Blazar's store holds, as plain frozen dataclasses (`blazar.store` reads and writes them).

Kept apart from the store so that what only passes records around needs no database.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from specs.names import ModelName

HELD_KINDS = ("hardlink", "copy", "reference")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def utcnow_us() -> str:
    """To the microsecond: what least-recently-used orders by."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class ModelRecord:
    """One model Blazar holds, as the store records it."""

    name: str
    tag: str
    path: str
    held: str
    size: int
    sha256: str
    source: str
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    added_at: str = field(default_factory=utcnow)
    managed: bool = False  # a manifest owns it (created by apply), not `blazar import`
    settings: dict[str, Any] = field(default_factory=dict)  # runtime fields last applied

    @property
    def ref(self) -> ModelName:
        return ModelName(self.name, self.tag)

    @property
    def kind(self) -> str:
        """chat (a GGUF, or a safetensors set), transcription or speech (a set of files:
        `blazar.filesets`)."""
        kind = self.facts.get("kind")
        return kind if isinstance(kind, str) else "chat"

    @property
    def is_set(self) -> bool:
        """A directory of files (`blazar.filesets`), not one GGUF (or its shards)."""
        return self.kind != "chat" or self.facts.get("format") == "safetensors"

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["facts"] = json.dumps(self.facts, sort_keys=True)
        row["settings"] = json.dumps(self.settings, sort_keys=True)
        row["managed"] = int(self.managed)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelRecord:
        data = dict(row)
        data["facts"] = json.loads(data.get("facts") or "{}")
        data["settings"] = json.loads(data.get("settings") or "{}")
        data["managed"] = bool(data.get("managed"))
        return cls(**data)


@dataclass(frozen=True)
class LoraRecord:
    """A LoRA adapter Blazar holds, bound to its base model."""

    name: str
    model: str
    path: str
    size: int
    sha256: str
    source: str
    architecture: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    managed: bool = True
    added_at: str = field(default_factory=utcnow)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["settings"] = json.dumps(self.settings, sort_keys=True)
        row["managed"] = int(self.managed)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> LoraRecord:
        data = dict(row)
        data["settings"] = json.loads(data.get("settings") or "{}")
        data["managed"] = bool(data.get("managed"))
        return cls(**data)


@dataclass(frozen=True)
class ProjectorRecord:
    """A vision projector (mmproj GGUF) Blazar holds for a model (`models.NAME.mmproj`)."""

    model: str  # the model's short name
    path: str
    size: int
    sha256: str
    source: str  # as declared (a source, or "auto")
    facts: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    managed: bool = True
    added_at: str = field(default_factory=utcnow)

    @property
    def vision(self) -> bool:
        """It reads images (an audio-only projector does not)."""
        return bool(self.facts.get("vision", True))

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["facts"] = json.dumps(self.facts, sort_keys=True)
        row["settings"] = json.dumps(self.settings, sort_keys=True)
        row["managed"] = int(self.managed)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ProjectorRecord:
        data = dict(row)
        data["facts"] = json.loads(data.get("facts") or "{}")
        data["settings"] = json.loads(data.get("settings") or "{}")
        data["managed"] = bool(data.get("managed"))
        return cls(**data)


@dataclass(frozen=True)
class KeyRecord:
    name: str
    sha256: str
    models: tuple[str, ...]
    managed: bool = True
    added_at: str = field(default_factory=utcnow)


@dataclass(frozen=True)
class SessionRecord:
    """A saved KV session: which model, engine and cache it belongs to, and its file."""

    name: str
    model: str
    kind: str  # saved (by `blazar session save`) | bank (by the session bank)
    file: str  # the file's name under `Paths.sessions`
    n_tokens: int
    size: int
    model_sha256: str
    engine_tag: str
    cache_type: str
    created_at: str = field(default_factory=utcnow)
    last_used: str = field(default_factory=utcnow_us)


@dataclass(frozen=True)
class Condition:
    kind: str
    name: str
    type: str
    status: str
    reason: str
    message: str
    last_transition: str
    updated_at: str
