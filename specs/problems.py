"""What is wrong with a manifest, and where: Location, Problem, ManifestError.

`specs.loader` collects every problem of a manifest (syntax, unknown fields,
types, values, duplicates, dangling references) into one ManifestError, which
the CLI prints one line a problem:

    blazar.toml:15: unknown field 'ctxx' in models.other; did you mean 'ctx'?

`FieldError` is raised by validators in `specs.manifest` that check several
fields together; it names the field the problem belongs to, so the loader can
point at that field's line rather than at its table's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

Path = tuple[str | int, ...]
"""A position in the manifest document: ("models", "gemma", "aliases", 0)."""

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def format_path(path: Path) -> str:
    """models.gemma.ctx; models."qwen3:0.6b".aliases[0] (TOML's quoting for odd keys)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        key = part if _BARE.fullmatch(part) else '"' + part.replace('"', '\\"') + '"'
        out += f".{key}" if out else key
    return out


@dataclass(frozen=True, order=True)
class Location:
    """Where something was declared: a file, and a 1-based line and column when known."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest.

    `path` is the field it concerns, dotted (`models.other.ctxx`; empty for a
    whole file); `message` reads on its own; `hint` says what to do, when
    Blazar can tell (`did you mean 'ctx'?`).
    """

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str = ""
    hint: str | None = None

    @property
    def location(self) -> Location | None:
        return None if self.file is None else Location(self.file, self.line, self.column)

    def __str__(self) -> str:
        text = self.message + (f"; {self.hint}" if self.hint else "")
        where = str(self.location) if self.location else ""
        return f"{where}: {text}" if where else text

    def sort_key(self) -> tuple[str, int, int, str, str]:
        return (self.file or "", self.line or 0, self.column or 0, self.path, self.message)


class ManifestError(Exception):
    """A manifest that cannot be used, with every problem found in it at once."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=Problem.sort_key)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


class Invalid(ValueError):
    """A value a validator rejects, with a separate hint on what to write instead."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message + (f"; {hint}" if hint else ""))
        self.message = message
        self.hint = hint


class FieldError(Invalid):
    """A validator's complaint about one field of the model it validates.

    Raised from model validators that look at several fields together (for
    example `pooling` without `embeddings`), so the loader can report it at
    `field`'s path and line.
    """

    def __init__(self, field: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.field = field


@dataclass(frozen=True)
class Finding:
    """A problem found in the document's data, before it has a file and line."""

    path: Path
    message: str
    hint: str | None = None


class FindingsError(ValueError):
    """Several findings raised at once from one validator (the manifest's cross-checks)."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        super().__init__(
            "; ".join(f"{f.message}" + (f" ({f.hint})" if f.hint else "") for f in self.findings)
        )
