"""`blazar serve` as a subprocess in a temporary home, for the benchmarks in this folder.

`gateway_overhead.py` and `cold_start.py` import it (they run as scripts, so this
folder is on their path), and run through `run_served`: serve up, measure, report.
`served(prefix, models)` writes a manifest (a free port,
`keep_alive = -1`, the engine version the tests use, then the `[models.*]` tables
`models(root)` returns), starts serve, waits for "Blazar is serving on", and on the
way out stops it by its PID (SIGTERM; serve stops its children) and removes its files.
The engine wheel comes from BLAZAR_WHEEL_CACHE, by default the tests' cache
~/.cache/blazar-tests/wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from blazar.testing.ports import free_port

ENGINE_VERSION = "2026.10.11549"
SETUP_TIMEOUT = 300.0
R = TypeVar("R")


class SetupFailed(Exception):
    """The benchmark could not start what it measures."""


class Serve:
    """`blazar serve` in a subprocess, in a temporary home; stopped by its PID."""

    def __init__(self, root: Path, models: str, serving: str = "") -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "serve.log"
        # In a folder of its own: serve watches the manifest's folder, and a pass on every
        # write to the log or the store would be measured too.
        self.manifest = root / "manifest" / "blazar.toml"
        self.manifest.parent.mkdir()
        self.manifest.write_text(
            f"[serving]\nport = {self.port}\nkeep_alive = -1\n{serving}\n"
            f'[engines.llamacpp]\nversion = "{ENGINE_VERSION}"\n\n{models}'
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, BLAZAR_HOME=str(self.root / "home"))
        cache = Path.home() / ".cache" / "blazar-tests" / "wheels"
        if "BLAZAR_WHEEL_CACHE" not in env and cache.is_dir():
            env["BLAZAR_WHEEL_CACHE"] = str(cache)
        exe = Path(sys.executable).with_name("blazar")
        command = [str(exe)] if exe.exists() else [sys.executable, "-m", "blazar.cli.main"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*command, "serve", str(self.manifest)],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        ready = threading.Event()
        threading.Thread(target=self._read_stdout, args=(ready,), daemon=True).start()
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SetupFailed(f"blazar serve did not start:\n{self.log_tail()}")

    def _read_stdout(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:  # read to the end, so serve never blocks on the pipe
            if b"Blazar is serving on" in line:
                ready.set()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """CPU time serve has used so far (0.0 where /proc cannot tell)."""
        assert self.proc is not None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # serve stops its children
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def served(prefix: str, models: Callable[[Path], str], serving: str = "") -> Iterator[Serve]:
    """A started `Serve` in a fresh temporary folder; `models(root)` gives its models and
    `serving` more lines of its `[serving]` table."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        serve = Serve(root, models(root), serving)
        try:
            serve.start()
            yield serve
        finally:
            serve.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # SystemExit unwinds through `served`, which stops serve


def run_served(
    name: str,
    models: Callable[[Path], str],
    measure: Callable[[Serve], R],
    summarize: Callable[[R], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    *,
    json_out: bool = False,
    errors: tuple[type[BaseException], ...] = (OSError,),
    serving: str = "",
) -> int:
    """A benchmark's `main` around serve: start it (SIGTERM still stops it), `measure`
    through it, then print `render(summarize(results))`, the load average before and
    after, and with `json_out` the summary as JSON. What `measure` raises of `errors`
    is a setup failure, printed with serve's log tail: exit 1. `serving`: more lines
    of the manifest's `[serving]` table (its subtables too)."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    try:
        with served(f"blazar-{name}-", models, serving) as serve:
            print(f"blazar serve is up at {serve.url} ({time.monotonic() - started:.1f} s)")
            try:
                results = measure(serve)
            except errors as exc:
                raise SetupFailed(f"{exc!r}\n{serve.log_tail()}") from None
    except SetupFailed as exc:
        print(f"{name}: setup failed: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results)
    print(render(summary))
    print(
        f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"cpus {os.cpu_count()}; total {time.monotonic() - started:.0f} s"
    )
    if json_out:
        print(json.dumps(summary, indent=2))
    return 0
