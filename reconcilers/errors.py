"""Retry semantics as types (as in kopf).

A TemporaryError is retried with backoff within one apply; a PermanentError is
not. Errors of any other type count as temporary.
"""

from __future__ import annotations


class ReconcileError(Exception):
    """Base of errors a port raises while applying an action."""


class TemporaryError(ReconcileError):
    """Worth retrying (a network hiccup, a busy resource)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(ReconcileError):
    """Retrying cannot help (a wrong checksum, a missing file): report and move on."""
