"""A fork server for a launcher: its imports done once, then a forked child per model start.

    python fork_launcher.py LAUNCHER.py ROOM     (stdin: a Unix SOCK_SEQPACKET socket to serve)

`blazar serve` (`blazar.serve.supervisor.forks`) runs this file from Blazar's own tree under
an engine's Python, beside the engine's installed launcher (`launcher.py` of a wheel
engine). It runs the launcher's module once under another name than `__main__`, so that
everything it imports (`xllamacpp`, `launcher_common`, the standard library's modules)
is loaded, then waits. Each model start is then a `fork()` of this process and the
launcher's module run again as `__main__` in the child, from the code compiled here:
the child skips the interpreter's start and the imports (about 70 ms of a swap's 110 on
two cores, docs/performance.md) and runs exactly the installed launcher with its flags.

Messages, one JSON object per datagram:

- to serve, once the launcher is imported: `{"ready": PID}`;
- from serve: `{"argv": [FLAGS...]}` with one file descriptor (SCM_RIGHTS), the child's
  stdout and stderr (its instance's log);
- to serve: `{"pid": N}` (the child runs) or `{"error": "..."}` (none was forked: serve
  starts a fresh process instead);
- to serve, when a child exits (this process reaps it): `{"exit": N, "code": C}`, C as
  asyncio reports it (negative: the signal that ended it).

Each child leads a session of its own (serve signals its group, as for a spawned child)
and gets SIGTERM if this process dies (PR_SET_PDEATHSIG). Serve retires a fork server by
shutting its side of the socket: it forks no more and exits once its last child has
exited (still reporting the exits). SIGTERM (serve stops it, or serve died: its
PR_SET_PDEATHSIG) stops its children too, then it exits. A fork is refused while this process
runs more than one thread (the launcher's imports started one): forking a threaded
process is unsafe; and once the launcher's file changed (an engine installed again at
the same path): serve then spawns the new one fresh. Standard library only: it runs without Blazar.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import traceback
import types
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1
MESSAGE_BYTES = 1 << 20  # a command line with a chat template inline can be long
PRELOAD_NAME = "blazar_fork_launcher"


def _prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _threads() -> int:
    """Threads this process runs (Linux's /proc; 1 where it cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def set_cmdline(args: list[str]) -> bool:
    """Make this process's command line (`/proc/self/cmdline`, what `ps` shows) `args`,
    as setproctitle does: written over the memory of the argv the kernel was given
    (its bounds are fields 48 and 49 of /proc/self/stat), NUL-padded to its end, cut
    if longer. A forked child shows the launcher and its flags there, as a spawned one
    does, not the fork server's command. False where Linux's /proc does not allow it."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        data = "\0".join(args).encode("utf-8", "surrogateescape") + b"\0"
        if len(data) > end - start:
            data = data[: end - start - 1] + b"\0"
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data.ljust(end - start, b"\0"))
    except (OSError, ValueError, IndexError):
        return False
    return True


def _identity(path: str) -> tuple[int, ...]:
    """What tells a file replaced (an engine installed again at the same path)."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _module(name: str, path: str) -> types.ModuleType:
    """A fresh module for the launcher's code, as `runpy.run_path` makes one."""
    module = types.ModuleType(name)
    module.__file__ = path
    module.__dict__.update(__cached__=None, __loader__=None, __package__="", __spec__=None)
    sys.modules[name] = module
    return module


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(
    code: Any, launcher: str, argv: list[str], output: int, parent: int, close: list[int]
) -> NoReturn:
    """In the forked child: become the launcher's process and run it; never returns.
    `close`: the fork server's own descriptors (a fork does not exec, so close-on-exec
    does not close them: the socket to serve must not outlive the fork server here)."""
    status = 1
    try:
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()  # a group of its own: serve's stop reaches every descendant
        prctl = _prctl()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the fork server died before prctl took effect
            os._exit(1)
        signal.set_wakeup_fd(-1)
        # The fork server's handlers are not the child's: its SIGTERM handler stops the
        # fork server's children (this one's siblings). The launcher sets its own.
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the socket to serve is the fork server's, not this child's
        os.close(null)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        sys.argv = [launcher, *argv]
        set_cmdline([sys.executable, launcher, *argv])
        module = _module("__main__", launcher)
        try:
            exec(code, module.__dict__)
            status = 0
        except SystemExit as exc:
            status = _exit_code(exc)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


class ForkServer:
    def __init__(self, launcher: str, sock: socket.socket) -> None:
        self.launcher, self.sock = launcher, sock
        with open(launcher, "rb") as source:
            self.code = compile(source.read(), launcher, "exec")
        self.children: set[int] = set()
        self.wake: tuple[int, ...] = ()  # the signal wakeup pipe, once serving
        self.source = _identity(launcher)  # a launcher replaced on disk is not forked

    def preload(self) -> None:
        """Run the launcher's module once (not as `__main__`: its `main` does not run)."""
        saved = sys.argv
        sys.argv = [self.launcher]
        try:
            exec(self.code, _module(PRELOAD_NAME, self.launcher).__dict__)
        finally:
            sys.argv = saved

    def send(self, message: dict[str, Any]) -> None:
        self.sock.send(json.dumps(message).encode())

    def fork(self, data: bytes, fds: list[int]) -> None:
        try:
            argv = json.loads(data)["argv"]
            if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
                raise ValueError("argv must be a list of strings")
            if len(fds) != 1:
                raise ValueError(f"expected one file descriptor, got {len(fds)}")
        except (ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            self.send({"error": f"bad request: {exc}"})
            return
        output = fds[0]
        try:
            if (threads := _threads()) > 1:
                self.send({"error": f"the launcher's imports started {threads - 1} thread(s)"})
                return
            if _identity(self.launcher) != self.source:
                self.send({"error": f"{self.launcher} changed since it was imported"})
                return
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # nothing buffered here is written twice
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                own = [self.sock.fileno(), *self.wake]
                _child(self.code, self.launcher, argv, output, parent, own)
            self.children.add(pid)
            self.send({"pid": pid})
        except OSError as exc:
            self.send({"error": f"fork failed: {exc}"})
        finally:
            os.close(output)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def stop(self, signum: int, frame: object) -> NoReturn:
        """SIGTERM (serve died, or stops this process): the children are stopped too."""
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
        os._exit(0)

    def serve(self) -> None:
        """Fork on each request until serve shuts its side of the socket; then go on
        reaping (and reporting) until the last child has exited."""
        wake_read, wake_write = os.pipe()
        self.wake = (wake_read, wake_write)
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, self.stop)
        self.send({"ready": os.getpid()})
        forking = True
        while forking or self.children:
            watched: list[Any] = [self.sock, wake_read] if forking else [wake_read]
            readable, _, _ = select.select(watched, [], [])
            if wake_read in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 512)
                self.reap()
            if self.sock in readable:
                data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_BYTES, 4)
                if data:
                    self.fork(data, fds)
                else:  # retired: no more forks; the children it has keep running
                    forking = False


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(
            "usage: fork_launcher.py LAUNCHER.py [ROOM]  (stdin: serve's socket)", file=sys.stderr
        )
        return 2
    # ROOM: any text, as long as the longest command line a child shows (`set_cmdline`)
    set_cmdline([sys.executable, __file__, argv[0]])
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    server = ForkServer(os.path.abspath(argv[0]), sock)
    server.preload()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # serve went away
        server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
