"""The user guide's configuration names, as aliases of the manifest's keys.

The user guide, and the flat `~/.config/blazar/config.toml` it describes, speak
of `port`, `slots` and `model_overrides.<model>.pin`; the manifest of
`serving.port`, `serving.default_slots` and `models.<model>.pin`. `ALIASES` maps
one onto the other. `blazar config get|set|unset` accepts either spelling and
says which key it wrote (`resolve`), `blazar migrate config` converts a flat
file with the same table, the loader names the key a flat name stands for
(`hint_for`), and docs/manifest.md prints the table (`specs.schema`). For a key
that is neither, `suggest` offers the closest manifest keys and aliases.

Some names the guide gives have no serving-wide key: `ctx_extend`, `spec` and
`warm_peg` are set per model, so their flat form is refused with the per-model
command. A name of a feature this version does not have (none today) maps to the key
that feature will use and is refused (`Alias.missing`), saying so, rather than written
into a manifest that would then be refused whole. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from specs.manifest import Manifest
from specs.problems import format_path

MODEL = "<model>"  # a placeholder segment: any one model name
FIELD = "<field>"  # a placeholder segment: any field of that model

NOT_IN_THIS_VERSION = "is not in this version of Blazar"


@dataclass(frozen=True)
class Alias:
    """One name of the guide (`port`) and the manifest key it stands for (`serving.port`).

    `name` and `key` are dotted, with `<model>` and `<field>` for any one segment: a
    placeholder in `key` that `name` does not bind means the setting is per model.
    `missing` says what to use instead when this version has no such feature."""

    name: str
    key: str
    note: str = ""
    missing: str | None = None

    @property
    def per_model(self) -> bool:
        """The key has no serving-wide form: each model sets its own."""
        return MODEL in self.key.split(".") and MODEL not in self.name.split(".")

    def bind(self, parts: Sequence[str]) -> tuple[str, ...] | None:
        """The manifest key `parts` stands for, placeholders filled; None if it is not this
        alias (a placeholder the name does not bind stays in the result)."""
        return _bind(self.name, self.key, parts)

    def canonical_form(self, parts: Sequence[str]) -> bool:
        """Whether `parts` is the manifest key itself of a feature not in this version."""
        return self.missing is not None and _bind(self.key, self.key, parts) is not None


def _bind(pattern: str, target: str, parts: Sequence[str]) -> tuple[str, ...] | None:
    pattern_parts = pattern.split(".")
    if len(pattern_parts) != len(parts):
        return None
    bound: dict[str, str] = {}
    for want, got in zip(pattern_parts, parts, strict=True):
        if want in (MODEL, FIELD):
            bound[want] = got
        elif want != got:
            return None
    return tuple(bound.get(p, p) for p in target.split("."))


ALIASES: tuple[Alias, ...] = (
    # Serving
    Alias("host", "serving.host"),
    Alias("port", "serving.port", "11434 makes Blazar a drop-in for ollama's clients"),
    Alias("default_ctx", "serving.default_ctx"),
    Alias("max_loaded_models", "serving.max_loaded_models"),
    Alias("slots", "serving.default_slots", "per model: models.<model>.slots"),
    Alias("deterministic", "serving.deterministic"),
    # Memory and quality
    Alias("cache_type", "serving.cache_type"),
    Alias("kv_unified", "serving.kv_unified"),
    Alias("cache_ram_mb", "serving.cache_ram_mb"),
    Alias("ctx_extend", "models.<model>.ctx_extend", "YaRN context extension"),
    Alias("load_mode", "serving.load_mode"),
    # Behaviour
    Alias("spec", "models.<model>.spec", "speculative decoding"),
    Alias("session_bank", "serving.session_bank"),
    Alias("singleflight", "serving.singleflight"),
    Alias("prompt_preflight", "serving.prompt_preflight"),
    Alias("sentinel", "serving.sentinel"),
    Alias("sentinel_enforce", "serving.sentinel_enforce"),
    Alias("audit_log", "serving.audit_log"),
    Alias("pii_scrub", "serving.pii_scrub"),
    Alias("warm_peg", "models.<model>.warm_peg", "its weights kept in memory after it unloads"),
    Alias("semantic_cache.enabled", "serving.cache.enabled"),
    Alias("semantic_cache.threshold", "serving.cache.threshold"),
    Alias("semantic_cache.ttl", "serving.cache.ttl"),
    Alias("semantic_cache.model", "serving.cache.model"),
    # Access
    Alias("tls_cert", "serving.tls_cert", "set with tls_key, in one call"),
    Alias("tls_key", "serving.tls_key", "set with tls_cert, in one call"),
    Alias("cors_origins", "serving.cors_origins"),
    # Routing
    Alias("engine_routing.mode", "engine_routing.mode", "the same key"),
    Alias("engine_routing.policy", "engine_routing.policy", "the same key"),
    Alias("fork_retire_days", "engine_routing.fork_retire_days"),
    Alias(
        "model_overrides.<model>.<field>",
        "models.<model>.<field>",
        "the guide's engine, pin and replicas, and any other model field",
    ),
    # Observability
    Alias("otlp_endpoint", "serving.otlp_endpoint"),
    Alias("otlp_service", "serving.otlp_service"),
)

# Resource sections the guide writes as arrays of tables (`[[keys]]` with a `name`); the
# loader accepts that shape beside the manifest's `[keys.NAME]`.
NAMED_ARRAYS = ("keys", "remotes")


@dataclass(frozen=True)
class Resolved:
    """What a key given by a user means: the manifest key, the alias that led there (None
    when it was the manifest's own key), and why it cannot be set, if it cannot."""

    given: str
    parts: tuple[str, ...]
    alias: Alias | None = None
    refusal: str | None = None

    @property
    def key(self) -> str:
        """The manifest key, dotted and quoted as TOML would (`models."qwen3:0.6b".pin`)."""
        return format_path(self.parts)

    @property
    def arrow(self) -> str:
        """`port -> serving.port` for an alias; the key alone otherwise."""
        return f"{self.given} -> {self.key}" if self.alias is not None else self.key


def resolve(given: str, parts: Sequence[str]) -> Resolved:
    """The manifest key that `parts` (the dotted key `given`, split) stands for."""
    for alias in ALIASES:
        bound = alias.bind(parts)
        if bound is None:
            continue
        if bound == tuple(parts):
            return _canonical(given, bound, alias)
        return Resolved(given, bound, alias, _refusal(given, alias, bound))
    for alias in ALIASES:
        if alias.canonical_form(parts):
            return _canonical(given, tuple(parts), alias)
    return Resolved(given, tuple(parts))


def _canonical(given: str, parts: tuple[str, ...], alias: Alias) -> Resolved:
    missing = f"{given} {NOT_IN_THIS_VERSION}; {alias.missing}" if alias.missing else None
    return Resolved(given, parts, None, missing)


def _refusal(given: str, alias: Alias, parts: tuple[str, ...]) -> str | None:
    key = shown_key(parts)
    if alias.missing is not None:
        return f"{given} ({key}) {NOT_IN_THIS_VERSION}; {alias.missing}"
    if alias.per_model:
        return (
            f"{given} is set per model, not for the whole server: "
            f"`blazar config set {key} VALUE` (MODEL: a declared model, as `blazar list` "
            "names it)"
        )
    return None


def shown_key(parts: Sequence[str]) -> str:
    """A key as a user would type it, placeholders shown as MODEL and FIELD."""
    names = {MODEL: "MODEL", FIELD: "FIELD"}
    return format_path(tuple(names.get(p, p) for p in parts))


# -- what the manifest knows: its keys, and the closest ones to a key it does not -----------

SECTIONS_BY_NAME = "NAME"  # the segment shown for any resource name in `manifest_keys`


def unknown_part(parts: Sequence[str]) -> int | None:
    """The index of the first segment the manifest has no place for; None when `parts` is
    a key a manifest may set (any name where resources are keyed by name)."""
    return _walk(parts)[0]


def _walk(parts: Sequence[str]) -> tuple[int | None, Any]:
    """(the index of the first unknown segment or None, what validates the last known one)."""
    if tuple(parts[:2]) == ("engines", "catalog"):  # a string beside the lane tables
        return (None if len(parts) == 2 else 2), str
    current: Any = Manifest
    for index, part in enumerate(parts):
        current = unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {info.alias or name: info for name, info in current.model_fields.items()}
            if part not in fields:
                return index, current
            current = fields[part].annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[-1]
        elif current is Any:
            return None, current  # free-form (a model's params): the validator checks it
        else:
            return index, current  # a value has no keys under it
    return None, unwrap(current)


@functools.cache
def manifest_keys() -> tuple[str, ...]:
    """Every key a manifest may set, with NAME for a resource's name (`models.NAME.ctx`)."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            key = (*prefix, info.alias or name)
            if key == ("$schema",):
                continue
            inner = unwrap(info.annotation)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, key)
            elif typing.get_origin(inner) is dict:
                value = unwrap(typing.get_args(inner)[-1])
                if isinstance(value, type) and issubclass(value, BaseModel):
                    walk(value, (*key, SECTIONS_BY_NAME))
                else:
                    out.append(".".join(key))
            else:
                out.append(".".join(key))

    walk(Manifest, ())
    return tuple(out)


def suggest(parts: Sequence[str], limit: int = 2) -> list[tuple[str, str | None]]:
    """What the unknown key `parts` may have meant, best first: (what to type, the manifest
    key it stands for when it is a guide name, else None). Within a known table, its own
    fields (a field named with the word given comes first: `slots`, `default_slots`); at
    the top, every manifest key and guide name."""
    index, table = _walk(parts)
    if index is None:
        return []
    if index > 0:
        if not (isinstance(table, type) and issubclass(table, BaseModel)):
            return []
        name = parts[index]
        fields = [info.alias or n for n, info in table.model_fields.items()]
        worded = [f for f in fields if name in f.split("_") and f != name]
        close = difflib.get_close_matches(name, fields, n=limit, cutoff=0.6)
        fitting: list[tuple[str, str | None]] = [(f, None) for f in dict.fromkeys(worded + close)]
        return fitting[:limit]
    choices: dict[str, str | None] = dict.fromkeys(manifest_keys())
    for alias in ALIASES:
        if FIELD not in alias.name and alias.name != alias.key:
            choices.setdefault(alias.name, shown_key(alias.key.split(".")))
    found = difflib.get_close_matches(".".join(parts), list(choices), n=limit, cutoff=0.6)
    return [(f, choices[f]) for f in found]


def unknown_message(resolved: Resolved) -> str | None:
    """Why a manifest has no such key, with what it may have meant (`did you mean ...?`);
    None when it has the key. Inside a known table it reads as the loader's problems do:
    `unknown field 'ctxx' in models.gemma; did you mean 'ctx'?`."""
    parts = resolved.parts
    index, table = _walk(parts)
    if index is None:
        return None
    named = resolved.given if resolved.alias is not None else resolved.key
    where = format_path(parts[:index])
    if index == 0:
        message = f"unknown key {named!r}"
    elif not (isinstance(table, type) and issubclass(table, BaseModel)):
        return f"{where} is a value, not a table: set {where} itself"
    else:
        message = f"unknown field {parts[index]!r} in {where}"
    found = suggest(parts)
    if not found:
        return f"{message}: `blazar schema` lists every key (docs/manifest.md)"
    shown = [repr(typed) + (f" ({means})" if means else "") for typed, means in found]
    return f"{message}; did you mean {' or '.join(shown)}?"


def hint_for(name: str) -> str | None:
    """For a top-level name a manifest does not know: the key it is the guide's name for,
    said so that the reader knows where to write it; None when it is no alias."""
    resolved = resolve(name, [name])
    alias = resolved.alias
    if alias is None:
        under = [a for a in ALIASES if a.name.startswith(f"{name}.")]
        tables = sorted({shown_key(a.key.split(".")) for a in under})
        if not tables:
            return None
        keys = ", ".join(tables[:2]) + (", ..." if len(tables) > 2 else "")
        return (
            f"[{name}] is the user guide's table for {keys}: write those keys instead "
            "(`blazar migrate config` converts a guide-shaped file)"
        )
    if resolved.refusal is not None:
        return resolved.refusal
    *table, field = resolved.parts
    return (
        f"{name!r} is the user guide's name for {resolved.key}: write `{field} = ...` "
        f"under [{format_path(tuple(table))}]"
    )


def unwrap(annotation: Any) -> Any:
    """`X | None` and `Annotated[X, ...]` to X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation
