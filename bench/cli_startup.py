"""How long the `blazar` CLI takes to start: cold runs of a few commands beside `python -c pass`.

    .venv/bin/python bench/cli_startup.py [--runs 15] [--models 200] [--json]

It sets up everything itself: a temporary BLAZAR_HOME, one tiny GGUF written with
`blazar.testing.tiny.write_tiny_model`, and the user's manifest of `--models` models
(`[models.m-N]`, each a file:// source to that file with its sha256), applied once so
the store holds every model and `blazar diff` compares against a populated store
("No changes."). Then, in each of `--runs` rounds, it runs every command once, each in
a fresh interpreter (a subprocess, as a user's shell would start it), in a shuffled
order so a burst of load from elsewhere does not land on one command only:

- `python -c pass`: the interpreter's own start, in the same virtual environment;
- `blazar --version`;
- `blazar list` (the store holds the `--models` models, so it prints them all);
- `blazar diff` (on the user's manifest, the default).

`blazar` is the console script next to this interpreter, as installed by `make`; run
the script with PYTHONPATH=/some/other/checkout from outside this one to measure that
code instead. Each command runs once before the timed rounds, so the page cache is warm
and Python's bytecode cache (`__pycache__`) is written: PYTHONDONTWRITEBYTECODE is
removed from the commands' environment, as a user's machine has a cache too (pip
compiles an installed Blazar).

It prints each command's median wall time, its range, its median CPU time (user +
system, from wait4: less sensitive to other load on the machine than the wall time),
the difference from `python -c pass` and the ratio to it, and the target (150, 150 and
300 ms, on the median wall time). Exit status: 0 when it measured (targets met or
not), 1 when a command failed. It removes its files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from blazar.paths import MANIFEST_NAME
from blazar.testing.tiny import write_tiny_model


@dataclass(frozen=True)
class Case:
    label: str
    argv: list[str]
    target_ms: float | None
    expect: str = ""  # a piece of stdout that shows the command did its work


def blazar_argv() -> list[str]:
    """The console script next to this interpreter (what a user runs), else the module."""
    script = Path(sys.executable).with_name("blazar")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "blazar.cli.main"]


def write_manifest(home: Path, models: int) -> Path:
    """The user's manifest under `home`: `models` models, all from one tiny GGUF."""
    (home / "src").mkdir()
    gguf = write_tiny_model(home / "src" / "tiny.gguf")
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    blocks = [
        f'[models.m-{n}]\nsource = "{gguf.as_uri()}"\nsha256 = "{digest}"\nctx = 2048\n'
        for n in range(models)
    ]
    manifest = home / "config" / MANIFEST_NAME  # the user's manifest: `blazar diff` reads it
    manifest.parent.mkdir(parents=True)
    manifest.write_text("\n".join(blocks))
    return manifest


def run_once(case: Case, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run in a fresh interpreter."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(case.argv, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if child.returncode != 0 or case.expect not in stdout:
        raise SystemExit(
            f"{' '.join(case.argv)} failed (exit {child.returncode}):\n{stdout}{stderr}"
        )
    return elapsed, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="cold runs per command")
    parser.add_argument("--models", type=int, default=200, help="models in the manifest")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="blazar-cli-bench-"))
    try:
        env = {**os.environ, "BLAZAR_HOME": str(home), "NO_COLOR": "1"}
        # With PYTHONDONTWRITEBYTECODE set and no __pycache__ yet, every run would compile
        # Blazar's own modules again; a user's machine has the cache.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        write_manifest(home, args.models)
        blazar = blazar_argv()
        last = f"m-{args.models - 1}" if args.models else "No models yet"
        subprocess.run(
            [*blazar, "apply", "--yes"],
            env=env,
            check=True,
            capture_output=True,
        )
        cases = [
            Case("python -c pass", [sys.executable, "-c", "pass"], None),
            Case("blazar --version", [*blazar, "--version"], 150.0, "version"),
            Case("blazar list", [*blazar, "list"], 150.0, last),
            Case(
                f"blazar diff ({args.models} models)",
                [*blazar, "diff"],
                300.0,
                "No changes.",
            ),
        ]
        for case in cases:  # warm the page cache and the bytecode caches first
            run_once(case, env)
        times: dict[str, list[float]] = {case.label: [] for case in cases}
        cpu: dict[str, list[float]] = {case.label: [] for case in cases}
        order = list(cases)
        for _ in range(args.runs):
            random.shuffle(order)
            for case in order:
                wall, used = run_once(case, env)
                times[case.label].append(wall)
                cpu[case.label].append(used)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    base = statistics.median(times[cases[0].label]) * 1000
    rows = []
    for case in cases:
        ms = sorted(t * 1000 for t in times[case.label])
        median = statistics.median(ms)
        rows.append(
            {
                "command": case.label,
                "median_ms": round(median, 1),
                "min_ms": round(ms[0], 1),
                "max_ms": round(ms[-1], 1),
                "cpu_median_ms": round(statistics.median(cpu[case.label]) * 1000, 1),
                "minus_python_ms": round(median - base, 1),
                "ratio_to_python": round(median / base, 2),
                "target_ms": case.target_ms,
                "met": None if case.target_ms is None else median <= case.target_ms,
            }
        )
    load = os.getloadavg()[0]
    print(
        f"{args.runs} cold runs each: median wall time (min - max) and median CPU time "
        f"(user + system); load average {load:.2f}"
    )
    print(
        f"{'command':<26} {'median':>8} {'range':>16} {'cpu':>8} {'- python':>9} {'ratio':>6}"
        "  target"
    )
    for row in rows:
        target = "" if row["target_ms"] is None else f"<= {row['target_ms']:.0f} ms: "
        verdict = "" if row["met"] is None else ("met" if row["met"] else "NOT met")
        print(
            f"{row['command']:<26} {row['median_ms']:>6.1f}ms "
            f"{row['min_ms']:>6.1f} - {row['max_ms']:>6.1f} {row['cpu_median_ms']:>6.1f}ms "
            f"{row['minus_python_ms']:>+8.1f} {row['ratio_to_python']:>5.1f}x  {target}{verdict}"
        )
    if args.json:
        print(json.dumps({"runs": args.runs, "load": load, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
