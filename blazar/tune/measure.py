"""Measure tune candidates on real children: start them, send the workload, time it.

Each candidate runs as serve would run it (its argv from `ModelRuntime.args`), on
`replicas` children of its own (`blazar.engines.process.EngineServer`: a free loopback
port, its own process group, stopped at the end). A stage's candidates are up at the
same time (at most `AT_ONCE`), each gets one warm-up request, then the runs go round
robin, so background load hits every candidate alike. A run is the workload's requests
sent by `load` clients at once (each client sends them all, spread over the replicas),
streamed from the engine's own `/completion`, greedy; its figure is the tokens generated
over the run's wall-clock time (`e2e`), or over the seconds the answers streamed, from
each first token to its last (`stream`: what a decoding mode changes, the prompts left
out; the time to the first token is reported beside it). The engine's `timings` give
decode and prompt speed and, for speculative decoding, the drafted and accepted tokens.

`run_once` takes the request function and the clock, so the decision can be tested with
an injected timer (tests/test_tune_units.py); `measure` is the asyncio part.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from blazar.engines.process import EngineServer, EngineStartError
from blazar.errors import BlazarError
from blazar.tune.race import Figures

AT_ONCE = 4  # candidates up at the same time (memory: each is a model, or two)


class TuneError(BlazarError):
    pass


@dataclass(frozen=True)
class Sample:
    """One request's answer: client-side times and the engine's own timings."""

    ttft_s: float
    wall_s: float
    predicted_n: int
    prompt_tps: float | None = None
    decode_tps: float | None = None
    draft_n: int = 0
    draft_accepted: int = 0


@dataclass(frozen=True)
class Run:
    tps: float  # tokens generated over the run's wall-clock seconds, prompts included
    samples: tuple[Sample, ...]

    @property
    def stream_tps(self) -> float:
        """Tokens over the seconds from each answer's first token to its last, summed: the
        speed the answers stream at, the prompts' time (the same in every mode) left out."""
        seconds = sum(max(0.0, s.wall_s - s.ttft_s) for s in self.samples)
        tokens = sum(max(0, s.predicted_n - 1) for s in self.samples)
        return tokens / seconds if seconds > 0 else 0.0


Send = Callable[[str, str], Sample]  # (child URL, prompt) -> its answer


def completion(predict: int, cache_prompt: bool, clock: Callable[[], float]) -> Send:
    """A streamed, greedy `/completion` request of `predict` tokens."""

    def send(url: str, prompt: str) -> Sample:
        body = {
            "prompt": prompt,
            "n_predict": predict,
            "temperature": 0,
            "stream": True,
            "cache_prompt": cache_prompt,
        }
        request = urllib.request.Request(
            f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start, first, final = clock(), None, {}
        with urllib.request.urlopen(request, timeout=600) as resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if first is None and event.get("content"):
                    first = clock()
                if event.get("stop"):
                    final = event
        end = clock()
        timings = final.get("timings") or {}
        if not timings:
            raise TuneError(f"the child at {url} answered without timings: cannot measure it")
        return Sample(
            ttft_s=(first or end) - start,
            wall_s=end - start,
            predicted_n=int(timings.get("predicted_n", 0)),
            prompt_tps=timings.get("prompt_per_second"),
            decode_tps=timings.get("predicted_per_second"),
            draft_n=int(timings.get("draft_n", 0)),
            draft_accepted=int(timings.get("draft_n_accepted", 0)),
        )

    return send


def run_once(
    urls: Sequence[str], prompts: Sequence[str], load: int, send: Send, clock: Callable[[], float]
) -> Run:
    """One run: `load` clients each send every prompt, client i starting at replica i."""

    def client(i: int) -> list[Sample]:
        return [send(urls[(i + k) % len(urls)], p) for k, p in enumerate(prompts)]

    start = clock()
    if load == 1:
        samples = client(0)
    else:
        with ThreadPoolExecutor(load) as pool:
            samples = [s for batch in pool.map(client, range(load)) for s in batch]
    seconds = clock() - start
    tokens = sum(s.predicted_n for s in samples)
    return Run(tokens / seconds if seconds > 0 else 0.0, tuple(samples))


def figures(
    label: str,
    runs: Sequence[Run],
    argv: Sequence[str],
    memory_mb: float | None,
    settings: dict[str, object],
    figure: str = "e2e",
) -> Figures:
    """A candidate's figures from its runs; `figure` is what each run counts: `e2e`
    (tokens over the run's time) or `stream` (`Run.stream_tps`)."""
    samples = [s for r in runs for s in r.samples]

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    drafted = sum(s.draft_n for s in samples)
    return Figures(
        label=label,
        runs=tuple(r.stream_tps if figure == "stream" else r.tps for r in runs),
        figure=figure,
        decode_tps=median([s.decode_tps for s in samples]),
        prompt_tps=median([s.prompt_tps for s in samples]),
        ttft_s=median([s.ttft_s for s in samples]),
        acceptance=sum(s.draft_accepted for s in samples) / drafted if drafted else None,
        memory_mb=memory_mb,
        argv=tuple(argv),
        settings=settings,
    )


def resident_mb(pid: int | None) -> float | None:
    """A process's resident memory (VmRSS), in MB; None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Job:
    """One candidate to measure: its label, its child argv, the settings it stands for."""

    label: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    settings: dict[str, object]


Progress = Callable[[str], None]  # called with a job's label as each of its runs ends


async def measure(
    jobs: Sequence[Job],
    prompts: Sequence[str],
    send: Send,
    *,
    runs: int,
    replicas: int,
    load: int,
    log_dir: Path,
    progress: Progress = lambda label: None,
    clock: Callable[[], float] = time.perf_counter,
    figure: str = "e2e",
) -> list[Figures]:
    """Every job's figures, `AT_ONCE` jobs up at a time, their runs interleaved."""
    found: list[Figures] = []
    for at in range(0, len(jobs), AT_ONCE):
        group = jobs[at : at + AT_ONCE]
        async with AsyncExitStack() as stack:
            servers: dict[str, list[EngineServer]] = {}
            failed: dict[str, str] = {}
            for index, job in enumerate(group, start=at):
                servers[job.label] = []
                for n in range(replicas):
                    child = EngineServer(job.command, job.args, log_dir / f"tune-{index}-{n}.log")
                    try:
                        servers[job.label].append(await stack.enter_async_context(child))
                    except EngineStartError as exc:  # the others are still measured
                        failed[job.label] = str(exc).splitlines()[0]
                        break
            done: dict[str, list[Run]] = {job.label: [] for job in group}
            for round_ in range(runs + 1):  # the first is a warm-up, not counted
                for job in (j for j in group if j.label not in failed):
                    urls = [s.url for s in servers[job.label]]
                    batch = prompts[:1] if round_ == 0 else prompts
                    run = await asyncio.to_thread(run_once, urls, batch, load, send, clock)
                    if round_:
                        done[job.label].append(run)
                    progress(job.label)
            for job in group:
                rss = [resident_mb(s.pid) for s in servers[job.label]]
                memory = sum(r for r in rss if r is not None) if any(rss) else None
                measured = figures(
                    job.label, done[job.label], job.args, memory, job.settings, figure
                )
                found.append(replace(measured, error=failed.get(job.label)))
    return found
