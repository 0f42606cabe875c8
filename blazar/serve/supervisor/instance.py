"""One engine child server (an *instance*) and the one asyncio task that owns it.

The scheduler creates an `Instance` per (model, engine tag, replica, adapter
variant) and calls `ensure_ready()` before it routes a request there, `stop()`
to unload it and `close()` (or `stop_all()`) at shutdown.

Ownership (llama-swap's lesson): each instance has exactly one owner task, the
only code that spawns, signals, restarts or reaps its child. Everyone else
posts commands to its mailbox and awaits a future the owner resolves; nobody
acts on a snapshot of the state. The owner's helper tasks only observe (read
the child's output, poll `/health`, wait for the exit) and post events to the
same mailbox, so every decision is made in one place, one event at a time.

Start: spawn with `--port 0` in a new process group (and, on Linux, with
PR_SET_PDEATHSIG so the child gets SIGTERM if the thread that spawned it dies), or
have the `spawn` function given (serve's `forks.Forks.spawn`: a wheel engine's
launcher forked by its fork server, the same owner's child all the same),
parse the port from the "listening on" line, poll `/health` to the deadline,
fail fast on an early exit. Stop: SIGTERM to the group, `grace` seconds, then
SIGKILL. A READY child that exits unexpectedly is respawned with backoff. The
mechanics (spawn, output, health probe, signals) are `blazar.host.children`'s, shared
with the one-job children of `blazar bench`; this module holds the decisions.

`blazar serve` must end with `await stop_all(instances)`: install
`loop.add_signal_handler(SIGTERM/SIGINT, shutdown.set)`, await `shutdown`, then
call it. If the loop is torn down without it (asyncio.run cancels the owners),
each owner still terminates its child on the way out; PDEATHSIG covers a
Blazar killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from blazar.errors import BlazarError
from blazar.host import children
from blazar.host.children import ChildProcess, DirectLog, signal_group

STABLE_AFTER = 30.0  # seconds READY after which a crash starts the backoff afresh
# How an instance starts its child: (argv, the descriptor its output goes to) -> the child.
# `children.spawn` by default; serve's `Forks.spawn` forks a wheel engine's launcher.
Spawn = Callable[[Sequence[str], int], Awaitable[ChildProcess]]
logger = logging.getLogger(__name__)


class State(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    BACKOFF = "backoff"  # a READY child crashed; the respawn waits for its delay
    FAILED = "failed"  # a start failed (or respawns gave up); the next ensure_ready tries again


class InstanceFailed(BlazarError):
    """The child exited, never became healthy, or was stopped before it was ready."""


@dataclass(frozen=True)
class InstanceSpec:
    """What to run: the argv without --host/--port, which the instance adds."""

    key: str  # identity, e.g. "tiny/0"; unique per instance
    model: str
    replica: int
    engine_tag: str
    command: tuple[str, ...]  # the engine's argv prefix: (python, launcher.py) or (llama-server,)
    args: tuple[str, ...]  # llama-server flags except --host/--port
    log_path: Path  # per-instance log, rotated
    health_timeout: float = 120.0
    slots: int = 1  # informational (the scheduler uses it)
    ctx: int = 0  # informational

    def argv(self, host: str) -> tuple[str, ...]:
        return children.server_argv(self.command, self.args, host)


# The owner's mailbox: commands from callers, and events from its helpers and timers.
@dataclass(frozen=True)
class _EnsureReady:
    reply: asyncio.Future[str]


@dataclass(frozen=True)
class _Stop:
    reply: asyncio.Future[None]
    close: bool


@dataclass(frozen=True)
class _Child:
    """From a helper or timer about child `gen`: listening (value: port), healthy,
    start_timeout, kill_now, retry, exited (value: exit code)."""

    kind: str
    gen: int
    value: int = 0


_Event = _EnsureReady | _Stop | _Child


def _settle(fut: asyncio.Future[Any], result: Any = None, error: Exception | None = None) -> None:
    if not fut.done():  # a caller that gave up cancelled its future
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


class Instance:
    """One child server. Events passed to `on_event`: starting, ready, exited (a READY child
    exited unexpectedly), failed (a start attempt failed; state BACKOFF means it will retry),
    stopped (a stop completed)."""

    def __init__(
        self,
        spec: InstanceSpec,
        *,
        host: str = "127.0.0.1",
        on_event: Callable[[Instance, str], None] | None = None,
        backoff: Sequence[float] = (0.5, 1, 2, 4, 8),
        grace: float = 5.0,
        stable_after: float = STABLE_AFTER,
        spawn: Spawn | None = None,
    ) -> None:
        self.spec, self.host = spec, host
        self._spawner = spawn
        self._on_event, self._backoff = on_event, tuple(backoff)
        self._grace, self._stable_after = grace, stable_after
        self._mailbox: asyncio.Queue[_Event] = asyncio.Queue()
        self._owner: asyncio.Task[None] | None = None
        self._closed = False
        self._log = DirectLog(spec.log_path)
        # Public views, written by the owner task only: read them, never decide on them.
        self.state = State.STOPPED
        self.port: int | None = None
        self.restarts = 0  # respawns after a crash
        self.last_error: str | None = None
        self.started_at: float | None = None  # wall-clock time the current child was spawned
        self.ready_event = asyncio.Event()  # set while READY: watch readiness without a start
        # The owner's private state.
        self._proc: ChildProcess | None = None
        self._gen = 0  # spawn generation: events about an earlier child are ignored
        self._failures = 0  # respawn attempts since the child was last stably READY
        self._ready_at = 0.0
        self._want = False  # desired: running
        self._respawning = False  # the start in progress follows a crash: retry if it fails
        self._kill_reason: str | None = None  # set while a failed start is being killed
        self._closing = self._done = False
        self._ready_waiters: list[asyncio.Future[str]] = []
        self._stop_waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None  # start deadline, grace or backoff
        self._helpers: set[asyncio.Task[None]] = set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.port else None

    def log_tail(self, n: int = 20) -> list[str]:
        """The last `n` lines the current (or last) child printed."""
        return self._log.tail(n)

    def __repr__(self) -> str:
        return f"<Instance {self.spec.key} {self.state} pid={self.pid} port={self.port}>"

    # --- commands ------------------------------------------------------------------------
    async def ensure_ready(self) -> str:
        """Start the child if needed (or join the start in progress); return its base URL."""
        if self._closed or (self._owner is not None and self._owner.done()):
            raise InstanceFailed(f"instance {self.spec.key} is closed")
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._post(_EnsureReady(reply))
        return await reply

    async def stop(self) -> None:
        """Stop the child (SIGTERM, grace, SIGKILL) and cancel any respawn. Idempotent."""
        await self._send_stop(close=False)

    async def close(self) -> None:
        """Stop the child and end the owner task for good. Idempotent."""
        await self._send_stop(close=True)
        self._closed = True
        if self._owner is not None:
            await self._owner

    async def _send_stop(self, close: bool) -> None:
        if self._closed or self._owner is None or self._owner.done():
            return
        reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(_Stop(reply, close))
        await reply

    def _post(self, event: _Event) -> None:
        if self._owner is None:
            self._owner = asyncio.create_task(self._own(), name=f"instance {self.spec.key}")
        self._mailbox.put_nowait(event)

    # --- the owner -----------------------------------------------------------------------
    async def _own(self) -> None:
        try:
            while not self._done:
                match await self._mailbox.get():
                    case _EnsureReady(reply):
                        await self._on_ensure_ready(reply)
                    case _Stop(reply, close):
                        self._on_stop(reply, close)
                    case _Child("listening", gen, port) if self._current(gen, State.STARTING):
                        self.port = port
                        self._helper(self._report_healthy(gen, port))
                    case _Child("healthy", gen) if self._current(gen, State.STARTING):
                        self._on_healthy()
                    case _Child("start_timeout", gen) if self._current(gen, State.STARTING):
                        self._kill_reason = (
                            f"did not become healthy within {self.spec.health_timeout:g} s"
                        )
                        self._terminate()
                    case _Child("kill_now", gen) if self._current(gen, State.STOPPING):
                        self._log.note(f"still running after {self._grace:g} s: SIGKILL")
                        signal_group(self._gen_pid(), signal.SIGKILL)
                    case _Child("retry", gen) if self._current(gen, State.BACKOFF):
                        self.restarts += 1
                        await self._spawn()
                    case _Child("exited", gen, code) if gen == self._gen and self._proc is not None:
                        await self._on_exited(code)
        finally:
            await self._shutdown()

    def _current(self, gen: int, state: State) -> bool:
        return gen == self._gen and self.state is state

    def _gen_pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    async def _on_ensure_ready(self, reply: asyncio.Future[str]) -> None:
        if self._closing:  # a start now would outlive close()
            _settle(reply, error=InstanceFailed(f"instance {self.spec.key} is closed"))
            return
        if self.state is State.READY:
            _settle(reply, self.url)
            return
        self._ready_waiters.append(reply)
        self._want = True
        if self.state in (State.STOPPED, State.FAILED):
            self._failures, self._respawning = 0, False
            await self._spawn()
        # STARTING, BACKOFF, STOPPING: the start in progress (or next) answers the waiters

    def _on_stop(self, reply: asyncio.Future[None], close: bool) -> None:
        self._closing = self._closing or close
        self._want = False
        self._stop_waiters.append(reply)
        self._fail_waiters(InstanceFailed(f"instance {self.spec.key} was stopped"))
        if self.state in (State.STARTING, State.READY):
            self._terminate()
        elif self.state is not State.STOPPING:  # STOPPED, FAILED, BACKOFF: nothing runs
            self._set_stopped()

    def _on_healthy(self) -> None:
        self.state, self._ready_at = State.READY, time.monotonic()
        self._cancel_timer()
        self.ready_event.set()
        for reply in self._ready_waiters:
            _settle(reply, self.url)
        self._ready_waiters.clear()
        self._emit("ready")

    async def _on_exited(self, code: int) -> None:
        pid, was = self._gen_pid(), self.state
        # Sweep what the child left in its group (a live group's id is never reused).
        signal_group(pid, signal.SIGKILL)
        self._proc = self.port = self.started_at = None
        self.ready_event.clear()
        self._cancel_timer()
        self._log.note(f"exited with code {code}")
        if was is State.STOPPING and self._kill_reason is None:  # the exit we asked for
            if self._want:  # an ensure_ready arrived while it was stopping
                self._emit("stopped")
                self._failures, self._respawning = 0, False
                await self._spawn()
            else:
                self._set_stopped()
                self._emit("stopped")
        elif was is State.READY:
            self.last_error = f"exited with code {code} while ready"
            if time.monotonic() - self._ready_at >= self._stable_after:
                self._failures = 0
            self._respawning = True
            self._schedule_retry()
            self._emit("exited")
        else:  # STARTING, or STOPPING a failed start
            reason = self._kill_reason or f"exited with code {code} before it became ready"
            self._kill_reason = None
            await self._start_failed(reason)

    async def _start_failed(self, reason: str) -> None:
        last = self._log.last_line()
        self.last_error = f"{reason}: {last}" if last else reason
        described = self._log.describe(f"instance {self.spec.key} ({self.spec.model}) {reason}")
        self._fail_waiters(InstanceFailed(described))
        if not self._want:
            self._set_stopped()
        elif self._respawning:
            self._schedule_retry()
        else:
            self.state, self._want = State.FAILED, False
        self._emit("failed")

    def _schedule_retry(self) -> None:
        if self._failures >= len(self._backoff):
            self.state, self._want = State.FAILED, False
            self._fail_waiters(InstanceFailed(f"instance {self.spec.key}: {self.last_error}"))
            return
        delay = self._backoff[self._failures]
        self._failures += 1
        self.state = State.BACKOFF
        self._set_timer(delay, _Child("retry", self._gen))

    def _set_stopped(self) -> None:
        self._cancel_timer()
        self.state = State.STOPPED
        for reply in self._stop_waiters:
            _settle(reply)
        self._stop_waiters.clear()
        self._done = self._closing

    def _fail_waiters(self, error: InstanceFailed) -> None:
        for reply in self._ready_waiters:
            _settle(reply, error=error)
        self._ready_waiters.clear()

    async def _spawn(self) -> None:
        self._gen += 1
        self.state, self.port = State.STARTING, None
        self._log.new_child()
        argv = self.spec.argv(self.host)
        self._log.note(f"starting {shlex.join(argv)}")
        try:
            if self._spawner is not None:
                proc = await self._spawner(argv, self._log.fd_for_child())
            else:
                proc = await children.spawn(argv, output=self._log.fd_for_child())
        except OSError as err:
            await self._start_failed(f"could not run {argv[0]}: {err}")
            return
        self._proc, self.started_at = proc, time.time()
        self._emit("starting")
        gen = self._gen
        # The child writes its log itself; this reads the file for the port, then its size.
        self._helper(children.watch_log(proc, self._log, self._event("listening", gen)))
        self._helper(children.watch_exit(proc, None, self._event("exited", gen)))
        self._set_timer(self.spec.health_timeout, _Child("start_timeout", gen))

    def _terminate(self) -> None:
        self.state = State.STOPPING
        self.ready_event.clear()
        signal_group(self._gen_pid(), signal.SIGTERM)
        self._set_timer(self._grace, _Child("kill_now", self._gen))

    async def _shutdown(self) -> None:
        """The owner's last act, however it ends (close, or cancelled at loop teardown)."""
        self._closed = True
        if self._proc is not None:
            await children.terminate(self._proc, self._grace)
        self._proc = self.port = None
        self._cancel_timer()
        for task in self._helpers:
            task.cancel()
        await asyncio.gather(*self._helpers, return_exceptions=True)
        closed = InstanceFailed(f"instance {self.spec.key} is closed")
        while not self._mailbox.empty():  # commands that arrived too late
            match self._mailbox.get_nowait():
                case _EnsureReady(reply):
                    self._ready_waiters.append(reply)
                case _Stop(reply, _):
                    self._stop_waiters.append(reply)
        self._fail_waiters(closed)
        self._set_stopped()
        self.ready_event.clear()
        self._log.close()

    # --- timers, helpers, output -----------------------------------------------------------
    def _set_timer(self, delay: float, event: _Event) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._mailbox.put_nowait, event)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _helper(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)
        return task

    def _emit(self, name: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(self, name)
            except Exception:  # a listener's bug must not kill the owner
                logger.exception("on_event(%s, %r) failed", self.spec.key, name)

    def _event(self, kind: str, gen: int) -> Callable[[int], None]:
        """A helper's report about child `gen`, posted to the mailbox."""
        return lambda value: self._mailbox.put_nowait(_Child(kind, gen, value))

    async def _report_healthy(self, gen: int, port: int) -> None:
        """Helper: poll /health until 200; the owner's timer enforces the deadline."""
        await children.poll_health(self.host, port)
        self._mailbox.put_nowait(_Child("healthy", gen))


async def stop_all(instances: Iterable[Instance]) -> None:
    """Close every instance at once (so shutdown takes one grace period, not one each)."""
    results = await asyncio.gather(*(i.close() for i in instances), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            logger.error("closing an instance failed: %r", result)


InstanceId = tuple[str, float | None]


def instance_id(instance: Instance) -> InstanceId:
    """An instance's identity for this child: a respawn is another one."""
    return (instance.spec.key, getattr(instance, "started_at", None))  # stand-ins lack it
