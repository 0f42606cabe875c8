"""Benchmark engines on a fixed workload: prompt and decode tokens/s from the engine's timings.

One fixed prompt and a fixed number of generated tokens, greedy, prompt cache
off. The figures are llama.cpp's own `timings` (prompt_per_second,
predicted_per_second), not wall-clock guesses. Several engines are measured in
one run with their requests interleaved, so background load hits them alike;
each figure is the median of `runs` requests after one warm-up.

`EngineService.bench` (behind `blazar bench` and the update gate) calls
`bench_engines`, which runs the engines as `EngineServer` children on a private
event loop; the requests themselves are blocking ones in worker threads, so the
loop keeps draining the children's output meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import urllib.request
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from blazar.engines.kinds import OPENAI_ONLY
from blazar.engines.ledger import BenchResult, EngineRecord
from blazar.engines.process import EngineServer
from blazar.errors import BlazarError

PROMPT = (
    "The history of the lighthouse begins with fires kept on hills by the sea, "
    "so that ships could find the harbour at night. Later, towers of stone were built, "
    "and keepers climbed them every evening to light the lamps. Tell the story:"
)
PREDICT = 64
RUNS = 5
CTX = 1024


@dataclass(frozen=True)
class Workload:
    prompt: str = PROMPT
    predict: int = PREDICT
    runs: int = RUNS
    # Half the cores, as `blazar serve` runs its children (blazar.serve.supervisor.runtime
    # default_threads): the gate measures an engine the way it will serve, and llama.cpp's
    # spinning threads on every core make a busy machine's figures meaningless.
    threads: int = max(1, (os.cpu_count() or 1) // 2)


class BenchError(BlazarError):
    pass


def _complete(url: str, workload: Workload, openai: bool = False) -> dict[str, float]:
    """One request's `timings`; `openai`: an engine that speaks only OpenAI's API (a
    mistralrs lane's launcher reports the same `timings` on /v1/completions)."""
    fields = {"prompt": workload.prompt, "temperature": 0, "ignore_eos": True}
    if openai:
        body, path = json.dumps({**fields, "max_tokens": workload.predict}), "/v1/completions"
    else:
        body = json.dumps({**fields, "n_predict": workload.predict, "cache_prompt": False})
        path = "/completion"
    request = urllib.request.Request(
        f"{url}{path}", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        data = json.load(resp)
    timings = data.get("timings") or {}
    if "predicted_per_second" not in timings:
        raise BenchError(f"the engine at {url} returned no timings; cannot benchmark it")
    return {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}


def bench_engines(
    engines: Sequence[EngineRecord],
    model_path: Path,
    model_name: str,
    sha256: str,
    log_dir: Path,
    *,
    workload: Workload | None = None,
    note: str = "bench",
    extra_args: Sequence[str] = (),
    spec: str = "off",
) -> list[BenchResult]:
    """Run the fixed workload on every engine in one interleaved run; `extra_args` (a
    decoding mode's flags: `spec` names it) go to every engine."""
    workload = workload or Workload()
    args = [
        "--model",
        str(model_path),
        "--ctx-size",
        str(CTX),
        "--parallel",
        "1",
        "--threads",
        str(workload.threads),
        "--threads-batch",
        str(workload.threads),
        *extra_args,
    ]
    logs = [log_dir / f"bench-{e.tag}.log" for e in engines]
    samples = asyncio.run(_measure(engines, args, logs, workload))
    results = []
    for engine in engines:
        runs = samples[engine.tag]
        results.append(
            BenchResult(
                model=model_name,
                sha256=sha256,
                kind=engine.kind,
                tag=engine.tag,
                prompt_tps=statistics.median(r.get("prompt_per_second", 0.0) for r in runs),
                decode_tps=statistics.median(r["predicted_per_second"] for r in runs),
                prompt_n=int(runs[0].get("prompt_n", 0)),
                predicted_n=int(runs[0].get("predicted_n", 0)),
                runs=len(runs),
                note=note,
                spec=spec,
            )
        )
    return results


async def _measure(
    engines: Sequence[EngineRecord], args: list[str], logs: list[Path], workload: Workload
) -> dict[str, list[dict[str, float]]]:
    """Start every engine, warm each up, then send the requests round-robin."""
    samples: dict[str, list[dict[str, float]]] = {e.tag: [] for e in engines}
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(EngineServer(e.command, args, log))
            for e, log in zip(engines, logs, strict=True)
        ]
        openai = [e.kind in OPENAI_ONLY for e in engines]
        for server, plain in zip(servers, openai, strict=True):  # warm-up: page in weights
            await asyncio.to_thread(_complete, server.url, workload, plain)
        for _ in range(workload.runs):
            for engine, server, plain in zip(engines, servers, openai, strict=True):
                sample = await asyncio.to_thread(_complete, server.url, workload, plain)
                samples[engine.tag].append(sample)
    return samples


@dataclass(frozen=True)
class GateVerdict:
    accept: bool
    old_tps: float
    new_tps: float
    drop: float  # fraction: 0.25 = 25% slower
    gate: float
    what: str = "decode"  # the figure compared, and its unit (the speech lanes have theirs)
    unit: str = "tokens/s"

    def explain(self, old_tag: str, new_tag: str) -> str:
        change = (
            f"{self.what} {self.old_tps:.1f} -> {self.new_tps:.1f} {self.unit} ({-self.drop:+.1%})"
        )
        if self.accept:
            return f"{new_tag} passed the regression gate: {change}, gate {self.gate:.0%}"
        return (
            f"{new_tag} is slower than {old_tag}: {change}, more than the {self.gate:.0%} gate; "
            f"kept {old_tag} active ({new_tag} stays installed: `blazar engine use {new_tag}` "
            "to switch anyway)"
        )


def gate(
    old_tps: float, new_tps: float, max_drop: float, what: str = "decode", unit: str = "tokens/s"
) -> GateVerdict:
    """Pure: accept the new engine unless its figure (decode tokens/s; a speech lane's
    audio seconds per second) dropped more than `max_drop`."""
    drop = (old_tps - new_tps) / old_tps if old_tps > 0 else 0.0
    return GateVerdict(drop <= max_drop, old_tps, new_tps, drop, max_drop, what, unit)
