"""Byte sizes in a manifest: `serving.max_upload`, `serving.max_buffered`, and
`serving.memory_budget` (a size or a share of a device's memory).

Pure parsing, used by `specs.manifest` when a manifest loads.

    "64GiB", "512MiB", "4KiB"     binary units (KiB, MiB, GiB, TiB: powers of 1024)
    "10GB", "500MB", "1.5kB"      decimal units (kB/KB, MB, GB, TB: powers of 1000)
    1048576, "1048576", "100B"    plain numbers are bytes

Parsed to a whole number of bytes; written back in the shortest unit that is exact.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

EXPECTED = "expected a size such as '64GiB', '512MiB', '10GB' or a number of bytes"
PATTERN = r"^[0-9]+(\.[0-9]+)?\s*([kKMGT]i?B|B)?$"
_FORM = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kKMGT]i?B|B)?")
_UNITS = {
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


class InvalidSize(ValueError):
    """A value that is not a size; the message shows the accepted forms."""


def parse_size(value: object) -> int:
    """Bytes for a size string or a whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidSize(f"{EXPECTED}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidSize(f"{EXPECTED}, got a negative number")
        return value
    match = _FORM.fullmatch(value.strip())
    if match is None or (match.group(2) or "B") not in _UNITS:
        raise InvalidSize(f"{EXPECTED}, got {value!r}")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit or "B"])


def format_size(size: int) -> str:
    """The shortest exact form: 68719476736 -> '64GiB', 1000 -> '1kB', 7 -> '7B'."""
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "kB"):
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size}B"


def _validate(value: Any) -> int:
    return parse_size(value)


Size = Annotated[
    int,
    BeforeValidator(_validate),
    PlainSerializer(format_size, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "pattern": PATTERN}, {"type": "integer", "minimum": 0}],
            "examples": ["64GiB", "512MiB", "10GB"],
        }
    ),
]
"""A size field: a whole number of bytes after validation."""


SHARE_PATTERN = r"^[0-9]+(\.[0-9]+)?\s*%$"
_SHARE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*%")


def parse_share(value: object) -> int | str:
    """Bytes for a size, or a share of a device's memory normalized to 'N%' (0 < N <= 100)."""
    if isinstance(value, str):
        match = _SHARE.fullmatch(value.strip())
        if match is not None:
            share = float(match.group(1))
            if not 0 < share <= 100:
                raise InvalidSize(f"a share of memory is above 0% and at most 100%, got {value!r}")
            return f"{share:g}%"
    try:
        return parse_size(value)
    except InvalidSize:
        raise InvalidSize(
            f"expected a size such as '12GiB' or a share of the device's memory such as "
            f"'80%', got {value!r}"
        ) from None


def _serialize_share(value: int | str) -> str:
    return value if isinstance(value, str) else format_size(value)


SizeOrShare = Annotated[
    int | str,
    BeforeValidator(parse_share),
    PlainSerializer(_serialize_share, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": PATTERN},
                {"type": "string", "pattern": SHARE_PATTERN},
                {"type": "integer", "minimum": 0},
            ],
            "examples": ["12GiB", "80%"],
        }
    ),
]
"""A size or a share: bytes (int) or 'N%' of a total (str) after validation."""
