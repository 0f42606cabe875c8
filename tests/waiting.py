"""Waiting for something to be so, in tests: never a bare sleep that hopes it is by then.

- `until(check)`: in a coroutine whose world is on the same event loop (the scheduler
  with stand-ins, an instance's owner task): yields to the loop, one turn at a time,
  until `check()` holds. No clock: it fails after `turns` turns, so a test that waits
  for something that never happens fails at once rather than at a timeout.
- `wait_until(check, what)`: for another process (a `blazar serve`, an engine child),
  whose state the test can only observe: polls `check()` until it holds, failing with
  `what` after `timeout` seconds. The deadline is a bound on a failure, never the
  synchronisation itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], object], what: str = "the condition", turns: int = 1000
) -> None:
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not after {turns} turns of the event loop: {what}")


def wait_until(check: Callable[[], T], what: str, timeout: float = 60.0, every: float = 0.05) -> T:
    """`check()`'s first true value; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(every)
