"""Fork servers: a wheel engine's children forked from a process that imported it already.

A wheel engine's child is a Python launcher (`launcher.py`, llama-server's flags on
xllamacpp). Started fresh, it spends about 70 ms of a tiny model's 110 ms start before
llama.cpp loads anything: fork and exec of serve, the interpreter's start, `import
xllamacpp` and the launcher's own imports (bench/swap_breakdown.py; docs/performance.md,
"Peers"). So serve keeps, per engine command it has started, one *fork server*
(`blazar/engines/launchers/fork_launcher.py` under the engine's Python, beside its
launcher) that has done those imports; a start asks it for a child over a Unix socket,
with the instance's log descriptor, and gets the pid of a fork that runs the installed
launcher with the instance's flags.

Ownership stays one owner per child process: a fork server belongs to `Forks` (it starts,
watches and stops it); a child it forked belongs to the `Instance` that asked for it, which
signals its group and waits for its exit exactly as for a spawned child (`Forked` is the
handle: pid, returncode, wait). The fork server only forks and reaps (it is the parent),
and reports each exit and its code on the socket. If a fork server dies, its children get
SIGTERM (PR_SET_PDEATHSIG) and their exits are seen through a pidfd (code unknown: -1).

Why a fork server and not a spare launcher (a pre-started process that waits for one
command line and becomes that child): each spare is used once, and making the next one
costs the whole start again (~85 ms of a core), so clients that alternate models faster
than that (every request a swap) would wait for it; a fork costs about 2 ms. The first
start of an engine command spawns a fresh child as before, and the fork server starts
START_AFTER later (not beside that start, whose core it would take). Anything that goes
wrong with a fork server (not ready yet, died, refused) falls back to a fresh spawn,
and after three such failures in a row for one command (a fork server that died before
it was ready, or that refused) none is started again. `serving.fork_server = false`
turns it off (docs/serve.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from blazar.engines import launchers
from blazar.host import children
from blazar.host.children import ChildProcess

logger = logging.getLogger("blazar.serve")
FORK_LAUNCHER = launchers.FORK
LAUNCHER_NAME = "launcher.py"  # the wheel llamacpp lane's installed launcher
REPLY_TIMEOUT = 5.0  # seconds a fork server may take to answer a fork
# Seconds after the first spawn of an engine command before its fork server starts: a
# tiny model's whole start, so that the fork server's imports do not take a core from it.
START_AFTER = 0.5
MAX_FAILURES = 3  # failures in a row (died before ready, refused) before none is started
GRACE = 2.0
MESSAGE_BYTES = 1 << 20
CMDLINE_ROOM = 1 << 16  # a child's command line longer than this shows cut in /proc
# Linux only: the fork server's checks (its threads, the child's command line) and the
# pidfds read /proc and Linux's calls; elsewhere every child is spawned.
ON_LINUX = sys.platform.startswith("linux")


def forkable(argv: Sequence[str]) -> bool:
    """Pure: whether a child's argv is a wheel engine's launcher under its Python, the one
    kind a fork server starts (other lanes' launchers, and binaries, are spawned)."""
    return (
        len(argv) >= 2
        and Path(argv[0]).name.startswith("python")
        and Path(argv[1]).name == LAUNCHER_NAME
    )


class Forked:
    """A child a fork server forked: what its `Instance` owns (pid, returncode, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)  # for an exit its fork server cannot report

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()
        self._close_pidfd()

    def orphaned(self) -> None:
        """Its fork server is gone (it got SIGTERM): its exit is seen through the pidfd."""
        if self.returncode is not None:
            return
        if self._pidfd is None:
            self.exited(-1)
            return
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pidfd, self.exited, -1)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


class ForkServer:
    """One fork server process (owned by `Forks`) and the socket to it."""

    def __init__(self, command: tuple[str, ...]) -> None:
        self.command = command
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.was_ready = False  # it imported the launcher once (a death after is no failure)
        self.dead = False
        self.children: dict[int, Forked] = {}
        self._sock: socket.socket | None = None
        self._reply: asyncio.Future[dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python, launcher = self.command
        try:
            # ROOM: argv space for the command line each child shows in /proc and `ps`
            argv = (python, str(FORK_LAUNCHER), launcher, "-" * CMDLINE_ROOM)
            # Its own output (a failed import's traceback) goes to serve's stderr, the log.
            self.proc = await children.spawn(
                argv, output=sys.stderr.fileno(), stdin=theirs.fileno()
            )
        except OSError:
            ours.close()
            self.dead = True
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._reader = asyncio.create_task(self._read(), name=f"fork server {launcher}")

    async def _read(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(self._sock, MESSAGE_BYTES)
                if not data:
                    break
                self._on_message(json.loads(data))
        except (OSError, ValueError) as exc:
            logger.warning("the fork server of %s failed: %r", self.command[1], exc)
        finally:
            self._gone()

    def _on_message(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            self.ready.set()
            self.was_ready = True
        elif "exit" in message:
            child = self.children.pop(int(message["exit"]), None)
            if child is not None:
                child.exited(int(message["code"]))
        elif self._reply is not None and not self._reply.done():
            self._reply.set_result(message)

    def _gone(self) -> None:
        self.dead = True
        self.ready.clear()
        if self._reply is not None and not self._reply.done():
            self._reply.set_result({"error": "the fork server exited"})
        for child in self.children.values():
            child.orphaned()
        self.children.clear()

    async def fork(self, args: Sequence[str], output: int) -> Forked | None:
        """A child running the launcher with `args`, its output into `output`; None when
        this server cannot fork now (the caller spawns a fresh process)."""
        async with self._lock:
            if self.dead or not self.ready.is_set() or self._sock is None:
                return None
            self._reply = asyncio.get_running_loop().create_future()
            try:
                socket.send_fds(self._sock, [json.dumps({"argv": list(args)}).encode()], [output])
                async with asyncio.timeout(REPLY_TIMEOUT):
                    reply = await self._reply
            except (OSError, TimeoutError) as exc:
                logger.warning("the fork server of %s did not fork: %r", self.command[1], exc)
                self.retire()
                return None
            finally:
                self._reply = None
        if "pid" not in reply:
            logger.warning("the fork server of %s refused: %s", self.command[1], reply.get("error"))
            self.retire()  # a refusal (threads) would come again: spawn from now on
            return None
        child = Forked(int(reply["pid"]))
        self.children[child.pid] = child
        return child

    def retire(self) -> None:
        """No more forks: the fork server exits once its children have (it still reports
        their exits); at once when it has none."""
        self.dead = True
        self.ready.clear()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    async def close(self, wait: float = GRACE) -> None:
        """Retire it and wait up to `wait` seconds for it to exit, then SIGTERM (which
        stops the children it still has: at serve's end, none)."""
        self.retire()
        if self.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), wait)
            await children.terminate(self.proc, GRACE)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class Forks:
    """The fork servers of one serve, one per wheel engine command started; `spawn` is
    how an `Instance` starts its child."""

    def __init__(self, enabled: bool = True, start_after: float = START_AFTER) -> None:
        self.enabled, self.start_after = enabled, start_after
        self.servers: dict[tuple[str, ...], ForkServer] = {}
        self.starting: dict[tuple[str, ...], asyncio.Task[None]] = {}  # due to start
        self.failures: dict[tuple[str, ...], int] = {}
        self.retired: list[ForkServer] = []  # no more forks; they exit after their children

    async def spawn(self, argv: Sequence[str], output: int) -> ChildProcess:
        """The child for `argv` (its output into `output`): forked by the command's fork
        server when one is ready, else spawned (and a fork server started for next time)."""
        if self.enabled and ON_LINUX and forkable(argv):
            command = (argv[0], argv[1])
            server = self.servers.get(command)
            if server is not None and not server.dead and server.ready.is_set():
                child = await server.fork(argv[2:], output)
                if child is not None:
                    self.failures.pop(command, None)
                    return child
                self.failures[command] = self.failures.get(command, 0) + 1  # it refused
            elif server is not None and server.dead and not server.was_ready:
                self.failures[command] = self.failures.get(command, 0) + 1  # died importing
            if server is not None and server.dead:  # died, or retired by its refusal
                del self.servers[command]
                self.retired.append(server)
                server = None
            if server is None and command not in self.starting:
                task = asyncio.create_task(self._start_later(command), name="fork server")
                self.starting[command] = task
        return await children.spawn(argv, output=output)

    async def _start_later(self, command: tuple[str, ...]) -> None:
        """Start the command's fork server once the start that asked is likely over: its
        imports would take a core from that child's own."""
        try:
            await asyncio.sleep(self.start_after)
            if self.enabled:
                await self._start(command)
        finally:
            self.starting.pop(command, None)

    async def _start(self, command: tuple[str, ...]) -> None:
        if self.failures.get(command, 0) >= MAX_FAILURES or command in self.servers:
            return
        server = ForkServer(command)
        try:
            await server.start()
        except OSError as exc:
            logger.warning("could not start a fork server for %s: %s", command[1], exc)
            self.failures[command] = self.failures.get(command, 0) + 1
            return
        self.servers[command] = server

    def keep(self, commands: Iterable[Sequence[str]]) -> None:
        """Retire the fork servers of engine commands no model uses any more (an engine
        updated or removed on a pass)."""
        used = {tuple(command[:2]) for command in commands}
        for command in [c for c in self.starting if c not in used]:
            self.starting.pop(command).cancel()
        for command in [c for c in self.servers if c not in used]:
            server = self.servers.pop(command)
            server.retire()
            self.retired.append(server)

    def configure(self, enabled: bool) -> None:
        """`serving.fork_server` on a pass: turned off, the fork servers are retired (the
        children they forked run on; the next starts are spawned)."""
        self.enabled = enabled
        if not enabled:
            for task in self.starting.values():
                task.cancel()
            for server in self.servers.values():
                server.retire()
            self.retired += self.servers.values()
            self.servers = {}

    async def close(self) -> None:
        """Stop every fork server (serve is ending: the instances were closed first)."""
        starting = list(self.starting.values())
        for task in starting:
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        servers = [*self.servers.values(), *self.retired]
        self.servers, self.retired = {}, []
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)
