"""The scheduler's refusals, each with its HTTP status and error code.

Raised by the scheduler's parts (`core`, `queueing`, `capacity`, `reload`) and turned
into each protocol's error envelope by the request path (`blazar.serve.request`). A
503 carries `retry_after`: the client may retry, and the answer says when.
"""

from __future__ import annotations

from collections.abc import Iterable


class SchedulerError(Exception):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotFound(SchedulerError):
    status = 404
    code = "model_not_found"


def model_not_found(requested: str, served: Iterable[str]) -> ModelNotFound:
    """The 404 for a name that is not served, naming the models that are."""
    names = ", ".join(sorted(served)) or "none"
    return ModelNotFound(
        f"model '{requested}' not found; models served here: {names}. "
        "Declare it in the manifest (or `blazar pull`) first."
    )


class Starting(SchedulerError):
    """A name asked for before serve's first pass built what is served (503)."""

    code = "starting"


class Busy(SchedulerError):
    code = "all_slots_busy"


class Reloading(SchedulerError):
    """A queued request whose model was replaced or removed before a slot freed up (503,
    retry: the next try reaches the model's new instances, or a 404 if it is gone)."""

    code = "model_reloading"


class NoCapacity(SchedulerError):
    code = "max_loaded_models"


class TooLarge(SchedulerError):
    """A model whose footprint is over the memory budget of every device, and of all of
    them together: refused before anything is spawned (400); the message names the
    footprint, the budget and what to change."""

    status = 400
    code = "model_too_large"


class Misconfigured(SchedulerError):
    """The model's settings cannot serve its GGUF (`ModelRuntime.settings_problem`): it is
    never spawned, and requests for it say why."""

    status = 400
    code = "model_misconfigured"
