"""Domain errors raised by Blazar's library code.

Only the CLI turns these into exit codes and one-line messages; every message
says what is wrong and what to run next.
"""

from __future__ import annotations


class BlazarError(Exception):
    """Base class of every error Blazar reports to a user."""


class InvalidInput(BlazarError):
    """The user gave something Blazar cannot use (a path, a name, a flag)."""


class NotFound(BlazarError):
    """A named thing (model, engine) is not known to the store."""


class AlreadyExists(BlazarError):
    """A name is taken and the user did not ask to replace it."""


class Conflict(BlazarError):
    """The change asked for would leave things in a state Blazar refuses (the last API key)."""


class InvalidManifest(BlazarError):
    """The manifest has problems; the message lists every one, one per line."""


class NotGGUF(InvalidInput):
    """A file is not a GGUF model, or is a truncated or damaged one."""


class VerificationFailed(BlazarError):
    """Bytes on disk did not match the size or sha256 they must have."""
