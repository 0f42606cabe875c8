"""A hard limit on each test, beyond pytest-timeout's: the process ends, with every
thread's stack, when one test (setup, call and teardown) runs past HARD_LIMIT.

pytest-timeout's signal method fails a test that overruns by raising `Failed` inside
it. Inside a Hypothesis test that exception is an example's failure: Hypothesis
replays the example to shrink it, the replay blocks again, and no timer is armed any
more, so the suite waits forever (seen: an example that read a never-ending event
stream held CI until its 90-minute limit). faulthandler's watchdog thread needs no
cooperation from the test: past the limit it writes every thread's stack to the
terminal's stderr and exits, so such a run fails in minutes and shows where it hung.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Generator

import pytest

# Seconds; pytest-timeout's own limit (pyproject's `timeout`) is 300, so this fires only
# where that one could not.
HARD_LIMIT = float(os.environ.get("BLAZAR_TEST_HARD_LIMIT", "900"))


class Watchdog:
    def __init__(self, config: pytest.Config) -> None:
        try:  # pytest's faulthandler plugin keeps a copy of the real stderr (not captured)
            from _pytest.faulthandler import fault_handler_stderr_fd_key

            fd = config.stash[fault_handler_stderr_fd_key]
        except (ImportError, KeyError):
            fd = 2
        self.out = os.fdopen(os.dup(fd), "w")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self) -> Generator[None, object, object]:
        faulthandler.dump_traceback_later(HARD_LIMIT, exit=True, file=self.out)
        try:
            return (yield)
        finally:
            faulthandler.cancel_dump_traceback_later()
