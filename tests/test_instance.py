"""The instance supervisor with real child processes: the real engine (the launcher on
xllamacpp serving a tiny model) for the normal paths, and small fake servers (python -c)
only for faults the engine will not produce on demand: a hang, a child that ignores SIGTERM.

pytest-asyncio is not installed: each test runs its coroutine with `run()`, which bounds
its time. A test that leaves a child process or an asyncio task behind fails (tests/leaks.py,
for the whole suite). The fakes are in tests/fake_children.py, shared with
tests/test_children.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from blazar.serve.supervisor.instance import Instance, InstanceFailed, InstanceSpec, State, stop_all
from tests.fake_children import (
    FAKE_DEAD_PORT,
    FAKE_SILENT,
    LAUNCHER,
    child_processes,
    dead,
    fake_server,
    gone,
    run,
)
from tests.waiting import until


def state(inst: Instance) -> State:
    """The state, read fresh (an attribute read would be narrowed by mypy across awaits)."""
    return inst.state


def engine_spec(tmp_path: Path, model: Path, **kw: Any) -> InstanceSpec:
    return InstanceSpec(
        key="tiny/0",
        model="tiny",
        replica=0,
        engine_tag="test",
        command=(sys.executable, LAUNCHER),
        args=("--model", str(model), "--ctx-size", "512"),
        log_path=tmp_path / "logs" / "tiny-0.log",
        **kw,
    )


def fake_spec(tmp_path: Path, script: str, **kw: Any) -> InstanceSpec:
    script = script.replace("MARKER", str(tmp_path))
    kw.setdefault("log_path", tmp_path / "logs" / "fake-0.log")
    command = (sys.executable, "-c", script)
    return InstanceSpec(
        key="fake/0", model="fake", replica=0, engine_tag="test", command=command, args=(), **kw
    )


class Events:
    """Records on_event calls; `wait(name)` awaits the next one of that name."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.pids: list[int | None] = []
        self._signals: dict[str, asyncio.Event] = {}

    def __call__(self, instance: Instance, name: str) -> None:
        self.seen.append(name)
        self.pids.append(instance.pid)
        self._signal(name).set()

    def _signal(self, name: str) -> asyncio.Event:
        return self._signals.setdefault(name, asyncio.Event())

    async def wait(self, name: str, timeout: float = 4.0) -> None:
        await asyncio.wait_for(self._signal(name).wait(), timeout)
        self._signal(name).clear()


async def get_health(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as resp:
        return resp.status


def test_start_serves_health_and_completions(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        inst = Instance(engine_spec(tmp_path, tiny_model))
        url = await inst.ensure_ready()
        assert state(inst) is State.READY and inst.ready_event.is_set()
        assert url == f"http://127.0.0.1:{inst.port}" == inst.url
        assert inst.pid and inst.started_at and inst.restarts == 0
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/health") as resp:
                assert resp.status == 200
            body = {"prompt": "the cat", "max_tokens": 4, "temperature": 0}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                answer = await resp.json()
        assert answer["choices"][0]["text"].strip()
        assert await inst.ensure_ready() == url  # READY: answered at once, same child
        await inst.close()

    run(main())


def test_log_file_and_tail(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        inst = Instance(engine_spec(tmp_path, tiny_model))
        await inst.ensure_ready()
        port = inst.port
        await inst.close()
        text = inst.spec.log_path.read_text()
        # The launcher prints two listening lines; a stop can land between them.
        assert f"listening on http://127.0.0.1:{port}" in text
        assert "blazar: starting " in text and "blazar: exited with code 0" in text
        assert any("listening on" in line for line in inst.log_tail(50))

    run(main())


def test_concurrent_ensure_ready_spawns_one_process(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(engine_spec(tmp_path, tiny_model), on_event=events)
        urls = await asyncio.gather(*(inst.ensure_ready() for _ in range(20)))
        assert len(set(urls)) == 1
        assert events.seen == ["starting", "ready"]
        assert child_processes(str(tmp_path)) == [inst.pid]
        await inst.close()

    run(main())


def test_stop_kills_the_process_group(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(engine_spec(tmp_path, tiny_model), on_event=events)
        await inst.ensure_ready()
        pid = inst.pid
        assert pid is not None
        await inst.stop()
        assert state(inst) is State.STOPPED and inst.pid is None and inst.url is None
        assert gone(pid)
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
        await inst.stop()  # idempotent
        assert events.seen == ["starting", "ready", "stopped"]
        await inst.ensure_ready()  # stopped is not closed: it starts a fresh child
        assert inst.pid != pid and inst.restarts == 0
        await inst.close()
        with pytest.raises(InstanceFailed, match="closed"):
            await inst.ensure_ready()
        await inst.close()  # idempotent

    run(main())


def test_early_exit_fails_fast_with_the_log(tmp_path: Path) -> None:
    async def main() -> None:
        spec = engine_spec(tmp_path, tmp_path / "missing.gguf", health_timeout=60)
        inst = Instance(spec)
        started = time.monotonic()
        with pytest.raises(InstanceFailed) as failure:
            await inst.ensure_ready()
        assert time.monotonic() - started < 5
        message = str(failure.value)
        assert "exited with code 1" in message
        assert f"launcher: model not found: {tmp_path / 'missing.gguf'}" in message
        assert state(inst) is State.FAILED and inst.pid is None
        assert inst.last_error and "model not found" in inst.last_error
        await inst.close()

    run(main())


@pytest.mark.parametrize("script", [FAKE_DEAD_PORT, FAKE_SILENT], ids=["dead-port", "silent"])
def test_never_healthy_hits_the_deadline_and_is_killed(tmp_path: Path, script: str) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(fake_spec(tmp_path, script, health_timeout=1.0), on_event=events)
        started = time.monotonic()
        with pytest.raises(InstanceFailed, match=r"did not become healthy within 1 s"):
            await inst.ensure_ready()
        assert 1.0 <= time.monotonic() - started < 4
        assert events.seen == ["starting", "failed"] and state(inst) is State.FAILED
        pid = events.pids[0]
        assert pid is not None and gone(pid)
        await inst.close()

    run(main())


def test_crashed_child_is_respawned(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(engine_spec(tmp_path, tiny_model), on_event=events, backoff=(0.2,))
        await inst.ensure_ready()
        old_pid = inst.pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        await events.wait("exited")
        assert state(inst) is State.BACKOFF and inst.last_error == "exited with code -9 while ready"
        url = await inst.ensure_ready()  # waits through the backoff for the respawn
        assert state(inst) is State.READY and inst.restarts == 1
        assert inst.pid not in (None, old_pid) and gone(old_pid)
        assert url == inst.url
        assert await get_health(url) == 200
        assert events.seen == ["starting", "ready", "exited", "starting", "ready"]
        await inst.close()

    run(main())


def test_stop_during_backoff_prevents_the_respawn(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(engine_spec(tmp_path, tiny_model), on_event=events, backoff=(0.5,))
        await inst.ensure_ready()
        assert inst.pid is not None
        os.kill(inst.pid, signal.SIGKILL)
        await events.wait("exited")
        assert state(inst) is State.BACKOFF
        await inst.stop()
        # The loop's clock jumps past the backoff delay: a retry timer left behind would
        # be due now and run within a few turns of the loop. None may.
        loop = asyncio.get_running_loop()
        real_time = loop.time
        loop.time = lambda: real_time() + 1.0  # type: ignore[method-assign]
        try:
            for _ in range(20):
                await asyncio.sleep(0)
        finally:
            loop.time = real_time  # type: ignore[method-assign]
        assert state(inst) is State.STOPPED and inst.pid is None and inst.restarts == 0
        assert events.seen == ["starting", "ready", "exited"]
        assert child_processes(str(tmp_path)) == []
        await inst.close()

    run(main())


def test_respawn_that_keeps_failing_gives_up(tmp_path: Path, tiny_model: Path) -> None:
    async def main() -> None:
        events = Events()
        spec = engine_spec(tmp_path, tiny_model)
        inst = Instance(spec, on_event=events, backoff=(0.05, 0.05))
        await inst.ensure_ready()
        assert inst.pid is not None
        tiny_model.unlink()  # every respawn now exits 1 at once
        os.kill(inst.pid, signal.SIGKILL)
        while state(inst) is not State.FAILED:
            await events.wait("failed")
        assert inst.restarts == 2 and inst.pid is None
        assert inst.last_error and "model not found" in inst.last_error
        assert events.seen[2:] == ["exited", "starting", "failed", "starting", "failed"]
        with pytest.raises(InstanceFailed, match="model not found"):
            await inst.ensure_ready()  # a fresh attempt, which fails fast again
        await inst.close()

    run(main())


def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    async def main() -> None:
        script = fake_server(ignore_term=True)
        inst = Instance(fake_spec(tmp_path, script), grace=0.5)
        await inst.ensure_ready()
        pid = inst.pid
        assert pid is not None
        started = time.monotonic()
        await inst.stop()
        assert 0.5 <= time.monotonic() - started < 3
        assert gone(pid) and state(inst) is State.STOPPED
        await inst.close()
        text = inst.spec.log_path.read_text()
        assert "still running after 0.5 s: SIGKILL" in text and "exited with code -9" in text

    run(main())


def test_stop_while_starting(tmp_path: Path) -> None:
    async def main() -> None:
        events = Events()
        inst = Instance(fake_spec(tmp_path, FAKE_SILENT, health_timeout=30), on_event=events)
        waiter = asyncio.create_task(inst.ensure_ready())
        await events.wait("starting")
        pid = inst.pid
        assert pid is not None and state(inst) is State.STARTING
        await inst.stop()
        with pytest.raises(InstanceFailed, match="was stopped"):
            await waiter
        assert gone(pid) and state(inst) is State.STOPPED
        await inst.close()

    run(main())


def test_ensure_ready_while_closing_is_refused(tmp_path: Path) -> None:
    """Regression: an ensure_ready that reached the owner while close() was stopping the
    child respawned it, and close() never returned. The slow stop (a child that ignores
    SIGTERM, grace 0.5 s) makes the window wide enough to hit every time."""

    async def main() -> None:
        inst = Instance(fake_spec(tmp_path, fake_server(ignore_term=True)), grace=0.5)
        await inst.ensure_ready()
        closing = asyncio.create_task(inst.close())
        await until(lambda: state(inst) is State.STOPPING, "the owner to begin the stop")
        with pytest.raises(InstanceFailed, match="closed"):
            await inst.ensure_ready()
        await closing
        assert state(inst) is State.STOPPED and inst.pid is None

    run(main())


def test_stop_all_closes_every_instance(tmp_path: Path) -> None:
    async def main() -> None:
        script = fake_server()
        instances = [
            Instance(fake_spec(tmp_path, script, log_path=tmp_path / f"fake-{n}.log"))
            for n in range(3)
        ]
        await asyncio.gather(*(i.ensure_ready() for i in instances))
        pids = [i.pid for i in instances]
        await stop_all(instances)
        assert all(gone(pid) for pid in pids if pid)
        assert all(state(i) is State.STOPPED for i in instances)

    run(main())


@pytest.mark.pending_tasks_expected  # the owner, cancelled by asyncio.run: what is tested
def test_loop_teardown_without_close_leaves_no_child(tmp_path: Path) -> None:
    """asyncio.run cancels the owner task; its shutdown still terminates the child."""
    script = fake_server()
    inst = Instance(fake_spec(tmp_path, script))

    async def main() -> int:
        await inst.ensure_ready()
        assert inst.pid is not None
        return inst.pid

    pid = asyncio.run(main())
    assert gone(pid) and state(inst) is State.STOPPED


def _grandchild(inst: Instance) -> int:
    line = next(line for line in inst.log_tail(50) if line.startswith("fake: grandchild"))
    return int(line.split()[-1])


def test_stop_reaches_the_whole_process_group(tmp_path: Path) -> None:
    async def main() -> None:
        inst = Instance(fake_spec(tmp_path, fake_server(grandchild=True)))
        await inst.ensure_ready()
        grandchild = _grandchild(inst)
        await inst.stop()
        assert await dead(grandchild)
        await inst.close()

    run(main())


def test_crash_sweeps_a_grandchild_that_holds_the_output_pipe(tmp_path: Path) -> None:
    """The grandchild keeps the pipe open, so Process.wait() alone would never return:
    the exit must still be seen (returncode), and the group swept."""

    async def main() -> None:
        events = Events()
        inst = Instance(fake_spec(tmp_path, fake_server(grandchild=True)), on_event=events)
        await inst.ensure_ready()
        pid, grandchild = inst.pid, _grandchild(inst)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait("exited", timeout=3)
        assert await dead(grandchild)
        await inst.ensure_ready()  # respawned
        assert inst.restarts == 1
        await inst.close()

    run(main())
