"""Migrations into a Blazar manifest: `blazar migrate ollama|llama-swap|config`.

`blazar.migrate.ollama` reads a local ollama store, `blazar.migrate.llama_swap` a
llama-swap config.yaml, `blazar.migrate.flat_config` the user guide's flat
config.toml; each returns a `Migrated`: the resources to declare and
every setting it could not carry over (`Unmapped`: where, what and why, with what
to do instead). `render` writes that as a TOML manifest whose header lists what
did not map, so nothing is dropped silently; the manifest is validated whole
before it is returned, and `write` puts it in place atomically, never over an
existing file without `force`. The result is an ordinary manifest: `blazar diff
FILE` shows what applying it would do and `blazar apply FILE` does it.
`blazar.cli.migrate` calls these; nothing here edits the user's own manifest.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from blazar.errors import AlreadyExists, BlazarError, InvalidInput
from specs.loader import ManifestError, load_manifest_text

_NAME_CHARS = re.compile(r"[^a-z0-9._-]+")


@dataclass(frozen=True)
class Unmapped:
    """One setting of the other runtime that the manifest does not carry."""

    where: str  # e.g. models.qwen.env, groups.big
    what: str  # the value, shortened
    why: str  # why not, and what to do instead

    def line(self) -> str:
        return f"{self.where}: {self.what} -- {self.why}"

    @classmethod
    def of(cls, where: str, what: Any, why: str) -> Unmapped:
        """One unmapped setting, its value shortened to a line."""
        return cls(where, _short(what), why)


@dataclass
class Migrated:
    """What a migration declares (section -> name -> fields; `serving` is one table) and
    what it could not."""

    origin: str
    serving: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # approximations worth a comment
    sections: dict[str, Any] = field(default_factory=dict)  # other top-level keys, as given

    def declare(self, section: str, name: str, fields: dict[str, Any]) -> None:
        self.resources.setdefault(section, {})[name] = fields

    def skip(self, where: str, what: Any, why: str) -> None:
        self.unmapped.append(Unmapped.of(where, what, why))

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "serving": self.serving,
            "resources": self.resources,
            "sections": self.sections,
            "unmapped": [asdict(u) for u in self.unmapped],
            "notes": self.notes,
        }


class MigrationFailed(BlazarError):
    """The migrated manifest would not be valid (a bug in the mapping: report it)."""


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clean_name(text: str) -> str:
    """A Blazar model name from another runtime's: lowercase, [a-z0-9._-], one `:tag`."""
    base, colon, tag = text.lower().partition(":")
    base = _NAME_CHARS.sub("-", base).strip("-._") or "model"
    tag = _NAME_CHARS.sub("-", tag.replace(":", "-")).strip("-._")
    return f"{base}:{tag}" if colon and tag and tag != "latest" else base


def unique(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`, ... when it is taken; recorded as taken."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        base, colon, tag = name.partition(":")
        candidate = f"{base}-{n}{colon}{tag}"
    taken.add(candidate)
    return candidate


def render(
    migrated: Migrated, command: str, where: str = "<migrated>", *, as_given: bool = False
) -> str:
    """The manifest as TOML, its header naming the origin and listing what did not map;
    validated whole: MigrationFailed if it would not load, or with `as_given` (values
    copied as the user wrote them, which may be wrong) an InvalidInput naming them."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"Migrated from {migrated.origin} by `{command}`."))
    doc.add(tomlkit.comment("Check it with `blazar diff FILE`, then `blazar apply FILE`."))
    for note in migrated.notes:
        doc.add(tomlkit.comment(note))
    if migrated.unmapped:
        doc.add(tomlkit.comment(""))
        doc.add(tomlkit.comment(f"Not mapped ({len(migrated.unmapped)}):"))
        for item in migrated.unmapped:
            doc.add(tomlkit.comment(f"  {item.line()}"))
    doc.add(tomlkit.nl())
    if migrated.serving:
        serving = tomlkit.table()
        for key, value in migrated.serving.items():
            serving[key] = value
        doc["serving"] = serving
    for key, value in migrated.sections.items():
        doc[key] = value
    for section in ("engines", "models", "loras", "groups", "keys", "remotes", "mcp"):
        named = migrated.resources.get(section)
        if not named:
            continue
        outer = tomlkit.table(is_super_table=True)
        for name, fields in named.items():
            table = tomlkit.table()
            for key, value in fields.items():
                table[key] = value
            outer[name] = table
        doc[section] = outer
    text = tomlkit.dumps(doc)
    try:
        load_manifest_text(text, where)
    except ManifestError as exc:
        if as_given:
            raise InvalidInput(
                f"the settings of {migrated.origin} would not make a valid manifest:\n{exc}\n"
                "fix them there and run this again"
            ) from None
        raise MigrationFailed(
            f"the migrated manifest would not be valid (please report this):\n{exc}"
        ) from None
    return text


def write(path: Path, text: str, *, force: bool = False) -> None:
    """Put the manifest at `path` atomically; never over an existing file without `force`."""
    if path.exists() and not force:
        raise AlreadyExists(f"{path} exists: pass --force to replace it, or give another -o FILE")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["Migrated", "MigrationFailed", "Unmapped", "clean_name", "render", "unique", "write"]
