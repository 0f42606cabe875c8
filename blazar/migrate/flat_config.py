"""`blazar migrate config [PATH]`: the user guide's flat config.toml, as manifest content.

The user guide writes Blazar's settings flat, in `~/.config/blazar/config.toml`:
`port = 11434`, `slots = 2`, `[model_overrides.gemma] pin = true`,
`[engine_routing] policy = "fastest"`, and `[[keys]]` and `[[remotes]]` arrays of
tables. Blazar reads only its manifest, so that file is not read (and
`blazar.paths.unread_config_warning` says so); this module maps it with the table
`blazar config set` reads too (`specs.aliases`): each of the guide's names becomes
its manifest key, `model_overrides.NAME.FIELD` `models.NAME.FIELD`, each `[[keys]]`
entry `[keys.NAME]` (a plaintext `key` replaced by its sha256, never written down),
each `[[remotes]]` entry `[remotes.NAME]`. Keys already spelled as the manifest
spells them (`[serving]`, `[models.x]`) are taken as they are. What cannot be
carried over is listed with why and what to do instead (`blazar.migrate.Unmapped`):
a per-model name given for the whole server (`ctx_extend`, `warm_peg`), a feature not
in this version, an unknown name (with the closest keys),
an override of a model the manifest does not declare.

`read_flat_config` reads the file into a `FlatConfig` (settings by manifest key);
`for_manifest` resolves its model overrides against the user's manifest;
`as_migrated` makes it a manifest of its own for `blazar.migrate.render`. The CLI
(`blazar.cli.migrate`) writes that, or merges the settings into the user's manifest
(`blazar.manifest.edit.ManifestFile.merge`). Pure apart from reading the one file.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blazar.errors import InvalidInput, NotFound
from blazar.migrate import Migrated, Unmapped
from specs.aliases import NAMED_ARRAYS, resolve, shown_key, unknown_message
from specs.manifest import Manifest
from specs.problems import format_path

Key = tuple[str, ...]
RESOURCE_SECTIONS = ("engines", "models", "loras", "keys", "remotes", "mcp")
_PLAINTEXT_KEY = "key"  # a [[keys]] entry may carry the key itself: only its sha256 is kept


@dataclass
class FlatConfig:
    """A flat config file in the manifest's keys: each setting by its key's segments
    (`("serving", "port")`), in the file's order, and what could not be carried over."""

    origin: str
    settings: dict[Key, Any] = field(default_factory=dict)
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def skip(self, where: str, what: Any, why: str) -> None:
        self.unmapped.append(Unmapped.of(where, what, why))


def read_flat_config(path: Path) -> FlatConfig:
    """The settings of the flat config file at `path`, mapped to the manifest's keys."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(
            f"{path} does not exist: `blazar migrate config PATH` names the file to convert"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{path} is not valid TOML ({exc}); fix it first") from None
    return map_flat(data, f"the flat config {path}")


def map_flat(data: dict[str, Any], origin: str) -> FlatConfig:
    """`read_flat_config` without the file: the mapping itself."""
    out = FlatConfig(origin)
    for name, value in data.items():
        if name in NAMED_ARRAYS and isinstance(value, list):
            _named_entries(out, name, value)
        else:
            for parts, leaf in _leaves((name,), value):
                _setting(out, parts, leaf)
    return out


def _leaves(prefix: Key, value: Any) -> list[tuple[Key, Any]]:
    """Each value under `prefix`, by its full key: tables are walked, the rest are leaves."""
    if not isinstance(value, dict) or not value:
        return [(prefix, value)]
    found: list[tuple[Key, Any]] = []
    for key, item in value.items():
        found += _leaves((*prefix, key), item)
    return found


def _setting(out: FlatConfig, parts: Key, value: Any) -> None:
    given = format_path(parts)
    resolved = resolve(given, list(parts))
    why = resolved.refusal or unknown_message(resolved)
    if why is not None:
        out.skip(given, value, why)
        return
    if resolved.parts in out.settings:
        out.skip(given, value, f"{resolved.key} is set twice in the file: the first is kept")
        return
    out.settings[resolved.parts] = value


def _named_entries(out: FlatConfig, section: str, entries: list[Any]) -> None:
    """`[[keys]]` / `[[remotes]]`: each entry a table named by its `name`."""
    for index, entry in enumerate(entries):
        where = f"{section}[{index}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            out.skip(where, entry, f'each [[{section}]] entry needs name = "..."')
            continue
        fields = {k: v for k, v in entry.items() if k != "name"}
        if section == "keys" and _PLAINTEXT_KEY in fields:
            secret = fields.pop(_PLAINTEXT_KEY)
            if "sha256" in fields or not isinstance(secret, str) or not secret:
                out.skip(f"{where}.key", "(a key)", "give the key or its sha256, not both")
                continue
            fields["sha256"] = hashlib.sha256(secret.encode()).hexdigest()
            out.notes.append(f"keys.{name}: the key's sha256 only (the key itself is not kept)")
        elif section == "keys" and "sha256" not in fields:
            out.skip(where, entry, "an API key needs its key (key = ...) or sha256")
            continue
        if section == "remotes" and {"key", "api_key"} & set(fields):
            for secret in sorted({"key", "api_key"} & set(fields)):
                fields.pop(secret)
                out.skip(
                    f"{where}.{secret}",
                    "(a key)",
                    "Blazar reads a remote's key from an environment variable: put it in one "
                    "and set key_env",
                )
        for parts, value in _leaves((section, name), fields):
            _setting(out, parts, value)


def for_manifest(flat: FlatConfig, manifest: Manifest) -> FlatConfig:
    """The settings with each model override keyed as `manifest` declares that model
    (`qwen3-0.6b` may be `"qwen3:0.6b"` there, or an alias); an override of a model the
    manifest does not declare is listed: a model needs its source first."""
    out = replace(flat, settings={}, unmapped=list(flat.unmapped), notes=list(flat.notes))
    warned: set[str] = set()
    for parts, value in flat.settings.items():
        if parts[0] != "models" or len(parts) < 3 or parts[2] == "source":
            out.settings[parts] = value
            continue
        name = parts[1]
        declared = manifest.resolve_model(name)
        declares_source = (*parts[:2], "source") in flat.settings
        if declared is None and declares_source:
            out.settings[parts] = value
        elif declared is None:
            if name not in warned:
                out.skip(
                    format_path(parts[:2]),
                    {k[2]: v for k, v in flat.settings.items() if k[:2] == parts[:2]},
                    f"model {name!r} is not declared in the manifest: `blazar pull {name}` (or "
                    f"declare it), then `blazar config set {shown_key(parts)} VALUE`",
                )
                warned.add(name)
        else:
            out.settings[("models", declared, *parts[2:])] = value
    return out


def as_migrated(flat: FlatConfig, manifest: Manifest) -> Migrated:
    """A manifest of its own for `render`: the settings, and each overridden model's
    declaration from the user's manifest under its overrides (a model needs its source)."""
    migrated = Migrated(origin=flat.origin, notes=list(flat.notes), unmapped=list(flat.unmapped))
    tree: dict[str, Any] = {}
    for name in sorted({p[1] for p in flat.settings if p[0] == "models" and len(p) > 2}):
        if name in manifest.models:
            declared = manifest.models[name].model_dump(mode="json", exclude_unset=True)
            tree.setdefault("models", {})[name] = declared
            migrated.notes.append(
                f"models.{name}: its declaration from the manifest, with the file's overrides"
            )
    for parts, value in flat.settings.items():
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    migrated.serving = tree.pop("serving", {})
    for section in RESOURCE_SECTIONS:
        for name, fields in tree.pop(section, {}).items():
            migrated.declare(section, name, fields)
    for name in sorted(_engines_named(migrated)):
        if name in manifest.engines and name not in migrated.resources.get("engines", {}):
            declared = manifest.engines[name].model_dump(mode="json", exclude_unset=True)
            migrated.declare("engines", name, declared)
    migrated.sections = tree
    return migrated


def _engines_named(migrated: Migrated) -> set[str]:
    """The engines the models of `migrated` name (`engine = "NAME"`)."""
    models = migrated.resources.get("models", {}).values()
    return {m["engine"] for m in models if isinstance(m.get("engine"), str)}


__all__ = ["FlatConfig", "as_migrated", "for_manifest", "map_flat", "read_flat_config"]
