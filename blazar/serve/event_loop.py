"""Which event loop `blazar serve` runs on: uvloop where it is installed, else asyncio's.

uvloop (libuv under asyncio's API) runs the loop, its timers and its socket transports
in C. Measured on the gateway (docs/performance.md): 0.90x the instructions per relayed
chat request under callgrind (868k -> 779k), but no less CPU time at 16 clients (user
time per request 249-250 us on asyncio's loop, 256-274 us on uvloop); what a client
sees is the stream, 0.97-0.98 of the child's tokens/s through the gateway against
0.90-0.95 on asyncio's loop. Every part of serve is written against asyncio's API only,
so either loop runs it (the tests run serve on both); `BLAZAR_EVENT_LOOP=asyncio`
chooses asyncio's own, for a platform without uvloop or to rule the loop out when
chasing a fault.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

from blazar.errors import BlazarError

VARIABLE = "BLAZAR_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


class EventLoopError(BlazarError):
    """BLAZAR_EVENT_LOOP names no loop this host can run."""


def choose(asked: str | None, uvloop_installed: bool) -> str:
    """The loop to run: what `asked` names (BLAZAR_EVENT_LOOP), else uvloop when it is
    installed, else asyncio. A name that is not a loop, or uvloop asked for where it is
    not installed, is an EventLoopError that says what to do."""
    name = (asked or "").strip().lower()
    if not name:
        return "uvloop" if uvloop_installed else "asyncio"
    if name not in CHOICES:
        raise EventLoopError(
            f"{VARIABLE}={asked!r} names no event loop: use one of {', '.join(CHOICES)}, "
            "or unset it (uvloop where installed)"
        )
    if name == "uvloop" and not uvloop_installed:
        raise EventLoopError(
            f"{VARIABLE}=uvloop but uvloop is not installed: `pip install uvloop`, or set "
            f"{VARIABLE}=asyncio"
        )
    return name


def _uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, None]) -> str:
    """Run `main` to its end on the chosen loop; the loop's name."""
    name = choose(os.environ.get(VARIABLE), _uvloop_installed())
    if name == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
    return name


def current() -> str:
    """The running loop's name, for serve's log: uvloop or asyncio."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
