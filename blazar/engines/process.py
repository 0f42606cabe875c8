"""Run one engine server as a child process: start, wait for health, stop.

Used by `blazar bench` and the update gate (and the base of the supervisor):
the child gets its own process group and a log file; start polls `/health` to
a deadline and fails fast, with the log's last lines, if the child exits
early; stop sends SIGTERM to the group, waits a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from blazar.errors import BlazarError


class EngineStartError(BlazarError):
    """The engine's server exited or never became healthy."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class EngineProcess:
    """One child server. Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        command: Sequence[str],
        args: Sequence[str],
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.argv = [*command, *args, "--host", host, "--port", str(self.port)]
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> EngineProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches every child
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                raise EngineStartError(
                    f"engine exited with code {code} while starting "
                    f"({' '.join(self.argv)}); last lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            if self._healthy():
                return self
            time.sleep(0.02)
        self.stop()
        raise EngineStartError(
            f"engine did not become healthy within {self.start_timeout:.0f} s; "
            f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the process group, wait `grace` seconds, then SIGKILL it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
