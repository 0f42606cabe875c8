"""Docs that are generated must be current; examples must run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from blazar.cli.docs import render

ROOT = Path(__file__).resolve().parent.parent


def test_cli_reference_is_current() -> None:
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == render(), "docs/cli.md is stale: python -m blazar.cli.docs > docs/cli.md"


def test_import_example_runs(blazar_home: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", str(ROOT / "examples" / "import-tiny-model.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "imported tiny: llama" in result.stdout
    assert "largest ctx that fits: 2048" in result.stdout
    assert "removed tiny" in result.stdout
