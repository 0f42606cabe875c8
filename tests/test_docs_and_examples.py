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


BENCHES = sorted((ROOT / "bench").glob("*.py"))


def test_every_bench_script_starts() -> None:
    """The figures in docs/ come from these: each must still import and parse its
    arguments after the code it measures moved (body_memory.py once imported a helper
    from where it no longer was)."""
    assert len(BENCHES) >= 9 and {"spec.py", "realtime.py"} <= {b.name for b in BENCHES}
    for script in BENCHES:
        if "__main__" in script.read_text():  # a bench: it parses --help
            argv, expect = [str(script), "--help"], "usage:"
        else:  # a helper the benches import: it imports
            argv = ["-c", f"import runpy; runpy.run_path({str(script)!r}); print('imported')"]
            expect = "imported"
        result = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=script.parent
        )
        assert result.returncode == 0, f"{script.name}: {result.stderr[-2000:]}"
        assert expect in result.stdout, script.name
