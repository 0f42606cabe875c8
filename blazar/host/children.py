"""The one set of primitives for engine server children: spawn, output, health, stop.

Three owners are built on them: `blazar.serve.supervisor.instance.Instance`, the
supervised child behind `blazar serve` (one owner task, a mailbox, respawn with
backoff), `blazar.serve.supervisor.mcp_server.McpServer`, the same shape for an MCP
server talking over its pipes (`spawn_stdio`), and `blazar.engines.process.EngineServer`,
a child for one job (`blazar bench`, the engine update gate, tests); and
`blazar.serve.supervisor.forks.Forks`, which owns the fork servers (`spawn` with a
socket as stdin) whose forks an `Instance` owns as it owns a spawned child
(`ChildProcess`). Nothing else spawns or signals a child.

- `spawn`: the argv in its own process group (a stop reaches every descendant)
  and, on Linux, with PR_SET_PDEATHSIG, so the child gets SIGTERM if the thread
  that spawned it dies; output (stdout and stderr) on one pipe.
- `read_output`: copies that output to a `ChildLog` (a rotated, buffered file
  and an in-memory tail) and reports the port of the first "listening on
  http://HOST:PORT" line: children start with `--port 0`, so no port is picked
  in advance and none can be taken by someone else in between. A server that says
  it listens without naming the port it bound (ik_llama.cpp's `port="0"`) is
  asked the kernel instead (`listening_socket`, Linux's /proc).
- `DirectLog` and `watch_log`: the supervised instance's child writes its output
  to its log file itself (`spawn(..., output=fd)`), so serve copies nothing per
  request; `watch_log` reads the file for the port while the child starts, then
  only its size now and then (rotation). `EngineServer` and MCP servers keep the pipe.
- `watch_exit`: reports the exit once the output has been read.
- `poll_health`: GET /health until 200, at a short fixed interval.
- `signal_group` and `terminate`: SIGTERM to the group, a grace period, SIGKILL,
  and a sweep of whatever the child left in its group.

All of it is stdlib asyncio: no HTTP client library sits below `blazar.serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

LISTENING = re.compile(r"listening on http://[^:\s]+:(\d+)")
# ik_llama.cpp's server (the catalog's `ik` fork) says `HTTP server listening ... port="N"`,
# with N the port it was asked for: 0 under `--port 0`, which it did bind to a free port.
LISTENING_FIELD = re.compile(r'HTTP server listening\b.*\bport="(\d+)"')
TAIL_LINES = 50
LOG_BYTES, LOG_BACKUPS = 5 * 2**20, 3
KERNEL_AFTER = 1.0  # seconds without a listening line before its socket is asked for
OUTPUT_LIMIT = 2**20  # longest output line kept; asyncio drops longer ones
_PR_SET_PDEATHSIG = 1


# -- decisions (pure) ------------------------------------------------------------------------


def listening_port(line: str) -> int | None:
    """The port a "listening on http://HOST:PORT" line names, if it is one (0: a server
    that says it listens but names the port it was asked for, `--port 0`)."""
    match = LISTENING.search(line) or LISTENING_FIELD.search(line)
    return int(match[1]) if match else None


def listening_socket(pid: int) -> int | None:
    """The TCP port process `pid` listens on, read from Linux's /proc (its sockets'
    inodes, then the kernel's tables of listening sockets); None if it has none yet, or
    no /proc. For a server that does not name the port it bound under `--port 0`."""
    try:
        inodes = {
            os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
        }
        for table in ("tcp", "tcp6"):
            for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = row.split()
                if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    return int(cols[1].rsplit(":", 1)[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def health_delay(elapsed: float) -> float:
    """Seconds to wait before the next /health probe, `elapsed` seconds into the poll.

    Each probe costs a loopback connection (well under a millisecond), so the first
    seconds are polled finely: the doubling backoff up to 0.25 s this replaced saw a
    server that turned healthy 0.6 s into the poll only at 0.8 s. (The launcher names
    its port once the model is loaded, so its first probe succeeds; an engine that
    names it earlier is polled.) A long load is polled more coarsely.
    """
    return 0.01 if elapsed < 5.0 else 0.05


def log_delay(elapsed: float) -> float:
    """Seconds to wait before reading a starting child's log again, `elapsed` seconds in.

    A read of the file's new bytes costs a few microseconds, so the first second is
    read every 2 ms: a forked launcher is listening 20 ms after its fork, and at
    `health_delay`'s 10 ms half of that again went by before serve saw it
    (bench/swap_breakdown.py). Then as `health_delay`.
    """
    return 0.002 if elapsed < 1.0 else health_delay(elapsed)


def server_argv(command: Sequence[str], args: Sequence[str], host: str) -> tuple[str, ...]:
    """The argv of an engine server: its command, its flags, then `--host H --port 0`."""
    return (*command, *args, "--host", host, "--port", "0")


# -- the log ---------------------------------------------------------------------------------


def owner_only(path: str, flags: int) -> int:
    """An `opener` for `open()` that makes the file readable by its owner only (0600),
    also when it existed with a wider mode: logs quote what clients and children sent."""
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def restrict_rotations(path: Path, backups: int) -> None:
    """Make `path`'s rotated files (`NAME.1` ... `NAME.<backups>`) owner-only too: ones
    written before logs were opened `owner_only` kept the mode they were made with."""
    for index in range(1, backups + 1):
        with contextlib.suppress(OSError):
            path.with_name(f"{path.name}.{index}").chmod(0o600)


def shift_backups(path: Path, backups: int) -> None:
    """Move `path`'s rotated files one along (`NAME.1` to `NAME.2` ...), the oldest
    overwritten: `NAME.1` is then free."""
    for index in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{index + 1}"))


def rotate_away(path: Path, backups: int) -> None:
    """Rotate a log file no one writes: it becomes `NAME.1` (or is removed with no
    backups kept), its older files moved along."""
    shift_backups(path, backups)
    if backups > 0:
        os.replace(path, path.with_name(f"{path.name}.1"))
    else:
        path.unlink(missing_ok=True)


class LogFile:
    """A child's log: lines appended, rotated at `max_bytes` with `backups` old files.

    Buffered and flushed at most every FLUSH_EVERY seconds (and when the child
    exits or the log closes): llama-server writes several lines per request,
    and logging's RotatingFileHandler, which seeks and flushes on every line,
    cost serve about 190 us of CPU per request. Lines held back are flushed
    FLUSH_EVERY later by the event loop (when one runs), so a reader of the file
    (the dashboard's Logs page) sees every line within that time. Errors quote
    the in-memory tail, which is always current.
    """

    FLUSH_EVERY = 0.5

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._fh: BinaryIO | None = None
        self._size = 0
        self._flushed = 0.0
        self._later: asyncio.TimerHandle | None = None

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8", "replace")
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab", opener=owner_only)  # noqa: SIM115 (kept open)
            self._size = self._fh.tell()
            restrict_rotations(self.path, self.backups)
        if self._size + len(data) > self.max_bytes and self._size > 0:
            self._rotate()
        assert self._fh is not None
        self._fh.write(data)
        self._size += len(data)
        now = time.monotonic()
        if now - self._flushed >= self.FLUSH_EVERY:
            self._fh.flush()
            self._flushed = now
        elif self._later is None:
            self._flush_later()

    def _flush_later(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: the next write or close flushes
            return
        self._later = loop.call_later(self.FLUSH_EVERY, self._deferred)

    def _deferred(self) -> None:
        self._later = None
        self.flush()

    def _rotate(self) -> None:
        self.close()
        rotate_away(self.path, self.backups)
        self._fh = open(self.path, "ab", opener=owner_only)  # noqa: SIM115 (kept open)
        self._size = 0

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class ChildLog:
    """What a child printed: the rotated log file and its last lines in memory.

    Blazar's own notes about the child ("blazar: starting ...", "blazar: exited
    with code 0") go to the file, flushed at once, but not to the tail, which
    errors quote as the child's own words.
    """

    def __init__(
        self, path: Path | None, max_bytes: int = LOG_BYTES, backups: int = LOG_BACKUPS
    ) -> None:
        """`path` None keeps only the tail in memory (a child of a gateway with no logs
        directory: an in-process test's)."""
        self.path = path
        self._file = LogFile(path, max_bytes, backups) if path is not None else None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    def line(self, text: str) -> None:
        self._tail.append(text)
        if self._file is not None:
            self._file.write(text)

    def note(self, text: str) -> None:
        if self._file is not None:
            self._file.write(f"blazar: {text}")
            self._file.flush()

    def tail(self, n: int = 20) -> list[str]:
        return list(self._tail)[-n:]

    def last_line(self) -> str | None:
        """The last line with something on it: the most specific reason a child gives."""
        return next((line for line in reversed(self._tail) if line.strip()), None)

    def describe(self, reason: str) -> str:
        """`reason`, then the child's last lines and where the rest is."""
        return f"{reason}; last lines of {self.path}:\n" + "\n".join(self.tail())

    def new_child(self) -> None:
        self._tail.clear()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class DirectLog:
    """The log a supervised child writes itself: its stdout and stderr are this file.

    serve copied every line a child printed from a pipe into the file, about nine
    lines and 110 us of serve's CPU per request (docs/performance.md); now the child's
    output goes to the file through the kernel (`fd_for_child`, opened O_APPEND, 0600)
    and serve reads the file only when it needs to: for the port while the child
    starts (`watch_log`), for the last lines when an error quotes them (`tail`), and
    once every ROTATE_EVERY seconds for its size. The file is rotated by renaming
    between children; while one runs (it holds the file open) by copying the file to
    `NAME.1` and truncating it (O_APPEND writes then land at the new end; a line the
    child writes between the copy and the truncation is lost). Blazar's own notes
    ("blazar: starting ...") are appended to the same file and left out of the tail,
    which errors quote as the child's own words. `path` None: an unlinked temporary
    file (a gateway with no logs directory: an in-process test's).
    """

    ROTATE_EVERY = 5.0
    TAIL_BYTES = 64 * 1024

    def __init__(
        self, path: Path | None, max_bytes: int = LOG_BYTES, backups: int = LOG_BACKUPS
    ) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._fd: int | None = None
        self.start = 0  # where the current child's output begins

    def _open(self) -> int:
        if self._fd is None:
            if self.path is None:
                self._fd, name = tempfile.mkstemp(prefix="blazar-child-", suffix=".log")
                os.unlink(name)  # 0600, and gone with its last descriptor
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                os.fchmod(self._fd, 0o600)
                restrict_rotations(self.path, self.backups)
        return self._fd

    def size(self) -> int:
        return os.fstat(self._open()).st_size

    def new_child(self) -> None:
        """Before a spawn: rotate a file over its size (by renaming: no child holds it)
        and mark where the next child's output starts."""
        if self.path is not None and self.size() > self.max_bytes:  # a past serve's too
            self.close()
            rotate_away(self.path, self.backups)
        self.start = self.size()

    def fd_for_child(self) -> int:
        """The descriptor the child's stdout and stderr are (the same open file, O_APPEND)."""
        return self._open()

    def note(self, text: str) -> None:
        os.write(self._open(), f"blazar: {text}\n".encode("utf-8", "replace"))

    def read(self, offset: int) -> bytes:
        """The file's bytes from `offset` to its end."""
        fd = self._open()
        return os.pread(fd, max(0, os.fstat(fd).st_size - offset), offset)

    def rotate_if_big(self) -> bool:
        """While a child writes: copy the file to NAME.1 and truncate it, if it is over its
        size. True if it did."""
        if self.path is None or self._fd is None or self.size() <= self.max_bytes:
            return False
        data = self.read(0)
        shift_backups(self.path, self.backups)
        if self.backups > 0:
            first = self.path.with_name(f"{self.path.name}.1")
            backup = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(backup, data)
            finally:
                os.close(backup)
        os.ftruncate(self._fd, 0)
        self.start = 0
        return True

    def tail(self, n: int = 20) -> list[str]:
        """The last `n` lines the current (or last) child wrote, without Blazar's notes."""
        if self._fd is not None:
            data, begin = self._end(self._fd)
        else:  # closed: read what the last child left, by its path
            try:
                fd = os.open(self.path, os.O_RDONLY) if self.path is not None else -1
            except OSError:
                fd = -1
            if fd < 0:
                return []
            try:
                data, begin = self._end(fd)
            finally:
                os.close(fd)
        if begin > self.start:  # the first line was cut
            data = data.partition(b"\n")[2]
        lines = data.decode("utf-8", "replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [line.rstrip() for line in lines if not line.startswith("blazar: ")][-n:]

    def _end(self, fd: int) -> tuple[bytes, int]:
        size = os.fstat(fd).st_size
        begin = max(min(self.start, size), size - self.TAIL_BYTES)
        return os.pread(fd, size - begin, begin), begin

    def last_line(self) -> str | None:
        """The last line with something on it: the most specific reason a child gives."""
        return next((line for line in reversed(self.tail(TAIL_LINES)) if line.strip()), None)

    def describe(self, reason: str) -> str:
        """`reason`, then the child's last lines and where the rest is."""
        return f"{reason}; last lines of {self.path}:\n" + "\n".join(self.tail())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- spawning and signalling -----------------------------------------------------------------


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:  # loaded here, in the parent: loading a library between fork and exec is unsafe
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGTERM when the thread that forked it dies."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class ChildProcess(Protocol):
    """What an owner needs of its child: an `asyncio.subprocess.Process`, or a launcher
    child forked by a fork server (`blazar.serve.supervisor.forks.Forked`)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


async def spawn(
    argv: Sequence[str], output: int | None = None, stdin: int | None = None
) -> asyncio.subprocess.Process:
    """Start `argv` in its own process group, dying with its parent; output (stdout and
    stderr) on one pipe, or into the file descriptor `output` (a `DirectLog`'s); stdin
    /dev/null, or the file descriptor `stdin` (a fork server's socket).

    Raises OSError when the program cannot be run.
    """
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin,
        stdout=asyncio.subprocess.PIPE if output is None else output,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: a stop reaches every descendant
        # A preexec_fn makes subprocess fork rather than vfork (a few ms more for a big
        # parent), the price of PDEATHSIG for engines Blazar does not write (llama-server).
        preexec_fn=_die_with_parent(),
        limit=OUTPUT_LIMIT,
    )


async def spawn_stdio(
    argv: Sequence[str], env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """Start `argv` as `spawn` does, but talking over its pipes: stdin and stdout carry its
    protocol (an MCP server's JSON-RPC lines), stderr its log. `env` is added to serve's
    environment. Raises OSError when the program cannot be run."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_die_with_parent(),
        limit=OUTPUT_LIMIT * 16,  # one JSON-RPC message is one line
        env={**os.environ, **env} if env else None,
    )


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a child's whole process group; a group already gone is no error."""
    # The child leads its own group (start_new_session), so its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def terminate(proc: ChildProcess, grace: float) -> int | None:
    """Stop a child and wait for it: SIGTERM to its group, `grace` seconds, then SIGKILL.

    Whatever it left in its group is swept with SIGKILL either way (a live group's id
    is never reused, so this reaches nobody else). Returns the exit code.
    """
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5.0)
    signal_group(proc.pid, signal.SIGKILL)
    return proc.returncode


# -- observing -------------------------------------------------------------------------------


async def _bound_port(pid: int, seconds: float = 2.0) -> int | None:
    """`listening_socket(pid)`, waiting a little for a server that logs before it listens."""
    deadline = time.monotonic() + seconds
    while (port := listening_socket(pid)) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return port


async def read_output(
    stream: asyncio.StreamReader,
    log: ChildLog,
    on_port: Callable[[int], None],
    pid: int | None = None,
) -> None:
    """Copy a child's output to `log` until it closes; call `on_port` at the first
    "listening on" line (one that names port 0: the port child `pid` listens on)."""
    port_seen = False
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line over the limit: asyncio drops it
            continue
        if not raw:
            log.flush()
            return
        line = raw.decode("utf-8", "replace").rstrip()
        log.line(line)
        port = None if port_seen else listening_port(line)
        if port == 0:  # it bound a free port and did not say which: ask the kernel
            port = await _bound_port(pid) if pid is not None else None
        if port is not None:
            log.flush()
            port_seen = True
            on_port(port)


async def watch_log(
    proc: ChildProcess,
    log: DirectLog,
    on_port: Callable[[int], None],
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Follow a child's `DirectLog` while the child runs: call `on_port` at the first
    "listening on" line (one that names port 0: the port the child listens on), reading
    the file's new bytes at `log_delay`'s interval until then; after it, look at the
    file's size every ROTATE_EVERY seconds and rotate it when it is over. Ends when the
    child has exited. Serve's only reads of the child's output between errors.
    After KERNEL_AFTER seconds without the line, the kernel is asked which port the
    child listens on as well (a C program's stdout to a file is block-buffered: its
    line may come late); the owner then polls /health until the server is ready."""
    offset, pending, started, looked = log.start, b"", time.monotonic(), -1
    while True:
        exited = proc.returncode is not None
        data = log.read(offset)
        offset += len(data)
        *lines, pending = (pending + data).split(b"\n")
        if exited and pending:
            lines.append(pending)
        waited = time.monotonic() - started
        if not lines and not exited and waited >= KERNEL_AFTER and int(waited * 4) != looked:
            # No line yet: a program whose stdout is a file may hold its lines in a
            # buffer, so its listening socket is asked for too (4 times a second).
            looked = int(waited * 4)
            if (bound := listening_socket(proc.pid)) is not None:
                lines = [f"listening on http://kernel:{bound}".encode()]
        for raw in lines:
            port = listening_port(raw[:OUTPUT_LIMIT].decode("utf-8", "replace"))
            if port == 0:  # it bound a free port and did not say which: ask the kernel
                port = await _bound_port(proc.pid)
            if port is not None:
                on_port(port)
                while proc.returncode is None:
                    log.rotate_if_big()
                    await sleep(log.ROTATE_EVERY)
                return
        if exited:
            return
        if len(pending) > OUTPUT_LIMIT:  # a line over the limit: dropped, as the pipe did
            pending = b""
        await sleep(log_delay(time.monotonic() - started))


async def watch_exit(
    proc: ChildProcess,
    reader: asyncio.Task[None] | None,
    on_exit: Callable[[int], None],
) -> None:
    """Call `on_exit(code)` once the child has exited and its output has been read."""
    waiting = asyncio.ensure_future(proc.wait())
    try:
        # wait() also waits for the pipe to close; poll returncode in case a straggler
        # in the group keeps it open (the owner's SIGKILL sweep closes it).
        while not waiting.done() and proc.returncode is None:
            await asyncio.wait({waiting}, timeout=0.25)
        if reader is not None:  # a child whose output is read from a pipe
            await asyncio.wait({reader}, timeout=0.25)  # at once, unless a straggler holds it
        assert proc.returncode is not None
        on_exit(proc.returncode)
        await asyncio.wait({waiting}, timeout=5.0)
    finally:
        waiting.cancel()


async def probe_health(host: str, port: int, timeout: float = 2.0) -> int | None:
    """GET /health on a fresh connection: the status code, or None if nothing answered.

    A bare request on a stream, not an HTTP client session: a start pays for
    creating a session (about 1.5 ms here), and a probe needs only the status line.
    """
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
            )
            status_line = await reader.readline()
    except (OSError, TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


async def poll_health(
    host: str,
    port: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Return once GET /health answers 200; the caller enforces the deadline. (`clock`
    and `sleep` are injected by a test that plays the poll's time.)"""
    started = clock()
    while await probe_health(host, port) != 200:
        await sleep(health_delay(clock() - started))
