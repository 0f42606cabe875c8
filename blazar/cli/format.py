"""Small helpers for human-readable CLI output."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import click


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain left-aligned table, like `docker ps` or `ollama list`."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, sort_keys=True))
