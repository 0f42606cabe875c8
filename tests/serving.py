"""Run `blazar serve` as a real child process for tests, and check it leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from blazar.testing.ports import free_port


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text in cmdline and "State:\tZ" not in status:
            found.append(int(entry.name))
    return found


class Served:
    """`blazar serve MANIFEST --port P` in a child process; a context manager."""

    def __init__(
        self,
        manifest: Path,
        home: Path,
        *,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """`env` is added to this process's environment for serve (BLAZAR_HOME for a
        second serve beside the first, a remote's key)."""
        self.manifest = manifest
        self.home = home
        self.env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def __enter__(self) -> Served:
        exe = Path(sys.executable).with_name("blazar")
        self.proc = subprocess.Popen(
            [str(exe), "serve", str(self.manifest), "--port", str(self.port), *self.extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **self.env},
        )
        # A thread drains the output for the whole run (a full pipe would block serve).
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(90) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("blazar serve did not start:\n" + self.log)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "Blazar is serving on" in line:
                self._started.set()
        self._started.set()  # EOF: serve ended (the caller checks why)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        return self.proc.returncode

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        code = self.stop()
        leftovers = processes_mentioning(str(self.home))
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        if kind is None:
            assert code == 0, "".join(self.output)
            assert leftovers == [], f"children left running: {leftovers}"

    @property
    def log(self) -> str:
        return "".join(self.output)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.load(resp)

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.load(resp)

    def ps(self) -> list[dict[str, Any]]:
        return list(self.get("/api/blazar/ps")["instances"])


def engine_metric(port: int, name: str) -> float:
    """One counter from a child's own `/metrics` (llama-server's `llamacpp:` prefix)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"llamacpp:{name} "):
                return float(line.split()[-1])
    raise AssertionError(f"the child on port {port} reports no llamacpp:{name}")


def tokens_predicted(port: int) -> float:
    """Tokens a child has generated so far, cancelled requests included (counted on release)."""
    return engine_metric(port, "tokens_predicted_total")


def processing(port: int) -> bool:
    """Whether any of a child's slots is working on a request."""
    return any(slot["is_processing"] for slot in _slots(port))


def tokens_in_progress(port: int) -> int:
    """Tokens generated so far by the requests a child is working on (live, from `/slots`)."""
    return sum(
        token["n_decoded"]
        for slot in _slots(port)
        if slot["is_processing"]
        for token in slot["next_token"]
    )


def _slots(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=5) as resp:
        return list(json.load(resp))


def assert_generation_cancelled(port: int, at_disconnect: float, max_tokens: int) -> None:
    """After a client left mid-stream: the child stopped far short of `max_tokens`.

    `at_disconnect` is `tokens_predicted` plus `tokens_in_progress`, read just before the
    client left. This waits for the child to go idle (as long as the whole generation
    could take, so a child that was never told gets to finish) and then counts what it
    generated after that moment. A count, not a deadline: a fast machine finishes an
    uncancelled request within any deadline short enough to be useful. The tiny models
    never choose their end-of-sequence token (its logit is biased far down), so an
    uncancelled generation runs to `max_tokens`.
    """
    deadline = time.monotonic() + 120
    while processing(port):
        assert time.monotonic() < deadline, "the child is still generating for a gone client"
        time.sleep(0.05)
    after = tokens_predicted(port) - at_disconnect
    assert after < max_tokens / 10, (
        f"the child generated {after:.0f} more tokens (max_tokens {max_tokens}) "
        "after the client had gone"
    )
