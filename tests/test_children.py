"""The child-process primitives (`blazar.host.children`) and the one-job `EngineServer` built on
them, with real child processes: the real engine on a tiny model, and small fake servers
(tests/fake_children.py) for faults. A test that leaves a child or an asyncio task behind
fails (tests/leaks.py, for the whole suite).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from blazar.engines.process import EngineServer, EngineStartError
from blazar.host import children
from blazar.host.children import ChildLog, DirectLog, LogFile, health_delay, listening_port
from tests.fake_children import (
    FAKE_DEAD_PORT,
    LAUNCHER,
    child_processes,
    dead,
    fake_server,
    gone,
    run,
)


def script(tmp_path: Path, text: str) -> tuple[str, ...]:
    return (sys.executable, "-c", text.replace("MARKER", str(tmp_path)))


# -- decisions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "port"),
    [
        ("blazar-launcher: listening on http://127.0.0.1:40123", 40123),
        ("main: server is listening on http://127.0.0.1:8080 - starting the main loop", 8080),
        ("0.01.252.948 I srv          init: listening on http://0.0.0.0:5", 5),
        ("srv  load_model: loading model '/m/listening on.gguf'", None),
        ("listening on http://127.0.0.1:", None),
        ("", None),
        # ik_llama.cpp's server names the port it was asked for: 0 means "ask the kernel".
        (
            'INFO [ main] HTTP server listening | tid="1" n_threads_http="3" port="0" '
            'hostname="127.0.0.1"',
            0,
        ),
        ('INFO [ main] HTTP server listening | port="8080" hostname="127.0.0.1"', 8080),
    ],
)
def test_listening_port_reads_the_announced_port(line: str, port: int | None) -> None:
    assert listening_port(line) == port


@pytest.mark.parametrize(
    ("elapsed", "delay"), [(0.0, 0.01), (0.3, 0.01), (4.99, 0.01), (5.0, 0.05), (600.0, 0.05)]
)
def test_health_is_polled_finely_at_first_then_coarsely(elapsed: float, delay: float) -> None:
    assert health_delay(elapsed) == delay


def test_server_argv_ends_with_host_and_port_zero() -> None:
    argv = children.server_argv(("python", "launcher.py"), ("--model", "m.gguf"), "127.0.0.1")
    assert argv == (
        "python",
        "launcher.py",
        "--model",
        "m.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    )


# -- the log ---------------------------------------------------------------------------------


def test_log_file_rotates_and_keeps_its_backups(tmp_path: Path) -> None:
    log = LogFile(tmp_path / "m-0.log", max_bytes=100, backups=2)
    for i in range(30):
        log.write(f"line {i:02d} " + "x" * 10)  # 19 bytes a line: five lines a file
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["m-0.log", "m-0.log.1", "m-0.log.2"]  # the oldest fell off
    assert (tmp_path / "m-0.log").read_text().splitlines()[-1].startswith("line 29")
    assert (tmp_path / "m-0.log.1").read_text().splitlines()[0].startswith("line 20")
    assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())


def test_child_log_keeps_the_childs_words_in_its_tail(tmp_path: Path) -> None:
    log = ChildLog(tmp_path / "logs" / "c.log")
    log.note("starting x")
    for line in ("one", "two", "  "):
        log.line(line)
    assert log.tail() == ["one", "two", "  "] and log.last_line() == "two"
    assert log.describe("it failed") == f"it failed; last lines of {log.path}:\none\ntwo\n  "
    log.new_child()
    assert log.tail() == [] and log.last_line() is None
    log.close()
    assert (tmp_path / "logs" / "c.log").read_text() == "blazar: starting x\none\ntwo\n  \n"


def test_direct_log_tail_leaves_out_notes_and_earlier_children(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "d.log"
    log = DirectLog(path, max_bytes=10_000)
    log.new_child()
    log.note("starting x")
    os.write(log.fd_for_child(), b"one\ntwo\n  \n")  # what a child writes itself
    assert log.tail() == ["one", "two", ""] and log.last_line() == "two"
    assert log.describe("it failed") == f"it failed; last lines of {path}:\none\ntwo\n"
    log.new_child()
    assert log.tail() == [] and log.last_line() is None
    os.write(log.fd_for_child(), b"three\n")
    log.close()
    assert log.tail() == ["three"]  # read by its path once closed
    assert path.read_text() == "blazar: starting x\none\ntwo\n  \nthree\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_direct_log_rotates_between_children_and_while_one_writes(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    log = DirectLog(path, max_bytes=100, backups=2)
    log.new_child()
    fd = log.fd_for_child()
    os.write(fd, b"a" * 60 + b"\n")
    assert not log.rotate_if_big()
    os.write(fd, b"b" * 60 + b"\n")
    assert log.rotate_if_big()  # copied to .1, truncated: the child's next write lands at 0
    os.write(fd, b"c\n")
    assert path.read_bytes() == b"c\n" and log.tail() == ["c"]
    assert (tmp_path / "d.log.1").read_bytes() == b"a" * 60 + b"\n" + b"b" * 60 + b"\n"
    assert (tmp_path / "d.log.1").stat().st_mode & 0o777 == 0o600
    os.write(fd, b"d" * 120 + b"\n")
    log.new_child()  # no child holds it: renamed
    assert path.read_bytes() == b"" and (tmp_path / "d.log.2").exists()
    assert (tmp_path / "d.log.1").read_bytes() == b"c\n" + b"d" * 120 + b"\n"
    log.close()
    path.write_bytes(b"e" * 200)  # left over by an earlier serve: rotated at the first child
    again = DirectLog(path, max_bytes=100, backups=0)
    again.new_child()
    assert path.read_bytes() == b"" and again.tail() == []
    again.close()


def test_a_child_writes_its_own_log_and_its_port_is_read_from_the_file(tmp_path: Path) -> None:
    async def main() -> None:
        for path in (tmp_path / "f.log", None):  # None: an unlinked temporary file
            log = DirectLog(path)
            log.new_child()
            proc = await children.spawn(script(tmp_path, fake_server()), output=log.fd_for_child())
            assert proc.stdout is None  # nothing for serve to copy
            ports: list[int] = []
            codes: list[int] = []
            watcher = asyncio.create_task(children.watch_log(proc, log, ports.append))
            exits = asyncio.create_task(children.watch_exit(proc, None, codes.append))
            while not ports:
                await asyncio.sleep(0.01)
            assert await children.probe_health("127.0.0.1", ports[0]) == 200
            assert f"fake: listening on http://127.0.0.1:{ports[0]}" in log.tail()
            assert await children.terminate(proc, grace=5) == -signal.SIGTERM
            await exits
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            assert codes == [-signal.SIGTERM] and len(ports) == 1
            log.close()

    run(main())


def test_watch_log_ends_when_the_child_exits_before_naming_a_port(tmp_path: Path) -> None:
    async def main() -> None:
        log = DirectLog(tmp_path / "e.log")
        log.new_child()
        argv = (sys.executable, "-c", "import sys; print('no model here', file=sys.stderr)")
        proc = await children.spawn(argv, output=log.fd_for_child())
        ports: list[int] = []
        await asyncio.wait_for(children.watch_log(proc, log, ports.append), 5)
        assert ports == [] and log.last_line() == "no model here"
        log.close()

    run(main())


# -- spawn, output, exit, stop ---------------------------------------------------------------


def test_spawn_reads_the_port_and_the_exit(tmp_path: Path) -> None:
    async def main() -> None:
        argv = script(tmp_path, fake_server())
        proc = await children.spawn(argv)
        assert os.getpgid(proc.pid) == proc.pid  # it leads a group of its own
        log = ChildLog(tmp_path / "fake.log")
        ports: list[int] = []
        codes: list[int] = []
        announced = asyncio.Event()

        def on_port(port: int) -> None:
            ports.append(port)
            announced.set()

        assert proc.stdout is not None
        reader = asyncio.create_task(children.read_output(proc.stdout, log, on_port))
        watcher = asyncio.create_task(children.watch_exit(proc, reader, codes.append))
        await announced.wait()
        await children.poll_health("127.0.0.1", ports[0])
        assert await children.probe_health("127.0.0.1", ports[0]) == 200
        assert await children.terminate(proc, grace=5) == -signal.SIGTERM
        await asyncio.gather(reader, watcher)
        assert codes == [-signal.SIGTERM] and len(ports) == 1
        assert f"fake: listening on http://127.0.0.1:{ports[0]}" in log.tail()
        log.close()

    run(main())


def test_terminate_kills_a_child_that_ignores_sigterm_and_sweeps_its_group(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        proc = await children.spawn(
            script(tmp_path, fake_server(ignore_term=True, grandchild=True))
        )
        assert proc.stdout is not None
        line = (await proc.stdout.readline()).decode()
        grandchild = int(line.split()[-1])
        started = time.monotonic()
        assert await children.terminate(proc, grace=0.3) == -signal.SIGKILL
        assert 0.3 <= time.monotonic() - started < 3
        assert gone(proc.pid) and await dead(grandchild)

    run(main())


def test_probe_health_says_none_when_nothing_listens() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        assert await children.probe_health("127.0.0.1", port) is None

    run(main())


def test_poll_health_sees_ready_within_one_short_interval() -> None:
    """Regression: the poll backed off to 0.25 s, so a server turning healthy 0.6 s into
    the poll was seen at 0.8 s (the 0.02 s doubling steps), 0.2 s late; a cold start
    through the gateway paid that. The poll's clock and sleep are the test's: the server
    turns healthy 0.6 s into the poll by that clock, and how far past that the poll's
    clock is when it returns is counted, not timed."""

    async def main() -> None:
        healthy, now, flip = False, 0.0, 0.6

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            status = b"200 OK" if healthy else b"503 Service Unavailable"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        async def sleep(delay: float) -> None:
            nonlocal healthy, now
            healthy = healthy or now < flip <= now + delay  # it turns healthy in this sleep
            now += delay
            await asyncio.sleep(0)

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        poll = children.poll_health("127.0.0.1", port, clock=lambda: now, sleep=sleep)
        await asyncio.wait_for(poll, 30)
        assert flip <= now < flip + 0.0101  # seen at the end of the sleep it turned healthy in
        server.close()
        await server.wait_closed()

    run(main())


def test_a_child_dies_with_the_process_that_spawned_it(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a Blazar killed with SIGKILL cannot stop its children, the kernel
    does. A parent process spawns a child through `children.spawn`, prints its pid and is
    killed; the child must get SIGTERM."""
    parent_code = (
        "# MARKER\nimport asyncio, time\nfrom blazar.host import children\n"
        "async def main():\n"
        f"    proc = await children.spawn({list(script(tmp_path, fake_server()))!r})\n"
        "    print(proc.pid, flush=True)\n"
        "    time.sleep(60)\n"
        "asyncio.run(main())\n"
    ).replace("MARKER", str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not gone(child)
    parent.kill()
    parent.wait()
    assert run(dead(child))


# -- EngineServer ----------------------------------------------------------------------------


def complete(url: str) -> str:
    body = json.dumps({"prompt": "the cat", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(json.load(resp)["choices"][0]["text"])


def test_engine_server_runs_the_real_engine(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        log_path = tmp_path / "logs" / "engine.log"
        server = EngineServer((sys.executable, LAUNCHER), ("--model", str(tiny_model)), log_path)
        async with server:
            assert server.url == f"http://127.0.0.1:{server.port}"
            assert (await asyncio.to_thread(complete, server.url)).strip()
            pid = server.pid
        assert pid is not None and gone(pid) and server.pid is None
        text = log_path.read_text()
        assert "blazar: starting " in text and "--port 0" in text
        assert "blazar: exited with code 0" in text

    run(main())


def test_engine_server_fails_fast_on_an_early_exit(tmp_path: Path) -> None:
    async def main() -> None:
        code = "print('fake: cannot load the model', flush=True); raise SystemExit(3)"
        server = EngineServer(script(tmp_path, code), (), tmp_path / "e.log", start_timeout=60)
        started = time.monotonic()
        with pytest.raises(EngineStartError) as failure:
            await server.start()
        assert time.monotonic() - started < 5
        message = str(failure.value)
        assert "exited with code 3 before it became healthy" in message
        assert message.endswith("fake: cannot load the model")
        assert server.pid is None

    run(main())


def test_engine_server_that_never_turns_healthy_is_killed_at_the_deadline(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        server = EngineServer(
            script(tmp_path, FAKE_DEAD_PORT), (), tmp_path / "e.log", start_timeout=0.5
        )
        with pytest.raises(EngineStartError, match=r"did not become healthy within 0.5 s"):
            await server.start()
        assert child_processes(str(tmp_path)) == []

    run(main())


# A server that binds a free port under `--port 0` and logs `port="0"`, as the ik fork's does.
SILENT_PORT = """
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)  # MARKER
print('INFO [ main] HTTP server listening | port="0" hostname="127.0.0.1"', flush=True)
server.serve_forever()
"""


def test_a_server_that_does_not_name_its_port_is_found_through_the_kernel(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        server = EngineServer(script(tmp_path, SILENT_PORT), (), tmp_path / "e.log")
        url = await server.start()
        assert server.pid is not None and url.rsplit(":", 1)[1] != "0"
        assert children.listening_socket(server.pid) == int(url.rsplit(":", 1)[1])
        assert await children.probe_health("127.0.0.1", int(url.rsplit(":", 1)[1])) == 200
        await server.stop()

    run(main())


def test_engine_server_names_a_program_it_cannot_run(tmp_path: Path) -> None:
    async def main() -> None:
        server = EngineServer((str(tmp_path / "no-such-server"),), (), tmp_path / "e.log")
        with pytest.raises(EngineStartError, match=r"could not run .*no-such-server"):
            await server.start()
        assert await server.stop() is None

    run(main())


BUFFERED_LINE = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
server = http.server.HTTPServer(("127.0.0.1", 0), H)
out = open(1, "w", buffering=65536, closefd=False)  # block-buffered, as C's stdout to a file
out.write("held: listening on http://127.0.0.1:%d\\n" % server.server_port)  # not flushed
server.serve_forever()
"""


def test_a_line_held_in_the_childs_buffer_is_found_through_the_kernel(tmp_path: Path) -> None:
    """A child whose stdout is a file buffers its lines: the port comes from the kernel."""

    async def main() -> None:
        log = DirectLog(tmp_path / "b.log")
        log.new_child()
        proc = await children.spawn(script(tmp_path, BUFFERED_LINE), output=log.fd_for_child())
        ports: list[int] = []
        watcher = asyncio.create_task(children.watch_log(proc, log, ports.append))
        while not ports:
            await asyncio.sleep(0.05)
        assert log.tail() == []  # the line is still in the child's buffer
        assert await children.probe_health("127.0.0.1", ports[0]) == 200
        await children.terminate(proc, grace=5)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        log.close()

    run(main())
