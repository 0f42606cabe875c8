"""Singleflight: identical concurrent calls share one, and every caller gets its result.

With `serving.singleflight = true` the OpenAI routes (`blazar.serve.routes.openai_api`)
key a non-streamed deterministic request (temperature 0, or a seed) by its
model, path and body bytes; while one such call is in flight, another with the
same key waits for it instead of taking a slot and calling the engine again.
The call runs in a task of its own, so a leader whose client disconnects does
not cancel the followers' answer (nor leave its slot held: the task finishes and
releases it). Who gets which id is the route's business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def deterministic(body: Mapping[str, Any]) -> bool:
    """A request whose answer does not depend on chance: temperature 0, or a seed, and not
    streamed (a stream is one client's)."""
    if body.get("stream") is True or body.get("n", 1) != 1:
        return False
    temperature, seed = body.get("temperature"), body.get("seed")
    zero = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    fixed = isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0
    return (zero and temperature == 0) or fixed


class SingleFlight:
    """In-flight calls by key; `share` joins one or starts it."""

    def __init__(self) -> None:
        self._calls: dict[Hashable, asyncio.Future[Any]] = {}
        self.shared = 0  # calls answered from another's (for tests and metrics)

    async def share(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """(the result, whether this caller started the call). The call's exception, if
        it raises, is every caller's."""
        task = self._calls.get(key)
        leader = task is None
        if task is None:
            task = asyncio.ensure_future(call())
            self._calls[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        else:
            self.shared += 1
        return await asyncio.shield(task), leader

    def _done(self, key: Hashable, task: asyncio.Future[Any]) -> None:
        if self._calls.get(key) is task:
            del self._calls[key]
        if not task.cancelled():
            task.exception()  # retrieved: a call every caller left is not an error to log
