"""One MCP server (`[mcp.NAME]`) and the one asyncio task that owns it.

The shape is `blazar.serve.supervisor.instance.Instance`'s: exactly one owner task
starts, restarts and stops the server (for `command`, a child spawned by
`blazar.host.children.spawn_stdio` in its own process group, dying with serve; for `url`,
an HTTP session to the URL as `blazar.urls.target` reads it, an ambiguous host refused
as a failed start); everyone else posts commands to its mailbox (`start`,
`ensure_ready`, `stop`, `close`) and awaits what the owner answers. Its helper tasks
only observe (the handshake, the child's exit, a `ping` every `health_every` seconds,
a changed tool list) and post events, each tagged with the generation it is about so
news of an earlier server is ignored.

Start: spawn or connect, then `initialize`, `notifications/initialized` and
`tools/list` within the server's `timeout`; READY then, with its tools. A server that
fails to start, exits, or stops answering `ping` is torn down and started again after
the next backoff delay; once the delays are spent it is FAILED (its last error kept),
and the next `ensure_ready` starts afresh. A request arriving while it is not READY
fails at once with what went wrong (STARTING: it waits for the start). Stop: stdin
closed (a stdio server's cue), SIGTERM to the group, `grace`, SIGKILL.

`call_tool` is I/O on the live link, not a command: calls from many requests run at
once, each within the server's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from blazar import urls
from blazar.errors import BlazarError
from blazar.host import children
from blazar.host.children import ChildLog
from blazar.protocols import mcp
from blazar.protocols.mcp import McpProtocolError, Tool
from blazar.serve.supervisor.mcp_link import HttpLink, Link, StdioLink

logger = logging.getLogger(__name__)
LIST_CHANGED = "notifications/tools/list_changed"
STABLE_AFTER = 30.0  # seconds READY after which a failure starts the backoff afresh


class McpState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"  # it failed; the next start waits for its delay
    FAILED = "failed"  # the delays are spent; the next ensure_ready starts afresh


class McpUnavailable(BlazarError):
    """The server is not ready: it failed, is restarting, or was stopped."""


@dataclass(frozen=True)
class McpSpec:
    """What to run or reach: the manifest's table, with the key read from key_env."""

    name: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str | None = None
    key: str | None = None
    timeout: float = 60.0
    log_path: Path | None = None  # None: only the last lines, in memory

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


@dataclass(frozen=True)
class _Ensure:
    reply: asyncio.Future[None] | None  # None: start, nobody waits


@dataclass(frozen=True)
class _Stop:
    reply: asyncio.Future[None]
    close: bool


@dataclass(frozen=True)
class _Event:
    """From a helper about generation `gen`: up (value: tools), down (value: why), retry,
    tools (value: a new list)."""

    kind: str
    gen: int
    value: Any = None


def _settle(fut: asyncio.Future[Any], error: Exception | None = None) -> None:
    if not fut.done():
        fut.set_result(None) if error is None else fut.set_exception(error)


class McpServer:
    """One MCP server, supervised. Read `state`, `tools`, `last_error`, `restarts`."""

    def __init__(
        self,
        spec: McpSpec,
        *,
        backoff: Sequence[float] = (0.5, 1, 2, 4, 8),
        health_every: float = 30.0,
        grace: float = 2.0,
        on_event: Callable[[McpServer, str], None] | None = None,
    ) -> None:
        self.spec = spec
        self._backoff, self._health_every, self._grace = tuple(backoff), health_every, grace
        self._on_event = on_event
        self._mailbox: asyncio.Queue[_Ensure | _Stop | _Event] = asyncio.Queue()
        self._owner: asyncio.Task[None] | None = None
        self._log = ChildLog(spec.log_path)
        # Public views, written by the owner only.
        self.state = McpState.STOPPED
        self.tools: tuple[Tool, ...] = ()
        self.last_error: str | None = None
        self.restarts = 0
        self.ready_at: float | None = None
        # The owner's own.
        self._gen = 0
        self._failures = 0
        self._want = self._closing = self._done = False
        self._proc: asyncio.subprocess.Process | None = None
        self._link: Link | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._helpers: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- commands -----------------------------------------------------------------------

    def start(self) -> None:
        """Start it if it is not running (nobody waits)."""
        self._post(_Ensure(None))

    async def ensure_ready(self) -> None:
        """Start it if needed and wait until it is READY; McpUnavailable if it is not."""
        if self._closing or (self._owner is not None and self._owner.done()):
            raise McpUnavailable(f"MCP server '{self.spec.name}' is stopped")
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(_Ensure(reply))
        await reply

    async def stop(self) -> None:
        await self._send_stop(close=False)

    async def close(self) -> None:
        """Stop it for good and end the owner. Idempotent."""
        await self._send_stop(close=True)
        self._closing = True
        if self._owner is not None:
            await self._owner

    async def _send_stop(self, close: bool) -> None:
        if self._owner is None or self._owner.done():
            return
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(_Stop(reply, close))
        await reply

    def _post(self, event: _Ensure | _Stop | _Event) -> None:
        if self._owner is None:
            self._owner = asyncio.create_task(self._own(), name=f"mcp {self.spec.name}")
        self._mailbox.put_nowait(event)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Call a tool: (its result as text, whether the tool said it failed). Raises
        McpUnavailable when the server is not ready, McpProtocolError when the call
        itself fails (no answer in time, an error answer)."""
        await self.ensure_ready()
        link = self._link
        if link is None:
            raise McpUnavailable(f"MCP server '{self.spec.name}' went away")
        params = {"name": name, "arguments": arguments}
        return mcp.result_text(await link.request("tools/call", params, self.spec.timeout))

    # -- the owner ----------------------------------------------------------------------

    async def _own(self) -> None:
        try:
            while not self._done:
                match await self._mailbox.get():
                    case _Ensure(reply):
                        await self._on_ensure(reply)
                    case _Stop(reply, close):
                        await self._on_stop(reply, close)
                    case _Event("up", gen, tools) if self._now(gen, McpState.STARTING):
                        self.state, self.tools, self.ready_at = McpState.READY, tools, time.time()
                        self._answer_waiters()
                        self._helper(self._health(gen))
                        self._emit("ready")
                    case _Event("tools", gen, tools) if self._now(gen, McpState.READY):
                        self.tools = tools
                    case _Event("down", gen, why) if gen == self._gen and self.state in (
                        McpState.STARTING,
                        McpState.READY,
                    ):
                        await self._on_down(str(why))
                    case _Event("retry", gen) if self._now(gen, McpState.BACKOFF):
                        self.restarts += 1
                        await self._spawn()
        finally:
            await self._teardown()
            self._answer_waiters(McpUnavailable(f"MCP server '{self.spec.name}' is stopped"))
            self.state = McpState.STOPPED
            self._log.close()

    def _now(self, gen: int, state: McpState) -> bool:
        return gen == self._gen and self.state is state

    async def _on_ensure(self, reply: asyncio.Future[None] | None) -> None:
        if self._closing:
            if reply is not None:
                _settle(reply, McpUnavailable(f"MCP server '{self.spec.name}' is stopped"))
            return
        self._want = True
        if self.state is McpState.READY:
            if reply is not None:
                _settle(reply)
            return
        if self.state is McpState.BACKOFF and reply is not None:
            _settle(reply, McpUnavailable(self._unready("is restarting")))
            return
        if reply is not None:
            self._waiters.append(reply)
        if self.state in (McpState.STOPPED, McpState.FAILED):
            self._failures = 0
            await self._spawn()

    async def _on_stop(self, reply: asyncio.Future[None], close: bool) -> None:
        self._want = False
        self._closing = self._closing or close
        self._answer_waiters(McpUnavailable(f"MCP server '{self.spec.name}' was stopped"))
        await self._teardown()
        self.state, self.tools = McpState.STOPPED, ()
        _settle(reply)
        self._done = close

    async def _on_down(self, why: str) -> None:
        was = self.state
        if was is McpState.READY and time.time() - (self.ready_at or 0) >= STABLE_AFTER:
            self._failures = 0  # it ran a good while: the backoff starts afresh
        self.last_error = why
        self._log.note(why)
        await self._teardown()
        self.tools = ()
        self._answer_waiters(McpUnavailable(self._unready("failed")))
        self._emit("exited" if was is McpState.READY else "failed")
        if self._failures >= len(self._backoff):
            self.state = McpState.FAILED
            return
        delay = self._backoff[self._failures]
        self._failures += 1
        self.state = McpState.BACKOFF
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._mailbox.put_nowait, _Event("retry", self._gen))

    def _unready(self, what: str) -> str:
        return f"MCP server '{self.spec.name}' {what}: {self.last_error or 'not started'}"

    def _answer_waiters(self, error: Exception | None = None) -> None:
        for reply in self._waiters:
            _settle(reply, error)
        self._waiters.clear()

    async def _spawn(self) -> None:
        self._gen += 1
        gen, spec = self._gen, self.spec
        self.state = McpState.STARTING
        self._log.new_child()

        def notice(method: str) -> None:
            if method == LIST_CHANGED:
                self._helper(self._relist(gen))

        if spec.command:
            self._log.note(f"starting {shlex.join(spec.command)}")
            try:
                self._proc = await children.spawn_stdio(spec.command, dict(spec.env))
            except OSError as err:
                self._mailbox.put_nowait(
                    _Event("down", gen, f"could not run {spec.command[0]}: {err}")
                )
                return
            stdio = StdioLink(self._proc, self._log, notice)
            self._helper(children.watch_exit(self._proc, stdio.reader, self._exited(gen)))
            link: Link = stdio
        else:
            assert spec.url is not None
            try:  # the URL as checked, its host as aiohttp dials it
                url = urls.target(spec.url, credentials=True).url
            except urls.RefusedUrl as err:
                self._mailbox.put_nowait(_Event("down", gen, str(err)))
                return
            link = HttpLink(url, spec.key, notice)
        self._link = link
        self._emit("starting")
        self._helper(self._handshake(gen, link))

    def _exited(self, gen: int) -> Callable[[int], None]:
        def report(code: int) -> None:
            last = self._log.last_line()
            why = f"exited with code {code}" + (f": {last}" if last else "")
            self._mailbox.put_nowait(_Event("down", gen, why))

        return report

    async def _teardown(self) -> None:
        """Close the link and stop the child, if any; cancel the helpers and the timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        current = asyncio.current_task()
        helpers = [t for t in self._helpers if t is not current]
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        link, proc = self._link, self._proc
        self._link = self._proc = None
        if link is not None:
            with contextlib.suppress(Exception):
                await link.close()
        if proc is not None:
            code = await children.terminate(proc, self._grace)
            self._log.note(f"stopped (exit code {code})")
        self.ready_at = None

    # -- helpers (they only report) -----------------------------------------------------

    def _helper(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)

    async def _list(self, link: Link) -> tuple[Tool, ...]:
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(100):  # pages: a server that never ends its list is cut off here
            params = {"cursor": cursor} if cursor else None
            answer = await link.request("tools/list", params, self.spec.timeout)
            page, cursor = mcp.tools_page(answer)
            tools.extend(page)
            if cursor is None:
                break
        return tuple(tools)

    async def _handshake(self, gen: int, link: Link) -> None:
        timeout = self.spec.timeout
        try:
            async with asyncio.timeout(timeout):
                await link.request("initialize", mcp.initialize_params(), timeout)
                await link.notify("notifications/initialized")
                tools = await self._list(link)
        except (McpProtocolError, TimeoutError) as exc:
            why = str(exc) or f"did not answer within {timeout:g} s"
            self._mailbox.put_nowait(_Event("down", gen, f"start failed: {why}"))
            return
        self._mailbox.put_nowait(_Event("up", gen, tools))

    async def _relist(self, gen: int) -> None:
        link = self._link
        with contextlib.suppress(McpProtocolError, TimeoutError):
            if link is not None:
                self._mailbox.put_nowait(_Event("tools", gen, await self._list(link)))

    async def _health(self, gen: int) -> None:
        while True:
            await asyncio.sleep(self._health_every)
            link = self._link
            if link is None:
                return
            try:
                await link.request("ping", None, min(10.0, self.spec.timeout))
            except McpProtocolError as exc:
                self._mailbox.put_nowait(_Event("down", gen, f"did not answer ping: {exc}"))
                return

    def _emit(self, name: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(self, name)
            except Exception:  # a listener's bug must not kill the owner
                logger.exception("on_event(%s, %r) failed", self.spec.name, name)
