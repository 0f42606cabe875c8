"""Model names: `name[:tag]`.

A name is lowercase letters, digits, `.`, `-` and `_`, starting with a letter
or digit; so is a tag. The tag defaults to `latest`, as in ollama. `#` is
reserved: Blazar uses `model#adapter` to name a model served with a LoRA
adapter, so no model name may contain it.
"""

from __future__ import annotations

import re
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


def parse_name(text: str) -> ModelName:
    """Parse `name[:tag]`, raising InvalidName with a message that says what to fix."""
    if "#" in text:
        raise InvalidName(
            f"invalid model name {text!r}: '#' is reserved (Blazar writes 'model#adapter' "
            "for a model served with a LoRA adapter); choose a name without it"
        )
    if text.count(":") > 1:
        raise InvalidName(f"invalid model name {text!r}: use name or name:tag, with one ':'")
    name, _, tag = text.partition(":")
    _check_part(name, "name", text)
    if ":" in text:
        _check_part(tag, "tag", text)
    return ModelName(name, tag or DEFAULT_TAG)
