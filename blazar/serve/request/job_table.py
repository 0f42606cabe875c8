"""The table of one kind of background job a gateway keeps (audio jobs, message batches).

Both `blazar.serve.request.audio_jobs` and `blazar.serve.request.batches` keep their
jobs in memory by id, each owned by the API key that made it: with keys in use, a key
sees only its own jobs, and another key's job is not found (the same 404 as an id that
never existed, so an id reveals nothing). `JobTable` is that table, once: a dict by id
with the owner's lookup (`owned`) and listing (`visible`, newest first); `pruning` is
the task that forgets, every `PRUNE_EVERY` seconds, what each kind's `prune` says has
been kept long enough.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from blazar.protocols import ProtocolError


class Owned(Protocol):
    """A job as the table reads it: who made it, and when."""

    key: str | None  # the API key's name (None: keys are off)
    created_at: float


J = TypeVar("J", bound=Owned)
PRUNE_EVERY = 60.0  # seconds between two prunings of a table


class JobTable(dict[str, J]):
    """Jobs by id; `missing(id)` is the kind's 404 for an id not found (or not the key's)."""

    def __init__(self, missing: Callable[[str], ProtocolError]) -> None:
        super().__init__()
        self.missing = missing

    def owned(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> J:
        """The job, if it exists and (with keys in use, `keyed`) `key` made it."""
        job = super().get(job_id)
        if job is None or (keyed and job.key != key):
            raise self.missing(job_id)
        return job

    def visible(self, key: str | None = None, *, keyed: bool = False) -> list[J]:
        """The jobs `key` may see (every one when keys are off), newest first."""
        found = [j for j in self.values() if not keyed or j.key == key]
        return sorted(found, key=lambda j: j.created_at, reverse=True)


async def pruning(prune: Callable[[], object]) -> None:
    """Call `prune` every PRUNE_EVERY seconds until cancelled (the owner's `close`)."""
    while True:
        await asyncio.sleep(PRUNE_EVERY)
        prune()
