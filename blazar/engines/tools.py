"""llama.cpp's tools beside the engines: finding and building `llama-quantize`.

`blazar.manifest.quantize` asks `find_quantize` for a binary: the one beside the active
engine's `llama-server` (a `release` engine's archive ships every tool; a
`source` engine built with it), else one Blazar built before under
`<engines>/tools/llama-quantize/<tag>/`. The `wheel` engine (xllamacpp) ships
only the server, so `build_quantize` builds the `llama-quantize` target from a
llama.cpp tree with the source lane's cmake flags (`blazar.engines.source`:
the same trees, the same portable flags), checks that it runs, and publishes it
there atomically. A CPU build of that one target took about 12 minutes on two
busy cores here.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from blazar.engines.base import publish, staging
from blazar.engines.ledger import EngineRecord
from blazar.engines.source import (
    Runner,
    SourceBuildError,
    _run,
    _tail,
    cmake_args,
    engine_tag,
    resolve_source,
    run_cmake,
)

QUANTIZE = "llama-quantize"
TOOLS = "tools"  # <engines>/tools/<tool>/<tag>/


def tools_root(engines_root: Path) -> Path:
    return engines_root / TOOLS / QUANTIZE


def beside_engine(engine: EngineRecord | None) -> Path | None:
    """The engine's own llama-quantize: next to its server, or anywhere in its directory."""
    if engine is None or engine.method == "wheel":
        return None
    server = Path(engine.command[0]) if engine.command else None
    if server is not None and (server.parent / QUANTIZE).is_file():
        return server.parent / QUANTIZE
    root = Path(engine.path)
    found = sorted(root.rglob(QUANTIZE), key=lambda p: len(p.parts)) if root.is_dir() else []
    return next((p for p in found if p.is_file()), None)


def built(engines_root: Path) -> Path | None:
    """The most recently built llama-quantize Blazar keeps, if any."""
    root = tools_root(engines_root)
    found = (
        [p / QUANTIZE for p in root.iterdir() if (p / QUANTIZE).is_file()] if root.is_dir() else []
    )
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def find_quantize(engines_root: Path, engine: EngineRecord | None) -> Path | None:
    return beside_engine(engine) or built(engines_root)


def check_quantize(binary: Path, runner: Runner = subprocess.run) -> None:
    """A llama-quantize that starts: without arguments it prints its usage (and exits 1)."""
    done = _run(runner, [str(binary)], capture_output=True, text=True, timeout=60)
    said = f"{done.stdout or ''}{done.stderr or ''}"
    if "usage" not in said.lower():
        raise SourceBuildError(f"{binary} does not run as llama-quantize:\n{_tail(said, 8)}")


def build_quantize(
    engines_root: Path,
    spec: str,
    *,
    work_dir: Path,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    runner: Runner = subprocess.run,
) -> Path:
    """Build llama-quantize (CPU) from the llama.cpp tree `spec` names; return its path."""
    say = log or (lambda _msg: None)
    tree = resolve_source(spec, work_dir, runner=runner)
    tag = engine_tag(tree, "cpu")
    root = tools_root(engines_root)
    if (root / tag / QUANTIZE).is_file():
        say(f"{QUANTIZE} {tag} is built already: {root / tag / QUANTIZE}")
        return root / tag / QUANTIZE
    build_dir = work_dir / "build-quantize"
    commands = cmake_args(
        "cpu",
        cuda=None,
        build_dir=build_dir,
        source_dir=tree.root,
        jobs=jobs,
        build_number=tree.build_number,
        commit=tree.commit,
        target=QUANTIZE,
    )
    log_path = work_dir / "build-quantize.log"
    run_cmake(commands, log_path, f"{QUANTIZE} from {tree.root}", say, runner)
    made = build_dir / "bin" / QUANTIZE
    if not made.is_file():
        raise SourceBuildError(f"the build finished but made no {made}")
    with staging(root.parent, tag, QUANTIZE) as (tmp, final):
        shutil.copy2(made, tmp / QUANTIZE)
        for lib in sorted((build_dir / "bin").glob("*.so*")):  # a shared build's libraries
            shutil.copy2(lib, tmp / lib.name)
        shutil.copy2(log_path, tmp / "build.log")
        check_quantize(tmp / QUANTIZE, runner)
        publish(tmp, final)
    say(f"installed {QUANTIZE} {tag} at {final}")
    return final / QUANTIZE
