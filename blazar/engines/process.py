"""An engine server child for one job: start it, use its URL, stop it.

Used by `blazar bench` and the engine update gate (`blazar.engines.bench`) and
by tests that need a bare engine. It is `blazar.serve.supervisor.instance.Instance`
without the supervision: no mailbox, no respawn, one start and one stop. The
mechanics are the same ones, `blazar.host.children`'s: `--port 0` and the listening
line, its own process group, PDEATHSIG, health polled to a deadline with a fast
failure (and the log's last lines) on an early exit, SIGTERM/grace/SIGKILL.

It is asyncio: an `async with EngineServer(...)` inside `asyncio.run(...)`.
The event loop must keep running while the child does, because it drains the
child's output; blocking work (a urllib request, a CLI call) goes through
`asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from blazar.errors import BlazarError
from blazar.host import children
from blazar.host.children import ChildLog


class EngineStartError(BlazarError):
    """The engine's server exited or never became healthy."""


class EngineServer:
    """One engine server child. `async with` it, or await start() and stop()."""

    def __init__(
        self,
        command: Sequence[str],
        args: Sequence[str],
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        start_timeout: float = 120.0,
        grace: float = 5.0,
    ) -> None:
        self.host = host
        self.argv = children.server_argv(command, args, host)
        self.log = ChildLog(log_path)
        self.start_timeout, self.grace = start_timeout, grace
        self.port: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._helpers: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        if self.port is None:
            raise EngineStartError("the engine server is not running")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> str:
        """Spawn the child and wait until it is healthy; its base URL."""
        self.log.new_child()
        self.log.note(f"starting {shlex.join(self.argv)}")
        try:
            self._proc = proc = await children.spawn(self.argv)
        except OSError as err:
            raise EngineStartError(f"could not run {self.argv[0]}: {err}") from None
        loop = asyncio.get_running_loop()
        port: asyncio.Future[int] = loop.create_future()
        exited: asyncio.Future[int] = loop.create_future()
        assert proc.stdout is not None
        reader = asyncio.create_task(
            children.read_output(proc.stdout, self.log, _once(port), proc.pid)
        )
        watcher = asyncio.create_task(children.watch_exit(proc, reader, _once(exited)))
        self._helpers = [reader, watcher]

        async def healthy() -> int:
            await children.poll_health(self.host, await port)
            return port.result()

        ready = asyncio.create_task(healthy())
        try:
            await asyncio.wait(
                {ready, exited}, timeout=self.start_timeout, return_when="FIRST_COMPLETED"
            )
        except BaseException:  # cancelled while starting: leave no child behind
            ready.cancel()
            await self.stop()
            raise
        if ready.done():
            self.port = ready.result()
            return self.url
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        if exited.done():
            reason = f"exited with code {exited.result()} before it became healthy"
        else:
            reason = f"did not become healthy within {self.start_timeout:g} s"
        await self.stop()
        raise EngineStartError(self.log.describe(f"engine {reason} ({shlex.join(self.argv)})"))

    async def stop(self) -> int | None:
        """SIGTERM the child's group, SIGKILL after the grace period; its exit code."""
        proc, self._proc, self.port = self._proc, None, None
        if proc is None:
            return None
        code = await children.terminate(proc, self.grace)
        for task in self._helpers:
            task.cancel()
        await asyncio.gather(*self._helpers, return_exceptions=True)
        self.log.note(f"exited with code {code}")
        self.log.close()
        return code

    async def __aenter__(self) -> EngineServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _once(future: asyncio.Future[int]) -> Callable[[int], None]:
    """A callback that settles `future` with the first value it is given."""

    def settle(value: int) -> None:
        if not future.done():
            future.set_result(value)

    return settle
