"""Shared fixtures and rules: an isolated BLAZAR_HOME, offline tests, opt-in marks, no leaks.

The engine pins and the model fixtures live in tests/fixtures.py (imported here, so
pytest registers them); the leak checks in tests/leaks.py.

Marks that mean something (registered in pyproject.toml):
- `slow`: runs only with BLAZAR_SLOW=1 (a llama.cpp source build, Gemma end to end);
- `network`: runs only with BLAZAR_NETWORK=1, and is the only kind of test that may
  reach beyond loopback; every other test is confined to it (tests/offline.py);
- `ui`: runs only with BLAZAR_UI=1 (`make test-ui`): the dashboard in a real browser,
  Debian's chromium-headless-shell driven by Playwright (tests/browser.py).
Declared test dependencies are imported, never skipped when missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from blazar.cli.main import cli
from blazar.paths import Paths, resolve_paths
from tests.fixtures import (  # noqa: F401 (fixtures, registered by being imported here)
    WHEELS,
    files,
    gemma_gguf,
    lora_files,
    models,
    tiny_model,
)
from tests.leaks import Leaks
from tests.offline import HINT, guard
from tests.watchdog import Watchdog

# The engine runs in child processes (never imported here), so check it is installed.
if importlib.util.find_spec("xllamacpp") is None:
    raise ImportError(
        "xllamacpp, a declared test dependency (pyproject's `test` extra), is not installed: "
        "run `make test`, or `pip install -e '.[quickstart,test]'`"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Give the session its own HF_HOME, holding an empty agent-harness registry.

    huggingface_hub, the first time a process builds request headers, fetches that
    registry from its default endpoint (`constants.ENDPOINT`, fixed at import, not the
    HF_ENDPOINT a test sets later) unless HF_HOME holds a copy under a day old: a test
    talking to the loopback hub would also reach huggingface.co. This also keeps every
    test, and every `blazar serve` a test starts, off the user's Hugging Face cache.
    """
    if "huggingface_hub" in sys.modules:  # its constants would already be fixed
        raise RuntimeError("huggingface_hub was imported before tests/conftest.py set HF_HOME")
    hf_home = Path(tempfile.mkdtemp(prefix="blazar-tests-hf-"))
    (hf_home / ".agent_harnesses.json").write_text('{"standardEnvVars": [], "harnesses": {}}')
    os.environ["HF_HOME"] = str(hf_home)
    config.add_cleanup(lambda: shutil.rmtree(hf_home, ignore_errors=True))
    config.pluginmanager.register(Leaks(), "blazar-leaks")
    config.pluginmanager.register(Watchdog(config), "blazar-watchdog")


OPT_IN = {
    "slow": ("BLAZAR_SLOW", "a long test"),
    "network": ("BLAZAR_NETWORK", "reaches the package index"),
    "ui": ("BLAZAR_UI", "drives a real browser: `make test-ui`"),
}
_REFUSED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow`, `network` and `ui` tests are skipped unless their variable opts in, saying how."""
    for item in items:
        unmet = [
            (mark, variable, what)
            for mark, (variable, what) in OPT_IN.items()
            if item.get_closest_marker(mark) and os.environ.get(variable) != "1"
        ]
        if unmet:
            marks = " and ".join(f"{mark} ({what})" for mark, _, what in unmet)
            variables = " ".join(f"{variable}=1" for _, variable, _ in unmet)
            item.add_marker(pytest.mark.skip(reason=f"{marks}: set {variables} to run it"))


@pytest.fixture(autouse=True)
def offline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked `network` reaches only loopback (see tests/offline.py)."""
    if request.node.get_closest_marker("network") is None:
        request.node.stash[_REFUSED] = guard(monkeypatch, WHEELS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """Fail a test that tried to go beyond loopback, even if the code under test coped."""
    try:
        return (yield)
    finally:
        refused = item.stash.get(_REFUSED, [])
        if refused:
            pytest.fail(f"{item.nodeid} tried to reach the network ({'; '.join(refused)}): {HINT}")


@pytest.fixture(autouse=True)
def blazar_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own BLAZAR_HOME: no test touches the real home."""
    home = tmp_path / "blazar-home"
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    monkeypatch.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
    return home


@pytest.fixture
def paths(blazar_home: Path) -> Paths:
    return resolve_paths()


class Blazar:
    """Runs the `blazar` CLI in-process, as a user would type it."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str, ok: bool = True) -> Result:
        result = self.runner.invoke(cli, list(args), catch_exceptions=False)
        if ok and result.exit_code != 0:
            raise AssertionError(
                f"blazar {' '.join(args)} exited {result.exit_code}:\n{result.output}"
            )
        return result


@pytest.fixture
def blazar() -> Blazar:
    return Blazar()


def run_blazar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the installed console script in a child process."""
    exe = Path(sys.executable).with_name("blazar")
    return subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
