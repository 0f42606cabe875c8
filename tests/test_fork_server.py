"""Fork servers (blazar/serve/supervisor/forks.py; not test_forks.py's engine forks) with
the real engine: the installed launcher's layout (launcher.py with launcher_common.py
beside it, as a wheel install places them) run by the fork server under this Python,
which has xllamacpp, serving the tiny model. What a forked child must do as a spawned
one does: serve the model with the flags it was given, write to its instance's log,
lead its own process group, show its command line in /proc, report its exit code, and
leave nothing behind; and what goes wrong with a fork server (dead, refusing, turned
off) must fall back to a fresh spawn. One served test swaps models through
`blazar serve`, whose children are forked by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from blazar.engines import launchers
from blazar.serve.supervisor.forks import Forked, Forks, forkable
from blazar.serve.supervisor.instance import Instance, InstanceFailed, InstanceSpec, State
from tests.fake_children import gone, run
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.serving import Served
from tests.waiting import until


def installed_launcher(root: Path) -> str:
    """The launcher as a wheel engine has it: `launcher.py`, `launcher_common.py` beside."""
    folder = root / "engine"
    folder.mkdir()
    shutil.copy2(launchers.LLAMA, folder / "launcher.py")
    shutil.copy2(launchers.COMMON, folder / launchers.COMMON.name)
    return str(folder / "launcher.py")


def spec(root: Path, launcher: str, name: str, *args: str) -> InstanceSpec:
    return InstanceSpec(
        key=f"{name}/0",
        model=name,
        replica=0,
        engine_tag="test",
        command=(sys.executable, launcher),
        args=args,
        log_path=root / "logs" / f"{name}-0.log",
        health_timeout=30.0,
    )


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("PPid:")[1].split()[0])


def sockets(pid: int) -> set[str]:
    """The sockets and pipes process `pid` holds open (their inodes)."""
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(("socket:", "pipe:")):
                found.add(target)
    return found


def cmdline(pid: int) -> list[str]:
    """/proc's command line, without the NUL padding a forked child's ends with."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    while args and not args[-1]:
        args.pop()
    return args


async def props(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/props") as resp:
        assert resp.status == 200
        return dict(await resp.json())


async def chat(url: str) -> int:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=body) as resp,
    ):
        await resp.read()
        return resp.status


async def ready_server(forks: Forks) -> Any:
    """The one fork server, once it is ready (it starts start_after the first spawn)."""
    async with asyncio.timeout(20):
        while forks.starting:
            await asyncio.wait(list(forks.starting.values()))
        (server,) = forks.servers.values()
        await server.ready.wait()
    return server


def test_forkable_is_the_wheel_launcher_under_a_python() -> None:
    assert forkable(("/e/venv/bin/python", "/e/launcher.py", "--model", "m.gguf"))
    assert forkable(("/usr/bin/python3.11", "/e/launcher.py"))
    assert not forkable(("/e/llama-server", "--model", "m.gguf"))  # a binary: exec is cheap
    assert not forkable(("/e/venv/bin/python", "/e/whisper_launcher.py"))  # another lane
    assert not forkable(("/e/venv/bin/python", "-c", "launcher.py"))
    assert not forkable(("/e/venv/bin/python",))


def test_a_forked_child_serves_its_model_with_its_flags(tmp_path: Path, tiny_model: Path) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        first = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        args = ("-m", str(tiny_model), "--parallel", "3", "--alias", "second")
        second = Instance(spec(tmp_path, launcher, "b", *args), spawn=forks.spawn)
        try:
            await first.ensure_ready()
            assert not isinstance(first._proc, Forked)  # the first start is spawned fresh
            server = await ready_server(forks)
            url = await second.ensure_ready()
            forked = second._proc
            assert isinstance(forked, Forked)
            assert forked.pid == second.pid != first.pid
            assert parent_of(forked.pid) == server.proc.pid  # the fork server's child
            assert os.getpgid(forked.pid) == forked.pid  # a group of its own
            # the fork server's socket and pipes stay its own (a fork does not exec)
            assert not sockets(server.proc.pid) & sockets(forked.pid)
            # what /proc and `ps` show: the launcher and its flags, as for a spawned child
            assert cmdline(forked.pid) == list(second.spec.argv("127.0.0.1"))
            assert cmdline(server.proc.pid) == [sys.executable, str(launchers.FORK), launcher]
            settings = await props(url)
            assert settings["total_slots"] == 3
            assert settings["model_alias"] == "second"
            assert await chat(url) == 200
            # its output is in its own instance's log, not the first one's
            await until(lambda: any("listening on" in line for line in second.log_tail(50)))
            assert "n_slots = 3" in second.spec.log_path.read_text()
            await second.stop()
            assert second.state is State.STOPPED and forked.returncode == 0
            assert "blazar: exited with code 0" in second.spec.log_path.read_text()
            assert gone(forked.pid)
        finally:
            await asyncio.gather(first.close(), second.close())
            await forks.close()
        assert gone(server.proc.pid)

    run(main())


def test_a_forked_launcher_that_fails_reports_its_code_and_words(
    tmp_path: Path, tiny_model: Path
) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        good = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        bad = Instance(
            spec(tmp_path, launcher, "b", "-m", str(tiny_model), "--no-such-flag"),
            spawn=forks.spawn,
        )
        try:
            await good.ensure_ready()
            await ready_server(forks)
            try:
                await bad.ensure_ready()
            except InstanceFailed as err:
                assert "exited with code 2 before it became ready" in str(err)
                assert "--no-such-flag" in str(err)  # the launcher's own line, from its log
            else:
                raise AssertionError("a bad flag must fail the start")
            assert bad.state is State.FAILED
        finally:
            await asyncio.gather(good.close(), bad.close())
            await forks.close()

    run(main())


def test_a_fork_server_that_died_is_replaced(tmp_path: Path, tiny_model: Path) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        two = Instance(spec(tmp_path, launcher, "b", "-m", str(tiny_model)), spawn=forks.spawn)
        try:
            await one.ensure_ready()
            server = await ready_server(forks)
            await two.ensure_ready()
            forked = two._proc
            assert isinstance(forked, Forked)
            os.kill(server.proc.pid, signal.SIGKILL)  # the OOM killer, say
            # its child gets SIGTERM (PDEATHSIG); its owner sees the exit through the pidfd
            assert await asyncio.wait_for(forked.wait(), 10) == -1
            await until(lambda: two.state is not State.READY)
            await two.stop()
            # the next start is spawned fresh, with a new fork server beside it
            await two.ensure_ready()
            assert not isinstance(two._proc, Forked)
            replacement = await ready_server(forks)
            assert replacement is not server
            await one.stop()
            await one.ensure_ready()
            assert isinstance(one._proc, Forked)
            assert parent_of(one._proc.pid) == replacement.proc.pid
        finally:
            await asyncio.gather(one.close(), two.close())
            await forks.close()

    run(main())


def test_turned_off_children_are_spawned_and_forked_ones_run_on(
    tmp_path: Path, tiny_model: Path
) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        two = Instance(spec(tmp_path, launcher, "b", "-m", str(tiny_model)), spawn=forks.spawn)
        try:
            await one.ensure_ready()
            server = await ready_server(forks)
            url = await two.ensure_ready()
            assert isinstance(two._proc, Forked)
            forks.configure(False)  # serving.fork_server = false on a pass
            assert not forks.servers
            await one.stop()
            await one.ensure_ready()
            assert not isinstance(one._proc, Forked)
            assert not gone(server.proc.pid)  # retired: it waits for its child
            assert await chat(url) == 200  # which still serves
            await two.stop()
            assert two._proc is None and two.state is State.STOPPED
            # its last child gone, it exits
            assert await asyncio.wait_for(server.proc.wait(), 5) == 0
        finally:
            await asyncio.gather(one.close(), two.close())
            await forks.close()

    run(main())


def test_serve_swaps_models_with_forked_children_and_leaves_none(
    tmp_path: Path, blazar_home: Path, models: dict[str, Path]
) -> None:
    # Every request swaps (one model loaded, no min_residency): the first starts of the
    # engine are spawned, its fork server starts half a second after the first; from
    # then on each start is its fork.
    text = '[serving]\nmax_loaded_models = 1\nmin_residency = "0s"\n\n'
    text += ENGINE + model_block("tiny", models["tiny"]) + model_block("other", models["other"])
    body = {"prompt": "a", "max_tokens": 2}
    paths: dict[str, set[str]] = {"tiny": set(), "other": set()}
    parents: list[int] = []
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        for turn in range(200):
            name = ("tiny", "other")[turn % 2]
            answer = served.post("/v1/completions", {"model": name, **body})
            assert answer["model"] == name and answer["choices"][0]["text"] is not None
            [row] = served.ps()
            assert row["model"] == name and row["state"] == "ready"
            flags = cmdline(row["pid"])  # `ps` and /proc name the model it serves
            paths[name].add(flags[flags.index("--model") + 1])
            parent = parent_of(row["pid"])
            if str(launchers.FORK) in " ".join(cmdline(parent)):
                parents.append(parent)  # forked, not spawned
                if len(parents) == 3:
                    break
        assert len(parents) == 3 and len(set(parents)) == 1  # one fork server forks each
        assert len(paths["tiny"]) == len(paths["other"]) == 1  # each its own file, each time
        assert paths["tiny"] != paths["other"]
        traces = served.get("/api/why?limit=3")["traces"]
        assert [t["decision"] for t in traces] == ["spawned"] * 3
        evicted = [t["evicted"] for t in traces]
        assert evicted in ([["tiny"], ["other"], ["tiny"]], [["other"], ["tiny"], ["other"]])
        assert all(t["load_ms"] > 0 for t in traces)
    assert gone(parents[0])  # Served's exit checked that nothing of serve's home runs


def test_the_fork_server_of_an_engine_no_model_uses_is_retired(
    tmp_path: Path, tiny_model: Path
) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        try:
            await one.ensure_ready()
            server = await ready_server(forks)
            forks.keep([one.spec.command, ("/e/llama-server",)])  # still used: kept
            assert forks.servers and not server.dead
            await one.close()
            forks.keep([("/e/venv/bin/python", "/e/launcher.py")])  # an engine update
            assert not forks.servers and server.dead
            assert await asyncio.wait_for(server.proc.wait(), 5) == 0  # no child: it exits
        finally:
            await one.close()
            await forks.close()

    run(main())


def test_a_launcher_replaced_on_disk_is_spawned_fresh(tmp_path: Path, tiny_model: Path) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        try:
            await one.ensure_ready()
            server = await ready_server(forks)
            await one.stop()
            # the engine installed again at the same path: the fork server has the old code
            Path(launcher).write_text(Path(launcher).read_text() + "\n# installed again\n")
            await one.ensure_ready()
            assert not isinstance(one._proc, Forked)
            assert server.dead
            replacement = await ready_server(forks)
            await one.stop()
            await one.ensure_ready()
            assert isinstance(one._proc, Forked)
            assert parent_of(one._proc.pid) == replacement.proc.pid
        finally:
            await one.close()
            await forks.close()

    run(main())


# A launcher whose import starts a thread (as a GPU runtime's might): forking it is unsafe.
THREADED_LAUNCHER = """
import http.server, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
if __name__ == "__main__":
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    print("fake: listening on http://127.0.0.1:%d" % server.server_port, flush=True)
    server.serve_forever()
"""


def test_a_threaded_launcher_is_never_forked(tmp_path: Path) -> None:
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "launcher.py").write_text(THREADED_LAUNCHER)
    launcher = str(folder / "launcher.py")

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a"), spawn=forks.spawn)
        servers = []
        try:
            for _ in range(5):
                await one.ensure_ready()
                assert not isinstance(one._proc, Forked)  # refused: spawned fresh each time
                if forks.servers:
                    servers.append(await ready_server(forks))
                await one.stop()
            # three refusals in a row: no fork server for this launcher any more
            assert len(servers) == 3 and not forks.servers
            assert all(server.dead for server in servers)
        finally:
            await one.close()
            await forks.close()
        assert all(gone(server.proc.pid) for server in servers)

    run(main())


def test_a_forked_child_that_crashes_is_respawned_forked(tmp_path: Path, tiny_model: Path) -> None:
    launcher = installed_launcher(tmp_path)

    async def main() -> None:
        forks = Forks(start_after=0.0)
        one = Instance(spec(tmp_path, launcher, "a", "-m", str(tiny_model)), spawn=forks.spawn)
        two = Instance(
            spec(tmp_path, launcher, "b", "-m", str(tiny_model)), spawn=forks.spawn, backoff=(0,)
        )
        try:
            await one.ensure_ready()
            await ready_server(forks)
            await two.ensure_ready()
            crashed = two._proc
            assert isinstance(crashed, Forked)
            os.kill(crashed.pid, signal.SIGKILL)
            assert await asyncio.wait_for(crashed.wait(), 10) == -signal.SIGKILL  # reported
            async with asyncio.timeout(10):  # respawned at once (no backoff)
                while two.state is not State.READY or two._proc is crashed:
                    await asyncio.sleep(0.01)
            assert isinstance(two._proc, Forked) and two.restarts == 1
            assert "exited with code -9" in two.spec.log_path.read_text()
        finally:
            await asyncio.gather(one.close(), two.close())
            await forks.close()

    run(main())


def test_the_fork_launcher_protocol_refuses_bad_requests_and_forks_on(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The engine-side script alone, over its socket: a bad request is answered with an
    error (and its descriptor closed), the next good one forks, and the exit is reported."""
    launcher = installed_launcher(tmp_path)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.settimeout(20)
    proc = subprocess.Popen(
        [sys.executable, str(launchers.FORK), launcher, "-" * 4096], stdin=theirs
    )
    theirs.close()
    log = tmp_path / "child.log"
    try:

        def request(body: bytes, fds: list[int]) -> dict[str, Any]:
            socket.send_fds(ours, [body], fds)
            return dict(json.loads(ours.recv(1 << 16)))

        assert json.loads(ours.recv(1 << 16)) == {"ready": proc.pid}
        with open(log, "ab") as out:
            for bad in (b"not json", b'{"argv": 5}', b'{"argv": ["-m", 3]}'):
                assert "bad request" in request(bad, [out.fileno()])["error"]
            args = ["-m", str(tiny_model), "--host", "127.0.0.1", "--port", "0"]
            reply = request(json.dumps({"argv": args}).encode(), [out.fileno()])
        pid = int(reply["pid"])
        assert parent_of(pid) == proc.pid
        deadline = time.monotonic() + 20
        while "blazar-launcher: listening on" not in log.read_text():  # it serves
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        os.kill(pid, signal.SIGTERM)
        assert json.loads(ours.recv(1 << 16)) == {"exit": pid, "code": 0}
        ours.shutdown(socket.SHUT_WR)  # retired, with no child left: it exits
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ours.close()
