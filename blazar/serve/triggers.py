"""What makes `blazar serve` look again: the manifest changing, an apply elsewhere ending,
the timer.

The control loop (`blazar.serve.daemon`) is level-triggered: each of these only sets
its `wake` event, and the next pass reads everything afresh. `watch_manifest` watches
the manifest's own files (watchfiles); `timer` wakes it every TIMER seconds;
`when_released` wakes it once the apply lock is free, after a pass found it held by
another apply (an imperative command such as `blazar lora add`, or `blazar apply`),
so what that apply declared is served as soon as it is done, not at the next timer
pass. Why serve polls the lock rather than being told is in docs/serve.md.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from blazar.host.locking import held

TIMER = 30.0
LOCK_POLL = 0.1  # seconds between looks at the apply lock while another apply holds it


async def watch_manifest(manifest: Path, stop: asyncio.Event, wake: asyncio.Event) -> None:
    """Set `wake` whenever the manifest (a file, or a directory's manifest files and its
    hosts/ overlays) changes, until `stop` is set."""
    from watchfiles import awatch

    target = manifest.resolve()
    watch_dir = target if target.is_dir() else target.parent
    watch_dir.mkdir(parents=True, exist_ok=True)

    def is_manifest(change: object, path: str) -> bool:
        """Only the manifest's own files: other files in its folder (logs, editors'
        swap files) must not trigger a reconcile pass."""
        if target.is_dir():
            name = Path(path).name
            return (
                Path(path).parent in (target, target / "hosts")  # hosts/: the overlays
                and not name.startswith(".")
                and (name.endswith((".toml", ".yaml", ".yml")))
            )
        return Path(path) == target

    async for _ in awatch(
        watch_dir, stop_event=stop, debounce=200, step=50, watch_filter=is_manifest
    ):
        wake.set()


async def timer(wake: asyncio.Event, every: float = TIMER) -> None:
    while True:
        await asyncio.sleep(every)
        wake.set()


async def when_released(lock: Path, wake: asyncio.Event, poll: float = LOCK_POLL) -> None:
    """Set `wake` as soon as nobody holds the apply lock at `lock` (at once if nobody
    does): the pass that found it held runs again then."""
    while held(lock):
        await asyncio.sleep(poll)
    wake.set()
