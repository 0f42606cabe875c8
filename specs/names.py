"""Model names: `name[:tag]`, and the names a request may use for a model's variants.

A name is lowercase letters, digits, `.`, `-` and `_`, starting with a letter
or digit; so is a tag. The tag defaults to `latest`, as in ollama. `+` and `#`
are reserved, so no model name may contain them: a request's `model` may be

    MODEL                      the model with its always-on adapters (if any)
    MODEL+ADAPTER[+ADAPTER]    only those LoRA adapters on, each at its declared scale
    MODEL+ADAPTER:SCALE        ... at that scale instead (0 turns an adapter off)
    MODEL+none                 no adapter at all, always-on ones included
    MODEL#N                    replica N of the model (0-based, as `blazar ps` numbers them)
    MODEL#ADAPTER              an older spelling of MODEL+ADAPTER, kept as an alias

`parse_requested` splits such a name (pure; the gateway's scheduler calls it).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_TAG = "latest"
MAX_LENGTH = 128
_PART = re.compile(r"[a-z0-9][a-z0-9._-]*")


class InvalidName(ValueError):
    """A model name that does not follow the rules; the message says which."""


@dataclass(frozen=True, order=True)
class ModelName:
    """A parsed, valid model reference."""

    name: str
    tag: str = DEFAULT_TAG

    def __str__(self) -> str:
        return f"{self.name}:{self.tag}"

    @property
    def short(self) -> str:
        """`name` when the tag is the default, else `name:tag`."""
        return self.name if self.tag == DEFAULT_TAG else str(self)


def _check_part(part: str, what: str, whole: str) -> None:
    if not part:
        raise InvalidName(f"invalid model name {whole!r}: the {what} is empty")
    if len(part) > MAX_LENGTH:
        raise InvalidName(
            f"invalid model name {whole!r}: the {what} is longer than {MAX_LENGTH} characters"
        )
    if not _PART.fullmatch(part):
        bad = sorted({c for c in part if not re.fullmatch(r"[a-z0-9._-]", c)})
        hint = (
            f"it contains {', '.join(repr(c) for c in bad)}; "
            if bad
            else "it must start with a letter or digit; "
        )
        if any(c.isupper() for c in part):
            hint += f"try {part.lower()!r}; "
        raise InvalidName(
            f"invalid model name {whole!r}: {hint}a {what} is lowercase letters, digits, "
            "'.', '-' and '_', starting with a letter or digit"
        )


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` a mistyped `name` may have meant (None when none is close): the
    `did you mean` of every "model not found" (the gateway's 404, `blazar show`, `rm`)."""
    found = difflib.get_close_matches(name, sorted(set(names)), n=1, cutoff=0.6)
    return found[0] if found else None


def parse_name(text: str) -> ModelName:
    """Parse `name[:tag]`, raising InvalidName with a message that says what to fix."""
    if "#" in text or "+" in text:
        raise InvalidName(
            f"invalid model name {text!r}: '+' and '#' are reserved (requests name "
            "'model+adapter' for a model with a LoRA adapter and 'model#N' for one replica); "
            "choose a name without them"
        )
    if text.count(":") > 1:
        raise InvalidName(f"invalid model name {text!r}: use name or name:tag, with one ':'")
    name, _, tag = text.partition(":")
    _check_part(name, "name", text)
    if ":" in text:
        _check_part(tag, "tag", text)
    return ModelName(name, tag or DEFAULT_TAG)


NO_ADAPTERS = "none"  # MODEL+none: every adapter off, always-on ones included
REQUEST_FORMS = "MODEL, MODEL+ADAPTER, MODEL+ADAPTER:SCALE, MODEL+none or MODEL#REPLICA"


@dataclass(frozen=True)
class AdapterChoice:
    """One adapter a request turns on, at its declared scale (None) or at `scale`."""

    name: str
    scale: float | None = None


@dataclass(frozen=True)
class Requested:
    """A request's `model` split into the model, the adapters and the replica it asks for."""

    model: str  # name, name:tag or alias, as written
    adapters: tuple[AdapterChoice, ...] | None = None  # None: the model's always-on ones
    replica: int | None = None

    def __str__(self) -> str:
        text = self.model + (f"#{self.replica}" if self.replica is not None else "")
        if self.adapters is None:
            return text
        if not self.adapters:
            return f"{text}+{NO_ADAPTERS}"
        return text + "".join(
            f"+{a.name}" + ("" if a.scale is None else f":{a.scale:g}") for a in self.adapters
        )


def parse_requested(text: str) -> Requested:
    """Split a requested name (see the module docstring); InvalidName says what to fix.

    Whether the model and its adapters exist is the caller's question."""
    if "+" not in text and "#" not in text:
        return Requested(text)  # the common case: a plain name, nothing to split
    head, *parts = text.split("+")
    model, hashed, after = head.partition("#")
    replica = None
    if hashed:
        if after.isdigit():
            replica = int(after)
        elif after and not parts:
            parts = [after]  # MODEL#ADAPTER: the older spelling of MODEL+ADAPTER
        else:
            raise InvalidName(
                f"bad model {text!r}: after '#' comes a replica number (MODEL#0); "
                f"use {REQUEST_FORMS}"
            )
    if not model:
        raise InvalidName(f"bad model {text!r}: it names no model; use {REQUEST_FORMS}")
    if not parts:
        return Requested(model, None, replica)
    if parts == [NO_ADAPTERS]:
        return Requested(model, (), replica)
    choices: list[AdapterChoice] = []
    for part in parts:
        name, colon, scale = part.partition(":")
        if not name or name == NO_ADAPTERS:
            why = "an empty adapter name" if not name else f"'{NO_ADAPTERS}' among adapters"
            raise InvalidName(f"bad model {text!r}: {why}; use {REQUEST_FORMS}")
        if any(c.name == name for c in choices):
            raise InvalidName(f"bad model {text!r}: adapter {name!r} is named twice")
        choices.append(AdapterChoice(name, _scale(text, scale) if colon else None))
    return Requested(model, tuple(choices), replica)


def _scale(text: str, scale: str) -> float:
    try:
        value = float(scale)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidName(
            f"bad model {text!r}: {scale!r} is not a scale; write a number such as "
            "MODEL+ADAPTER:0.5 (0 turns the adapter off)"
        )
    return value
