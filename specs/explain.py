"""Pydantic validation errors, explained as manifest problems with file and line.

`specs.loader` calls `explain` with a ValidationError of `Manifest` and a
function that finds where a path was declared. Each error becomes one
Problem whose message names the field and says what was expected and what
was found, with a hint where one helps (`did you mean 'ctx'?`).
"""

from __future__ import annotations

import datetime
import difflib
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from specs.aliases import ALIASES, hint_for, unwrap
from specs.manifest import Manifest
from specs.problems import Finding, FindingsError, Invalid, Location, Path, Problem, format_path

Locate = Callable[[Path], Location | None]

_EXPECTED = {
    "int_type": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "float_type": "a number",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "list_type": "a list",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def describe(value: object) -> str:
    """What a value is, as a manifest author would call it: `a string '4096'`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"an integer {value}"
    if isinstance(value, float):
        return f"a number {value:g}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string {shown!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, datetime.date | datetime.time):
        return "a date or time"
    return type(value).__name__


def problem_at(locate: Locate, path: Path, message: str, hint: str | None = None) -> Problem:
    """A Problem at the declaration of `path` (or of its nearest declared parent)."""
    where = locate(path)
    if where is None:
        return Problem(message, path=format_path(path), hint=hint)
    return Problem(message, where.file, where.line, where.column, format_path(path), hint)


def findings_to_problems(findings: Sequence[Finding], locate: Locate) -> list[Problem]:
    return [problem_at(locate, f.path, f.message, f.hint) for f in findings]


def explain(error: ValidationError, locate: Locate, references: bool = True) -> list[Problem]:
    """One Problem per error of a Manifest validation (`references`: with dangling ones)."""
    problems: list[Problem] = []
    for item in error.errors():
        loc: Path = tuple(item["loc"])
        if loc and loc[-1] == "[key]":  # a bad table name: report it at the table
            loc = loc[:-1]
        ctx = item.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, FindingsError):
            if references:
                problems += findings_to_problems(cause.findings, locate)
            continue
        field = getattr(cause, "field", None)
        if isinstance(field, str):
            loc = (*loc, field)
        message, hint = _message(item["type"], loc, item.get("input"), ctx, item["msg"])
        problems.append(problem_at(locate, loc, message, hint))
    return problems


def _message(
    kind: str, loc: Path, value: Any, ctx: dict[str, Any], default: str
) -> tuple[str, str | None]:
    where = format_path(loc)
    if kind == "extra_forbidden":
        return _unknown(loc)
    if kind == "missing":
        parent = format_path(loc[:-1]) or "the manifest"
        return f"missing required field {loc[-1]!r} in {parent}", None
    if kind in _EXPECTED:
        quoted = isinstance(value, str) and _looks_like(kind, value)
        hint = "remove the quotes" if quoted else None
        return f"{where}: expected {_EXPECTED[kind]}, got {describe(value)}", hint
    if kind == "literal_error":
        return f"{where}: expected {ctx.get('expected')}, got {describe(value)}", None
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{where}: must be {words} {ctx.get(key)}, got {describe(value)}", None
    cause = ctx.get("error")
    if isinstance(cause, Invalid):
        return f"{where}: {cause.message}", cause.hint
    if cause is not None:
        return f"{where}: {cause}", None
    return f"{where}: {default}", None


def _looks_like(kind: str, text: str) -> bool:
    """Whether a string is the number or boolean that was wanted, only quoted."""
    if kind not in ("int_type", "float_type", "bool_type"):
        return False
    if kind == "bool_type":
        return text in ("true", "false")
    try:
        float(text) if kind == "float_type" else int(text)
    except ValueError:
        return False
    return True


def _unknown(loc: Path) -> tuple[str, str | None]:
    name, parent = str(loc[-1]), loc[:-1]
    model = model_at(parent)
    fields = field_names(model) if model else []
    close = difflib.get_close_matches(name, fields, n=1)
    if not parent:
        message = f"unknown section {name!r}"
        other = f"sections are {', '.join(fields)}"
        # A flat name of the user guide (`port`, `slots`): say where it belongs, rather
        # than the section it happens to resemble (`slots` is not `loras`).
        if (hint := hint_for(name)) is not None:
            return message, hint
        flat = {a.name: a.key for a in ALIASES if "." not in a.name and not a.per_model}
        close = difflib.get_close_matches(name, [*fields, *flat], n=1)
        if close and close[0] in flat:
            return message, f"did you mean {close[0]!r} (the guide's name for {flat[close[0]]})?"
    else:
        message = f"unknown field {name!r} in {format_path(parent)}"
        other = f"known fields: {', '.join(fields)}"
    return message, f"did you mean {close[0]!r}?" if close else other


def field_names(model: type[BaseModel]) -> list[str]:
    """A model's field names as written in a manifest (aliases included)."""
    return [info.alias or name for name, info in model.model_fields.items()]


def model_at(path: Path) -> type[BaseModel] | None:
    """The pydantic model that validates the table at `path`, if there is one."""
    current: Any = Manifest
    steps = list(path)
    while steps:
        if isinstance(current, type) and issubclass(current, BaseModel):
            step = steps.pop(0)
            by_alias = {info.alias or n: info for n, info in current.model_fields.items()}
            if step not in by_alias:
                return None
            current = by_alias[step].annotation
            continue
        current = unwrap(current)
        origin = typing.get_origin(current)
        if origin in (dict, list):
            steps.pop(0)
            current = typing.get_args(current)[-1]
            continue
        return None
    current = unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None
