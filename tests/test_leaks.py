"""The suite-wide leak checks of tests/leaks.py fire: an inner pytest session, with only
that plugin, runs tests that each leave one thing behind, and one that leaves nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.serving import processes_mentioning

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
from tests.leaks import Leaks

def pytest_configure(config):
    config.pluginmanager.register(Leaks(), "blazar-leaks")
"""

TESTS = """
import asyncio, os, subprocess, sys, pytest

MARKER = "MARK"
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)  # " + MARKER]

@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"

@pytest.fixture(scope="module")
def shared_child():
    child = subprocess.Popen(SLEEP)  # the module's: outlives each test by design
    yield child
    child.kill()
    child.wait()

def test_a_child_left_running(home):
    subprocess.Popen(SLEEP)

def test_an_orphan_started_under_the_home(home):
    orphan = "import subprocess, sys; subprocess.Popen(%r)" % (SLEEP,)
    subprocess.run([sys.executable, "-c", orphan], check=True)  # its parent is gone

def test_a_task_left_pending():
    async def main():
        asyncio.get_running_loop().create_task(asyncio.sleep(60))
    asyncio.run(main())

def test_a_clean_test(home, shared_child):
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    async def main():
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))
    asyncio.run(main())

def test_another_clean_test_beside_the_shared_child(shared_child):
    assert shared_child.poll() is None
"""


def test_the_leak_checks_fire_and_only_on_a_leak(tmp_path: Path) -> None:
    marker = f"leak-check-{tmp_path.name}-{os.getpid()}"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS.replace('"MARK"', repr(marker)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
    finally:
        leftovers = processes_mentioning(marker)
        for pid in leftovers:
            os.kill(pid, 9)
    out = result.stdout + result.stderr
    assert leftovers == [], out  # the inner checks killed what they found
    assert re.search(r"\b5 passed, 3 errors\b", out), out
    errors = re.findall(r"^ERROR test_inner.py::(\w+)", out, re.M)
    assert sorted(errors) == [
        "test_a_child_left_running",
        "test_a_task_left_pending",
        "test_an_orphan_started_under_the_home",
    ], out
    # what each error's own section says it found (the short summary repeats it when the
    # terminal is wide enough, so it is not counted)
    found = dict(re.findall(r"^test_inner.py::(\w+) left things behind: ([^:]+):", out, re.M))
    assert found == {
        "test_a_child_left_running": "processes left running (killed now)",
        "test_an_orphan_started_under_the_home": "processes left running (killed now)",
        "test_a_task_left_pending": "asyncio tasks still pending when their loop closed",
    }, out
