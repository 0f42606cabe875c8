"""Durations in a manifest: `keep_alive`, `queue_timeout` and the like.

Pure parsing, used by `specs.manifest` when a manifest loads and by later code
that accepts a per-request keep_alive (ollama's API sends the same forms).

    "5m", "30s", "1h30m", "250ms", "1.5h"   units h, m, s, ms, combined largest first
    "0" or 0                                  now (keep_alive: unload at once)
    "-1", -1, "-5m"                           any negative: forever (as in ollama)
    300, "300", 2.5                           plain numbers are seconds

Parsed to seconds as a float; every negative is normalized to FOREVER (-1.0).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

FOREVER = -1.0
EXPECTED = "expected a duration such as '5m', '30s', '0' or '-1'"
PATTERN = r"^-?([0-9]+(\.[0-9]+)?|([0-9]+(\.[0-9]+)?(h|ms|m|s))+)$"

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


class InvalidDuration(ValueError):
    """A value that is not a duration; the message shows the accepted forms."""


def parse_duration(value: object) -> float:
    """Seconds for a duration string or number; FOREVER for any negative."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidDuration(f"{EXPECTED}, got {_describe(value)}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidDuration(f"{EXPECTED}, got {value!r}")
        return FOREVER if value < 0 else float(value)
    text = value.strip()
    negative = text.startswith("-")
    body = text[1:] if negative else text
    seconds = _parse_body(body)
    if seconds is None:
        raise InvalidDuration(f"{EXPECTED}, got {value!r}")
    return FOREVER if negative and seconds > 0 else seconds


def _parse_body(body: str) -> float | None:
    if _NUMBER.fullmatch(body):
        return float(body)
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        return None
    units = [u for _, u in parts]
    order = ["h", "m", "s", "ms"]
    if len(set(units)) != len(units) or units != sorted(units, key=order.index):
        return None  # "5m1h" or "1m1m": accept only the forms people mean unambiguously
    return sum(float(n) * _UNITS[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    """The shortest string that parses back to `seconds`: 300 -> '5m', -1 -> '-1'."""
    if seconds < 0:
        return "-1"
    if seconds == 0:
        return "0"
    whole = round(seconds * 1000)
    if whole != seconds * 1000:
        return f"{seconds:g}"
    out = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, whole = divmod(whole, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _serialize(seconds: float) -> str:
    return format_duration(seconds)


def _validate(value: Any) -> float:
    return parse_duration(value)


Duration = Annotated[
    float,
    BeforeValidator(_validate),
    PlainSerializer(_serialize, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "pattern": PATTERN}, {"type": "number"}],
            "examples": ["5m", "30s", "1h30m", "0", "-1"],
        }
    ),
]
"""A duration field: seconds as a float after validation, FOREVER (-1.0) for negatives."""
