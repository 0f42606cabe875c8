"""What every standalone launcher shares (`blazar/engines/launchers/launcher_common.py`).

The real launchers need their engine package (faster-whisper, piper-tts, mistral.rs,
xllamacpp), which lives only in an engine's own virtual environment; their own tests
(test_launcher.py, test_audio_engines.py, test_mistralrs.py) run them there. Here a
launcher of a few lines (`TOY`: the standard library and `launcher_common` only) is placed
the way an engine's is (`wheel.place_launcher`, into a fresh virtual environment without
Blazar, so the sibling import is what makes it run), and the shared skeleton is checked
through it as a real child process: one-line errors with exit codes 2 and 1, the
listening line only once loaded, /health, the error envelope, and SIGTERM or SIGINT
ending it with exit code 0 after the engine's `close`. The HTTP side is also driven in
process, with Hypothesis over hostile paths and Content-Length values.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import SplitResult, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.engines import launchers, wheel
from blazar.engines.launchers.launcher_common import Handler, Route

TOY = '''"""A launcher of a few lines on launcher_common, as the real ones are built."""

import sys
import time

from launcher_common import Engine, Handler, flags, serve_http


class Toy(Engine):
    def __init__(self, args):
        super().__init__(args)
        print("loading", flush=True)
        time.sleep(args.load_seconds)
        if args.model == "broken":
            raise RuntimeError("not a model this engine reads")
        self.marker = args.marker

    def close(self):
        if self.marker:
            with open(self.marker, "w") as f:
                f.write("closed")


class ToyHandler(Handler):
    def echo(self, url, body):
        self.send_json(200, {"query": url.query, "body": body.decode()})

    def lines(self, url, body):
        self.start_chunked("application/x-ndjson")
        for n in range(3):
            self.send_chunk(b"%d\\n" % n)
        self.end_chunked()

    POST = {"/echo": echo, "/lines": lines}


def parser():
    parser = flags(__doc__, "M", "P")
    parser.add_argument("--marker", default=None)
    parser.add_argument("--load-seconds", type=float, default=0)
    return parser


sys.exit(serve_http("toy_launcher", sys.argv[1:], parser(), lambda: "toy 1.0", Toy, ToyHandler))
'''
LISTENING = "toy_launcher: listening on "


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(the engine's Python, the placed launcher): a venv without Blazar, as an engine's."""
    tmp = tmp_path_factory.mktemp("engine")
    source = tmp / "toy_source.py"
    source.write_text(TOY)
    wheel.make_venv(tmp)
    printed = wheel.place_launcher(source, tmp, "toy_launcher.py", "toy", timeout=60)
    assert printed == "toy 1.0"  # --version ran there, launcher_common.py beside it
    assert (tmp / "launcher_common.py").read_bytes() == launchers.COMMON.read_bytes()
    return str(tmp / "venv" / "bin" / "python"), str(tmp / "toy_launcher.py")


def run_toy(placed: tuple[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*placed, *args], capture_output=True, text=True, timeout=60)


def test_the_placed_launcher_runs_without_blazar(placed: tuple[str, str]) -> None:
    python, _ = placed
    # -I: the environment itself (no PYTHONPATH, no current folder), as an engine's venv is.
    probe = subprocess.run([python, "-I", "-c", "import blazar"], capture_output=True, timeout=60)
    assert probe.returncode == 1  # so the sibling import is what the launcher runs on


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        ((), 2, "toy_launcher: --model is required"),
        (("--model", "m", "--nope"), 2, "toy_launcher: unrecognized arguments: --nope"),
        (("--model", "m", "--port", "x"), 2, "toy_launcher: argument --port: invalid int value"),
        (("--model", "m", "--port"), 2, "toy_launcher: argument --port: expected one argument"),
        (("--model", "broken"), 1, "toy_launcher: cannot load broken: not a model this engine"),
    ],
)
def test_a_launcher_that_cannot_start_says_why_in_one_line(
    placed: tuple[str, str], args: tuple[str, ...], code: int, line: str
) -> None:
    done = run_toy(placed, *args)
    assert done.returncode == code
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(line), done.stderr
    assert "listening on" not in done.stdout


def test_a_port_taken_is_a_load_error_in_one_line(placed: tuple[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_toy(placed, "--model", "m", "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.startswith(f"toy_launcher: cannot listen on 127.0.0.1:{port}: ")
    assert len(done.stderr.splitlines()) == 1


class Child:
    """A placed toy launcher child that printed its listening line; stopped by PID."""

    def __init__(self, proc: subprocess.Popen[str], url: str, stdout: list[str]) -> None:
        self.proc, self.url, self.stdout = proc, url, stdout

    def stop(self, signum: int) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@pytest.fixture
def start(placed: tuple[str, str]) -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def launch(*args: str) -> Child:
        proc = subprocess.Popen(
            [*placed, "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        stdout: list[str] = []
        child = Child(proc, "", stdout)
        started.append(child)
        assert proc.stdout is not None
        # It prints nothing after the listening line, so the pipe needs no reader after it.
        while (line := proc.stdout.readline()) and not line.startswith(LISTENING):
            stdout.append(line)
        assert line, "the toy launcher exited before it listened"
        stdout.append(line)
        child.url = line.removeprefix(LISTENING).strip()
        return child

    yield launch
    for child in started:
        child.stop(signal.SIGKILL)


def request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any, str]:
    """(status, the body as JSON or text, Content-Type)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read().decode()
        kind = resp.getheader("Content-Type") or ""
        return resp.status, json.loads(data) if kind == "application/json" else data, kind
    finally:
        conn.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_launcher_serves_once_loaded_and_a_signal_ends_it_cleanly(
    start: Callable[..., Child], tmp_path: Path, signum: int
) -> None:
    marker = tmp_path / "closed"
    toy = start("--model", "m", "--marker", str(marker), "--load-seconds", "0.2")
    # The listening line comes only once the engine is loaded.
    assert toy.stdout[0] == "loading\n"
    assert re.fullmatch(r"toy 1\.0: m loaded in \d+\.\d\d s\n", toy.stdout[1])
    assert toy.stdout[2].startswith(LISTENING)
    assert request(toy.url, "GET", "/health")[:2] == (200, {"status": "ok"})
    assert request(toy.url, "POST", "/echo?x=1", b"hello")[:2] == (
        200,
        {"query": "x=1", "body": "hello"},
    )
    assert request(toy.url, "POST", "/lines")[1:] == ("0\n1\n2\n", "application/x-ndjson")
    status, error, _ = request(toy.url, "GET", "/v1/nothing?q")
    assert status == 404
    assert error == {
        "error": {
            "message": "no such endpoint: /v1/nothing",
            "type": "invalid_request_error",
            "code": None,
        }
    }
    assert request(toy.url, "POST", "/health")[0] == 404  # /health is GET only
    assert toy.stop(signum) == 0
    assert marker.read_text() == "closed"  # the engine's close ran as the signal ended it


def test_a_signal_while_it_loads_ends_it_at_once(placed: tuple[str, str]) -> None:
    proc = subprocess.Popen(
        [*placed, "--model", "m", "--load-seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "loading\n"
        os.kill(proc.pid, signal.SIGINT)
        # The default action, not a KeyboardInterrupt traceback: no handler until it serves.
        assert proc.wait(timeout=10) == -signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# --- the HTTP side in process, against hostile requests ---------------------------------


class Routes(Handler):
    def echo(self, url: SplitResult, body: bytes) -> None:
        self.send_json(200, {"path": url.path, "bytes": len(body)})

    GET: ClassVar[dict[str, Route]] = {"/v1/echo": echo}
    POST: ClassVar[dict[str, Route]] = {"/v1/echo": echo}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Routes)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# A request target as a client may send it: printable ASCII but space, from "/".
PATHS = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(
    lambda rest: "/" + rest
)


@settings(max_examples=150, deadline=None)
@given(method=st.sampled_from(["GET", "POST"]), target=PATHS, body=st.binary(max_size=64))
def test_every_path_gets_a_json_answer_and_what_is_not_served_is_named(
    served: tuple[str, int], method: str, target: str, body: bytes
) -> None:
    conn = http.client.HTTPConnection(*served, timeout=10)
    try:
        conn.request(method, target, body=body if method == "POST" else None)
        resp = conn.getresponse()
        answer = json.loads(resp.read())
    finally:
        conn.close()
    # http.server reads a target that starts "//" as "/..." (not as a host: CVE-2021-28861).
    path = urlsplit("/" + target.lstrip("/")).path
    if method == "GET" and path == "/health":
        assert (resp.status, answer) == (200, {"status": "ok"})
    elif path == "/v1/echo":
        assert (resp.status, answer) == (200, {"path": path, "bytes": len(body)})
    else:
        assert resp.status == 404
        assert answer["error"]["message"] == f"no such endpoint: {path}"


# Content-Length values that do not say where a body ends (a negative one would read to
# the end of the stream, holding the connection's thread until the client goes).
LENGTHS = st.one_of(
    st.integers(max_value=-1).map(str),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
    st.sampled_from(["1.5", "0x10", "+3", "²", "¹²", "1e3", "-0"]),
).filter(lambda v: not (v.isascii() and v.isdigit()))


@settings(max_examples=100, deadline=None)
@given(length=LENGTHS)
def test_a_content_length_that_is_not_a_byte_count_is_a_400_and_the_connection_ends(
    served: tuple[str, int], length: str
) -> None:
    with socket.create_connection(served, timeout=10) as sock:
        head = f"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
        sock.sendall(head.encode("latin-1") + b"body")
        data = b""
        while chunk := sock.recv(65536):  # the server closes: recv returns b"" at the end
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request"
    message = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["message"]
    assert message.startswith("Content-Length must be a number of bytes")
