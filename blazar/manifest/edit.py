"""Edit the user's manifest the way a person would: tomlkit keeps comments, order and format.

Imperative commands (`pull`, `rm`, `config set`) change the manifest and then
reconcile, so the manifest stays the one source of truth. Every edit is
validated as a whole manifest before it is written, and written atomically
(temporary file + rename); `restore()` puts the previous text back when the
reconcile that follows an edit fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import Table

from blazar.errors import InvalidInput, NotFound
from specs.loader import ManifestError, load_manifest_text

_SEGMENT = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_:.$-]+?))\s*(?:\.|$)')


def split_key(key: str) -> list[str]:
    """`models."qwen3:0.6b".ctx` -> ["models", "qwen3:0.6b", "ctx"]; quotes keep dots inside."""
    parts: list[str] = []
    pos = 0
    text = key.strip()
    if not text:
        raise InvalidInput("empty key: use a dotted key such as serving.port")
    while pos < len(text):
        match = _SEGMENT.match(text, pos)
        if not match or match.end() == pos:
            raise InvalidInput(
                f"bad key {key!r}: use dotted segments, quoting any with dots or colons, "
                'e.g. models."qwen3:0.6b".ctx'
            )
        quoted, single, bare = match.groups()
        parts.append(quoted if quoted is not None else single if single is not None else bare)
        pos = match.end()
    if text.endswith("."):
        raise InvalidInput(f"bad key {key!r}: it ends with '.'")
    return parts


def parse_value(text: str) -> Any:
    """A TOML literal when the text is one (8192, true, "x", [1, 2]), else the text itself."""
    try:
        return tomlkit.parse(f"v = {text}")["v"]
    except tomlkit.exceptions.TOMLKitError:
        return text


class ManifestFile:
    """The user's TOML manifest, loaded for editing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.original = path.read_text() if path.exists() else None
        try:
            self.doc = tomlkit.parse(self.original or "")
        except tomlkit.exceptions.TOMLKitError as exc:
            raise InvalidInput(f"{path} is not valid TOML ({exc}); fix it first") from None

    def get(self, key: str) -> Any:
        node: Any = self.doc
        for part in split_key(key):
            if not isinstance(node, dict) or part not in node:
                raise NotFound(f"{key} is not set in {self.path}")
            node = node[part]
        return node.unwrap() if hasattr(node, "unwrap") else node

    def set(self, key: str, value: Any) -> None:
        parts = split_key(key)
        node: Any = self.doc
        for part in parts[:-1]:
            if part not in node:
                node[part] = tomlkit.table()
            node = node[part]
            if not isinstance(node, dict):
                raise InvalidInput(f"cannot set {key}: {part} is a value, not a table")
        node[parts[-1]] = value

    def unset(self, key: str) -> None:
        parts = split_key(key)
        node: Any = self.doc
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return
        if isinstance(node, dict) and parts[-1] in node:
            del node[parts[-1]]

    def declares(self, section: str, name: str) -> bool:
        table = self.doc.get(section)
        return isinstance(table, dict) and name in table

    def add_resource(self, section: str, name: str, fields: dict[str, Any]) -> None:
        if section not in self.doc:
            self.doc[section] = tomlkit.table(is_super_table=True)
        table = tomlkit.table()
        for key, value in fields.items():
            table[key] = value
        self.doc[section][name] = table  # type: ignore[index]

    def remove_resource(self, section: str, name: str) -> None:
        table = self.doc.get(section)
        if isinstance(table, Table | dict) and name in table:
            del table[name]

    def text(self) -> str:
        return tomlkit.dumps(self.doc)

    def validate(self) -> None:
        """Load the edited text as a whole manifest; raise ManifestError if it is not valid."""
        load_manifest_text(self.text(), str(self.path))

    def save(self) -> None:
        """Validate, then write atomically."""
        self.validate()
        _atomic_write(self.path, self.text())

    def restore(self) -> None:
        """Put back the text this file had when loaded."""
        if self.original is None:
            self.path.unlink(missing_ok=True)
        else:
            _atomic_write(self.path, self.original)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["ManifestError", "ManifestFile", "parse_value", "split_key"]
