"""The suite-wide leak checks: a test fails if it leaves asyncio tasks or processes behind.

Registered by tests/conftest.py (`Leaks`, a pytest plugin); tests/test_leaks.py proves
each check fires. After a test's teardown (its function-scoped fixtures included):

- asyncio: any event loop closed during the test (`asyncio.run`, or a loop a test
  made and closed itself) must have had no task still pending when it closed.
  `asyncio.run` would cancel such a task silently; a pending task at close is an
  owner never closed, a helper never awaited. (A test of what that cancellation
  does says so: `@pytest.mark.pending_tasks_expected`.)
- processes: none of the processes started during the test may still run (a zombie,
  exited but not yet reaped, does not count): neither a child of the pytest process,
  nor any process whose BLAZAR_HOME is inside the test's (what `blazar serve` and its
  engine children inherit, even once orphaned). Processes that fixtures of a wider
  scope start are theirs, and outlive the test by design.

What it finds is killed (SIGKILL) and reported as an error of the test's teardown,
after a short grace for a process already on its way out. The checks cost a few reads
of /proc per test (well under a millisecond): the last pid assigned (/proc/loadavg),
this process's children, and, only when pids were assigned meanwhile, the process
list and the environment of the new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import pytest

GRACE = 0.25  # seconds a process found at teardown gets to finish exiting
_HOME = pytest.StashKey[str]()
_BEFORE = pytest.StashKey[tuple[int, set[int]]]()


def last_pid() -> int:
    """The pid the kernel assigned last (/proc/loadavg): new processes get the next ones."""
    return int(Path("/proc/loadavg").read_text().rsplit(maxsplit=1)[1])


def pids_since(last: int) -> set[int]:
    """The live pids assigned after `last` (pid numbers wrap around at the top)."""
    now = last_pid()
    if now == last:
        return set()  # no process was started anywhere: nothing to list
    found = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    if now > last:
        return {pid for pid in found if last < pid <= now}
    return {pid for pid in found if pid > last or pid <= now}


def children() -> set[int]:
    """Live children of this process (of any of its threads); zombies left out."""
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            found.update(
                int(p) for p in Path(f"/proc/self/task/{tid}/children").read_text().split()
            )
    return {pid for pid in found if alive(pid)}


def alive(pid: int) -> bool:
    """Running, not a zombie (its parent has not reaped it yet) nor gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def home_of(pid: int) -> str | None:
    """The BLAZAR_HOME a process was started with (None: none, or not ours to read)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"BLAZAR_HOME="):
            return entry[len(b"BLAZAR_HOME=") :].decode(errors="replace")
    return None


def describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = "?"
    return f"{pid} ({cmdline.strip()[:160]})"


def left_behind(before: tuple[int, set[int]], home: str | None, shared: set[int]) -> list[int]:
    """Processes started since `before` (the last pid then, our children then) that still
    run: our children, and those whose BLAZAR_HOME is inside `home`."""
    last, ours = before
    found = {pid for pid in children() - ours - shared}
    if home is not None:
        inside = home.rstrip("/") + "/"
        for pid in pids_since(last) - shared:
            started = home_of(pid)
            if started is not None and (started + "/").startswith(inside) and alive(pid):
                found.add(pid)
    return sorted(found)


def reap(leftovers: Iterable[int]) -> list[str]:
    """Give `leftovers` the grace to finish exiting; kill those still running and return
    what they were."""
    deadline = time.monotonic() + GRACE
    running = [pid for pid in leftovers if alive(pid)]
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        running = [pid for pid in running if alive(pid)]
    described = [describe(pid) for pid in running]
    for pid in running:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return described


class TaskRecorder:
    """Records the tasks still pending when an event loop closes (installed once)."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        runner_close = asyncio.Runner.close
        loop_close = asyncio.BaseEventLoop.close
        recorder = self

        def close_runner(runner: asyncio.Runner) -> None:
            loop = getattr(runner, "_loop", None)
            if loop is not None and not loop.is_closed():
                recorder.note(loop)  # before asyncio.run cancels them without a word
            runner_close(runner)

        def close_loop(loop: asyncio.BaseEventLoop) -> None:
            if not loop.is_closed() and not loop.is_running():
                recorder.note(loop)
            loop_close(loop)

        asyncio.Runner.close = close_runner  # type: ignore[method-assign]
        asyncio.BaseEventLoop.close = close_loop  # type: ignore[method-assign]

    def note(self, loop: asyncio.AbstractEventLoop) -> None:
        for task in asyncio.all_tasks(loop):
            if not task.done():
                self.pending.append(repr(task)[:300])


class Leaks:
    """The plugin: snapshots before each test, checks after its teardown."""

    def __init__(self) -> None:
        self.tasks = TaskRecorder()
        self.shared: set[int] = set()  # started by fixtures wider than a test

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
        if fixturedef.scope == "function":
            return (yield)
        before = last_pid()
        try:
            return (yield)
        finally:
            self.shared |= {pid for pid in pids_since(before) if alive(pid)}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        item.stash[_BEFORE] = (last_pid(), children())
        self.tasks.pending.clear()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        item.stash[_HOME] = os.environ.get("BLAZAR_HOME", "")
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        result = yield
        self.shared = {pid for pid in self.shared if alive(pid)}
        pending, self.tasks.pending = self.tasks.pending, []
        before = item.stash.get(_BEFORE, None)
        home = item.stash.get(_HOME, "") or None
        found = reap(left_behind(before, home, self.shared)) if before else []
        problems = []
        if pending and item.get_closest_marker("pending_tasks_expected") is None:
            problems.append(
                "asyncio tasks still pending when their loop closed:\n  " + "\n  ".join(pending)
            )
        if found:
            problems.append("processes left running (killed now):\n  " + "\n  ".join(found))
        if problems:
            pytest.fail(f"{item.nodeid} left things behind: " + "\n".join(problems), False)
        return result
