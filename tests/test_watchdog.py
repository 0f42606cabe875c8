"""The suite's hard limit (tests/watchdog.py) ends a run that pytest-timeout cannot:
a Hypothesis test whose example blocks, where the timeout's `Failed` only makes
Hypothesis replay the example with no timer left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANGS = """
import time

import pytest
from hypothesis import given, settings, strategies as st


@pytest.mark.timeout(1)
@settings(max_examples=3, deadline=None, database=None)
@given(x=st.integers())
def test_blocks(x):
    while True:
        time.sleep(0.05)
"""
CONFTEST = """
from tests.watchdog import Watchdog


def pytest_configure(config):
    config.pluginmanager.register(Watchdog(config), "blazar-watchdog")
"""


def test_a_hypothesis_test_that_blocks_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_blocks.py").write_text(HANGS)
    env = dict(os.environ, PYTHONPATH=str(ROOT), BLAZAR_TEST_HARD_LIMIT="4")
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert run.returncode != 0
    assert "Timeout (0:00:04)!" in run.stderr + run.stdout
    assert "in test_blocks" in run.stderr + run.stdout  # where it hung
    assert took < 60
