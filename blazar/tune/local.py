"""A model on an engine child of its own, for one `blazar run` (`--no-draft`).

`blazar run MODEL --no-draft` answers through a child started here rather than the
daemon's, with speculative decoding off whatever the manifest or the profile says: a
dense child for that run, to compare with or to rule speculative decoding out. The
child is the one serve would start (`ModelRuntime.args`: the same template, context,
threads and cache settings) but dense, on a free loopback port, stopped when the run
ends. `blazar.cli.serve` calls `run_dense` with what to do against the child's URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from blazar.engines.process import EngineServer
from blazar.errors import InvalidInput, NotFound
from blazar.launch.tuning import Tuning
from blazar.paths import Paths
from blazar.serve.supervisor.build import build_runtimes
from blazar.serve.supervisor.runtime import ModelRuntime, resolve
from blazar.store.db import Store
from specs.manifest import Manifest

T = TypeVar("T")


def dense_runtime(store: Store, manifest: Manifest, name: str) -> ModelRuntime:
    """The model's runtime as serve builds it, with speculative decoding off."""
    try:
        runtime, _ = resolve(build_runtimes(store, manifest), name)
    except KeyError:
        raise NotFound(f"model '{name}' is not held: `blazar pull {name}` first") from None
    if runtime.kind != "chat" or runtime.refusal:
        raise InvalidInput(f"model '{name}' cannot run here: {runtime.refusal or runtime.kind}")
    tuning = runtime.tuning
    dense = Tuning(batch=tuning.batch, ubatch=tuning.ubatch, threads=tuning.threads)
    problem = runtime.settings_problem
    if problem and tuning.spec == "draft":
        problem = None  # its draft was the problem, and this run has none
    if problem:
        raise InvalidInput(f"model '{name}' is not started: {problem}; then apply")
    return replace(runtime, tuning=dense, settings_problem=None)


def run_dense(
    store: Store,
    paths: Paths,
    manifest: Manifest,
    name: str,
    use: Callable[[str, ModelRuntime], T],
) -> T:
    """Start the model's dense child, call `use(its url, the runtime)`, stop the child."""
    runtime = dense_runtime(store, manifest, name)

    async def run() -> T:
        log = paths.logs / f"run-{runtime.name.replace(':', '-')}.log"
        async with EngineServer(runtime.command, runtime.args(), log) as server:
            return await asyncio.to_thread(use, server.url, runtime)

    return asyncio.run(run())
