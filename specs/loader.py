"""Loading a manifest: TOML or YAML files, or a directory of them, into a Manifest.

The CLI and the control loop call `load_manifest(path)`; tests and commands
that validate text before writing it call `load_manifest_text`. Everything
wrong is collected in one pass (syntax errors in each file, unknown fields,
types, values, duplicates, dangling references) and raised as one
ManifestError whose lines read `blazar.toml:15: unknown field 'ctxx' in
models.other; did you mean 'ctx'?`.

A directory is merged file by file in sorted name order: the `*.toml`,
`*.yaml` and `*.yml` files directly in it, not hidden ones; the rest is
ignored. Resources (`engines`, `models`, `loras`, `groups`, `keys`, `remotes`, `mcp`) are
tables keyed by name, so one name declared in two files is an error naming
both places; `keys` and `remotes` may also be written as the user guide writes
them, arrays of tables whose entries name themselves (`[[keys]]` with
`name = "alice"`: `name_arrays`). `serving` and `kubernetes` merge field
by field: each field may be set in one file only. `$schema` may appear in
every file (it is for editors); `version` may repeat if it agrees.

Host overlays (docs/fleet.md): a directory may hold `hosts/NAME.toml` (or
`.yaml`, `.yml`); `load_manifest(path, host=NAME)` merges that file over the
base: tables merge key by key and a key the overlay sets wins (lists are
replaced whole). Any resource table with `enabled = false`, in the base or the
overlay, is removed before validation. The host name is the caller's to find
(`blazar` reads the machine's); this module stays pure.

The only I/O here is reading the manifest files.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

import yaml
from pydantic import ValidationError

from specs.aliases import NAMED_ARRAYS
from specs.explain import describe, explain, findings_to_problems
from specs.manifest import Manifest
from specs.problems import FindingsError, Location, ManifestError, Path, Problem, format_path
from specs.references import reference_findings
from specs.toml_locations import toml_locations

__all__ = [
    "Location",
    "ManifestError",
    "Problem",
    "load_manifest",
    "load_manifest_files",
    "load_manifest_text",
    "manifest_files",
    "overlay_file",
]

SUFFIXES = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
RESOURCES = ("engines", "models", "loras", "groups", "keys", "remotes", "mcp")
MERGED_BY_FIELD = ("serving", "kubernetes")
HOSTS = "hosts"  # the overlays' folder in a manifest directory
_TOML_WHERE = re.compile(r"^(.*) \(at line (\d+), column (\d+)\)$", re.S)


@dataclass
class Document:
    """One parsed file: its data and where each path in it was declared."""

    file: str
    data: dict[str, Any] = field(default_factory=dict)
    origins: dict[Path, Location] = field(default_factory=dict)


def load_manifest(path: FsPath | str, host: str | None = None) -> Manifest:
    """Load and validate the manifest at `path`: a .toml/.yaml/.yml file or a directory;
    with `host`, the directory's overlay for that host merged over it (`overlay_file`;
    an error when it has none)."""
    root = FsPath(path)
    if root.is_dir():
        paths = manifest_files(root)
    elif not root.exists():
        raise ManifestError([Problem("no such manifest file or directory", str(root))])
    elif root.suffix not in SUFFIXES:
        raise ManifestError(
            [Problem("a manifest is a .toml, .yaml or .yml file, or a directory", str(root))]
        )
    else:
        paths = [root]
    overlay: FsPath | None = None
    if host is not None:
        overlay = overlay_file(root, host)
        if overlay is None:
            where = root / HOSTS if root.is_dir() else root
            known = ", ".join(hosts(root)) or "none"
            raise ManifestError(
                [
                    Problem(
                        f"no overlay for host {host!r} in {where} (hosts there: {known})", str(root)
                    )
                ]
            )
    files: list[tuple[str, str]] = []
    unreadable: list[Problem] = []
    for each in [*paths, *([overlay] if overlay else [])]:
        try:
            files.append((str(each), each.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            unreadable.append(Problem(f"cannot read the manifest: {exc}", str(each)))
    if overlay is not None and files and files[-1][0] == str(overlay):
        loaded = _load(files[:-1], unreadable, overlay=files[-1])
    else:
        loaded = _load(files, unreadable)
    return loaded.with_source(str(root.resolve()))


def manifest_files(root: FsPath) -> list[FsPath]:
    """The files a manifest directory merges, in order (the overlays in hosts/ are not
    among them)."""
    return sorted(
        p for p in root.iterdir() if p.suffix in SUFFIXES and p.is_file() and p.name[0] != "."
    )


def overlay_file(root: FsPath, host: str) -> FsPath | None:
    """The overlay a manifest directory holds for `host` (`hosts/HOST.toml`, `.yaml` or
    `.yml`); None when it holds none, or `root` is a file."""
    if not root.is_dir():
        return None
    found = [root / HOSTS / f"{host}{suffix}" for suffix in SUFFIXES]
    found = [f for f in found if f.is_file()]
    if len(found) > 1:
        names = " and ".join(str(f) for f in found)
        raise ManifestError([Problem(f"host {host!r} has two overlays: {names}; keep one")])
    return found[0] if found else None


def hosts(root: FsPath) -> list[str]:
    """The host names a manifest directory has overlays for, sorted."""
    folder = root / HOSTS
    if not root.is_dir() or not folder.is_dir():
        return []
    return sorted(
        {
            p.stem
            for p in folder.iterdir()
            if p.suffix in SUFFIXES and p.is_file() and p.name[0] != "."
        }
    )


def load_manifest_text(text: str, filename: str = "blazar.toml") -> Manifest:
    """Load manifest text as if read from `filename` (its suffix picks TOML or YAML)."""
    return load_manifest_files([(filename, text)]).with_source(str(FsPath(filename).resolve()))


def load_manifest_files(files: Sequence[tuple[str, str]]) -> Manifest:
    """Merge (filename, text) pairs, in the order given, into one validated Manifest."""
    return _load(files, [])


def _load(
    files: Sequence[tuple[str, str]],
    problems: list[Problem],
    overlay: tuple[str, str] | None = None,
) -> Manifest:
    documents: list[Document] = []
    unread = bool(problems)  # a file that could not be read: references into it would dangle
    for name, text in [*files, *([overlay] if overlay else [])]:
        document, found = parse_document(name, text)
        problems += found
        unread = unread or document is None
        if document is not None:
            problems += name_arrays(document)
            documents.append(document)
    over = (
        documents.pop()
        if overlay is not None and documents and documents[-1].file == overlay[0]
        else None
    )
    data, origins, found = merge(documents)
    problems += found
    if over is not None:
        overlay_onto(data, origins, over)
    drop_disabled(data, origins)

    def locate(path: Path) -> Location | None:
        for end in range(len(path), -1, -1):
            if (where := origins.get(path[:end])) is not None:
                return where
        return None

    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        problems += explain(exc, locate, references=not unread)
        if not unread and not _checked_references(exc):
            # The manifest's own reference check runs only once every field is valid.
            problems += findings_to_problems(reference_findings(data), locate)
    else:
        if not problems:
            return manifest.with_origins(origins)
    raise ManifestError(list(dict.fromkeys(problems)))


def _checked_references(error: ValidationError) -> bool:
    return any(isinstance((e.get("ctx") or {}).get("error"), FindingsError) for e in error.errors())


def parse_document(name: str, text: str) -> tuple[Document | None, list[Problem]]:
    """Parse one file by its suffix; None when it could not be parsed at all."""
    kind = SUFFIXES.get(FsPath(name).suffix)
    if kind is None:
        return None, [Problem("a manifest file ends in .toml, .yaml or .yml", name)]
    document, problems = (_parse_toml if kind == "toml" else _parse_yaml)(name, text)
    if document is not None and not isinstance(document.data, dict):
        what = "a list" if isinstance(document.data, list) else "a single value"
        problem = Problem(
            f"the top level of a manifest is a table of sections "
            f"(serving, engines, models, ...), not {what}",
            name,
            1,
            1,
        )
        return None, [*problems, problem]
    return document, problems


def _parse_toml(name: str, text: str) -> tuple[Document | None, list[Problem]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message, line, column = str(exc), None, None
        if match := _TOML_WHERE.match(message):
            message, line, column = match.group(1), int(match.group(2)), int(match.group(3))
        message = message[:1].lower() + message[1:]
        return None, [Problem(f"invalid TOML: {message}", name, line, column)]
    origins = {p: Location(name, ln, col) for p, (ln, col) in toml_locations(text).items()}
    return Document(name, data, origins), []


def _parse_yaml(name: str, text: str) -> tuple[Document | None, list[Problem]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(name, {}, {(): Location(name, 1, 1)}), []
        reader = _YamlReader(name, loader)
        data = reader.convert(node, ())
        return Document(name, data, reader.origins), reader.problems
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or "invalid YAML"
        if exc.context and exc.context.startswith("while"):
            message += f" ({exc.context})"
        elif exc.context:  # "expected a single document in the stream, but found another"
            message = f"{exc.context}, {message}"
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        return None, [Problem(f"invalid YAML: {message}", name, line, column)]
    except yaml.YAMLError as exc:
        return None, [Problem(f"invalid YAML: {exc}", name)]
    finally:
        loader.dispose()


class _YamlReader:
    """Plain data from a composed YAML node tree, noting each key's line and duplicates."""

    def __init__(self, name: str, loader: yaml.SafeLoader) -> None:
        self.name = name
        self.loader = loader
        self.origins: dict[Path, Location] = {}
        self.problems: list[Problem] = []
        self.active: set[int] = set()

    def at(self, node: yaml.Node) -> Location:
        return Location(self.name, node.start_mark.line + 1, node.start_mark.column + 1)

    def convert(self, node: yaml.Node, path: Path) -> Any:
        self.origins.setdefault(path, self.at(node))
        if id(node) in self.active:
            self.problems.append(self._problem(node, path, "a YAML alias refers to itself"))
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
            return self.loader.construct_object(node)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        self.loader.flatten_mapping(node)  # resolves `<<` merge keys
        out: dict[str, Any] = {}
        seen: dict[str, Location] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(self._problem(key_node, path, "a key must be plain text"))
                continue
            key = str(key_node.value)  # as written: `1.0` and `yes` stay names, not numbers
            here = self.at(key_node)
            if key in seen:
                message = f"{format_path((*path, key))} declared twice: {seen[key]} and {here}"
                self.problems.append(self._problem(key_node, (*path, key), message))
                continue
            seen[key] = here
            self.origins.setdefault((*path, key), here)
            out[key] = self.convert(value_node, (*path, key))
        return out

    def _problem(self, node: yaml.Node, path: Path, message: str) -> Problem:
        where = self.at(node)
        return Problem(message, where.file, where.line, where.column, format_path(path))


def name_arrays(document: Document) -> list[Problem]:
    """Turn, in place, the user guide's arrays of tables (`[[keys]]` with `name = "alice"`)
    into the manifest's tables by name (`[keys.alice]`), for the sections in
    `specs.aliases.NAMED_ARRAYS`; an entry without a usable name, or a name given twice,
    is a problem at its line (and is left out)."""
    problems: list[Problem] = []
    for section in NAMED_ARRAYS:
        entries = document.data.get(section)
        if not isinstance(entries, list):
            continue
        named: dict[str, Any] = {}
        moved: dict[Path, Location] = {}
        for index, entry in enumerate(entries):
            where = document.origins.get((section, index)) or Location(document.file)
            label = f"{section}[{index}]"
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(entry, dict):
                message = f"{label} is {describe(entry)}: each [[{section}]] entry is a table"
            elif not isinstance(name, str) or not name:
                got = "has no name" if name is None else f"has name = {describe(name)}"
                message = (
                    f'{label} {got}: each [[{section}]] entry needs `name = "..."` '
                    f"(or write it as [{section}.NAME])"
                )
            elif name in named:
                first = moved.get((section, name), Location(document.file))
                message = f"{section}.{name} declared twice: {first} and {where}"
            else:
                named[name] = {k: v for k, v in entry.items() if k != "name"}
                for path, at in document.origins.items():
                    if path[:2] == (section, index) and path[2:3] != ("name",):
                        moved[(section, name, *path[2:])] = at
                continue
            problems.append(Problem(message, where.file, where.line, where.column, label))
        for path in [p for p in document.origins if p[:1] == (section,) and len(p) > 1]:
            del document.origins[path]
        document.origins.update(moved)
        document.data[section] = named
    return problems


def merge(
    documents: Iterable[Document],
) -> tuple[dict[str, Any], dict[Path, Location], list[Problem]]:
    """One document from several, refusing a name declared in two places."""
    data: dict[str, Any] = {}
    origins: dict[Path, Location] = {}
    problems: list[Problem] = []
    for document in documents:
        taken: set[Path] = set()  # the prefixes whose origins come from this document
        for key, value in document.data.items():
            mergeable = key in RESOURCES or key in MERGED_BY_FIELD
            if mergeable and isinstance(value, dict) and isinstance(data.get(key, {}), dict):
                target = data.setdefault(key, {})
                if (key,) not in origins and (key,) in document.origins:
                    origins[(key,)] = document.origins[(key,)]
                for name, body in value.items():
                    path: Path = (key, name)
                    if name in target:
                        problems.append(_twice(path, origins, document))
                        continue
                    target[name] = body
                    taken.add(path)
            elif key == "$schema" and key in data:
                continue  # each file may name a schema for its editor
            elif key in data and not (key == "version" and data[key] == value):
                problems.append(_twice((key,), origins, document))
            elif key not in data:
                data[key] = value
                taken.add((key,))
        for declared, where in document.origins.items():
            if declared[:1] in taken or declared[:2] in taken:
                origins.setdefault(declared, where)
    return data, origins, problems


def overlay_onto(data: dict[str, Any], origins: dict[Path, Location], overlay: Document) -> None:
    """Merge a host overlay over the merged base, in place: tables key by key, the
    overlay's value wins for every key it sets (a list replaces the base's whole); where
    each value came from follows it."""

    def walk(into: dict[str, Any], value: dict[str, Any], path: Path) -> None:
        for key, item in value.items():
            here: Path = (*path, key)
            if isinstance(item, dict) and isinstance(into.get(key), dict):
                walk(into[key], item, here)
                continue
            into[key] = item
            for stale in [p for p in origins if p[: len(here)] == here]:
                del origins[stale]
            for declared, where in overlay.origins.items():
                if declared[: len(here)] == here:
                    origins[declared] = where

    walk(data, overlay.data, ())
    for declared, where in overlay.origins.items():
        origins.setdefault(declared, where)


def drop_disabled(data: dict[str, Any], origins: dict[Path, Location]) -> None:
    """Remove, in place, every resource table set `enabled = false`; `enabled = true` is
    the default and stays."""
    for section in RESOURCES:
        tables = data.get(section)
        if not isinstance(tables, dict):
            continue
        for name in [n for n, body in tables.items() if isinstance(body, dict)]:
            if tables[name].get("enabled") is False:
                del tables[name]
                for gone in [p for p in origins if p[:2] == (section, name)]:
                    del origins[gone]


def _twice(path: Path, origins: dict[Path, Location], document: Document) -> Problem:
    first = origins.get(path)
    again = document.origins.get(path) or Location(document.file)
    message = f"{format_path(path)} declared twice: {first} and {again}"
    return Problem(message, again.file, again.line, again.column, format_path(path))
