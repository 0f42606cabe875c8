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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Item, Table

from blazar.errors import InvalidInput, NotFound
from specs.loader import ManifestError, load_manifest_text
from specs.problems import format_path

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
        found = self.lookup(split_key(key))
        if found is _ABSENT:
            raise NotFound(f"{key} is not set in {self.path}")
        return found

    def lookup(self, parts: Sequence[str]) -> Any:
        """The plain value at `parts`, or `ABSENT` when the manifest does not set it."""
        node: Any = self.doc
        for part in parts:
            node = _child(node, part)
            if node is None:
                return _ABSENT
        return node.unwrap() if hasattr(node, "unwrap") else node

    def set(self, key: str, value: Any) -> None:
        self.set_parts(split_key(key), value, key)

    def set_parts(self, parts: Sequence[str], value: Any, key: str | None = None) -> None:
        """Set the value at `parts` (the dotted `key`, split), making the tables on the way;
        an entry of a `[[keys]]`-shaped section is found (or added) by its name."""
        node: Any = self.doc
        for part in parts[:-1]:
            child = _child(node, part)
            if child is None:
                child = tomlkit.table()
                if isinstance(node, AoT):
                    child["name"] = part
                    node.append(child)
                    child = node[-1]
                else:
                    node[part] = child
                    child = node[part]
            node = child
            if not isinstance(node, dict | AoT):
                shown = key or ".".join(parts)
                raise InvalidInput(f"cannot set {shown}: {part} is a value, not a table")
        if isinstance(node, AoT):
            shown = key or ".".join(parts)
            raise InvalidInput(f"cannot set {shown}: set the fields of that entry one by one")
        # A plain value: a parsed item keeps the trivia of its own snippet (no line end),
        # which runs into the next line inside an array of tables.
        node[parts[-1]] = value.unwrap() if isinstance(value, Item) else value

    def unset(self, key: str) -> bool:
        """Remove `key` (a value, or a whole table); False when it was not set."""
        return self.unset_parts(split_key(key))

    def unset_parts(self, parts: Sequence[str]) -> bool:
        """As `unset`, for a key already split."""
        node: Any = self.doc
        for part in parts[:-1]:
            node = _child(node, part)
            if node is None:
                return False
        if isinstance(node, AoT):
            return self._drop_entry(node, parts[-1])
        if isinstance(node, dict) and parts[-1] in node:
            del node[parts[-1]]
            return True
        return False

    def merge(self, settings: Iterable[tuple[Sequence[str], Any]], *, force: bool) -> list[str]:
        """Set each (key parts, value) not already set to it; a key set to another value is
        a conflict: listed (`key: VALUE here, VALUE given`) and left as it is unless `force`."""
        conflicts = []
        for parts, value in settings:
            have = self.lookup(parts)
            if have is not _ABSENT and have != value:
                conflicts.append(f"{format_path(tuple(parts))}: {have!r} here, {value!r} given")
                if not force:
                    continue
            self.set_parts(parts, value)
        return conflicts

    def declares(self, section: str, name: str) -> bool:
        return _child(self.doc.get(section), name) is not None

    def add_resource(self, section: str, name: str, fields: dict[str, Any]) -> None:
        table = tomlkit.table()
        current = self.doc.get(section)
        if isinstance(current, AoT):  # the `[[keys]]` shape: the entry names itself
            table["name"] = name
            for key, value in fields.items():
                table[key] = value
            current.append(table)
            return
        if section not in self.doc:
            self.doc[section] = tomlkit.table(is_super_table=True)
        for key, value in fields.items():
            table[key] = value
        self.doc[section][name] = table  # type: ignore[index]

    def remove_resource(self, section: str, name: str) -> None:
        table = self.doc.get(section)
        if isinstance(table, AoT):
            self._drop_entry(table, name)
        elif isinstance(table, Table | dict) and name in table:
            del table[name]

    @staticmethod
    def _drop_entry(entries: AoT, name: str) -> bool:
        for index, entry in enumerate(entries):
            if isinstance(entry, dict) and entry.get("name") == name:
                del entries[index]
                return True
        return False

    def text(self) -> str:
        return tomlkit.dumps(self.doc)

    def validate(self) -> None:
        """Load the edited text as a whole manifest; raise ManifestError if it is not valid,
        or sets what this installation cannot act on (`blazar.reconcile.apply.supported`)."""
        from blazar.reconcile.apply import supported

        supported(load_manifest_text(self.text(), str(self.path)))

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


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


_ABSENT: Any = _Absent()
ABSENT = _ABSENT  # what `ManifestFile.lookup` returns for a key the manifest does not set


def _child(node: Any, part: str) -> Any:
    """`node[part]`: a table's key, or the entry named `part` of an array of tables (the
    user guide's `[[keys]]` shape); None when there is none."""
    if isinstance(node, AoT):
        return next((e for e in node if isinstance(e, dict) and e.get("name") == part), None)
    if isinstance(node, dict):
        return node.get(part)
    return None


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


__all__ = ["ABSENT", "ManifestError", "ManifestFile", "parse_value", "split_key"]
