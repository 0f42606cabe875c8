"""The sdcpp lane's bench figure: images per second at a fixed size and step count.

Every engine generates the same image (64x64, 1 step, cfg scale 1, seed 1, the fixed
prompt) through its launcher's OpenAI route, interleaved as `blazar.engines.bench` does
for llama.cpp, each figure the median of `runs` after one warm-up. The figure is images
per second (the inverse of seconds per image), so that the lanes' one gate
(`blazar.engines.bench.gate`: the largest drop accepted) compares it as it compares
decode tokens/s; `blazar engine list` and the gate's message say seconds per image too.
`Engines.bench` (the update gate, `blazar bench`) calls `bench_sd`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.engines.bench import BenchError
from blazar.engines.ledger import BenchResult, EngineRecord
from blazar.engines.process import EngineServer
from blazar.protocols.openai_images import extra_args

PROMPT = "a lighthouse on a cliff at dusk"
RUNS = 3


@dataclass(frozen=True)
class ImageWorkload:
    size: str = "64x64"
    steps: int = 1
    runs: int = RUNS
    threads: int = max(1, (os.cpu_count() or 1) // 2)  # as serve runs its children


def generate(url: str, body: dict[str, Any], timeout: float = 3600) -> list[bytes]:
    """POST an OpenAI images request to an sdcpp engine; the images (PNG bytes)."""
    request = urllib.request.Request(
        f"{url}/v1/images/generations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise BenchError(f"the engine refused: {exc.read()[:300]!r}") from None
    return [base64.b64decode(item["b64_json"]) for item in answer.get("data", [])]


def _one(url: str, workload: ImageWorkload) -> float:
    """Seconds of work for one image."""
    body = {
        "prompt": PROMPT + extra_args(workload.steps, 1.0, 1, None),
        "size": workload.size,
        "n": 1,
    }
    started = time.perf_counter()
    images = generate(url, body)
    if len(images) != 1 or not images[0].startswith(b"\x89PNG"):
        raise BenchError(f"the sdcpp engine at {url} answered no PNG")
    return time.perf_counter() - started


def bench_sd(
    engines: Sequence[EngineRecord],
    model_path: Path,
    model_name: str,
    sha256: str,
    log_dir: Path,
    *,
    workload: ImageWorkload | None = None,
    note: str = "bench",
) -> list[BenchResult]:
    """Run the fixed image workload on every sdcpp engine in one run."""
    workload = workload or ImageWorkload()
    if {e.kind for e in engines} != {"sdcpp"}:
        raise BenchError("bench_sd measures sdcpp engines only")
    args = ["--model", str(model_path), "--threads", str(workload.threads)]
    logs = [log_dir / f"bench-{e.tag}.log" for e in engines]
    samples = asyncio.run(_measure(engines, args, logs, workload))
    return [
        BenchResult(
            model=model_name,
            sha256=sha256,
            kind=engine.kind,
            tag=engine.tag,
            prompt_tps=0.0,
            decode_tps=1.0 / statistics.median(samples[engine.tag]),  # images per second
            prompt_n=0,
            predicted_n=workload.steps,
            runs=len(samples[engine.tag]),
            note=note,
        )
        for engine in engines
    ]


async def _measure(
    engines: Sequence[EngineRecord], args: list[str], logs: list[Path], workload: ImageWorkload
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {e.tag: [] for e in engines}
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(EngineServer(e.command, args, log))
            for e, log in zip(engines, logs, strict=True)
        ]
        for server in servers:  # warm-up
            await asyncio.to_thread(_one, server.url, workload)
        for _ in range(workload.runs):
            for engine, server in zip(engines, servers, strict=True):
                samples[engine.tag].append(await asyncio.to_thread(_one, server.url, workload))
    return samples
