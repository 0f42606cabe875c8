"""The speech lanes' bench figures: transcription and synthesis speed on a fixed workload.

whisper: the fixed clip `bench_clip.wav` (4.9 s of speech, 16 kHz, shipped with
Blazar) transcribed; piper: a fixed sentence synthesised. The figure is audio
seconds per second of work: the transcription's inverse real-time factor (a
real-time factor of 0.25 is a speed of 4x), and the synthesis speed. Several
engines are measured in one run with their requests interleaved, as
`blazar.engines.bench` does for llama.cpp, each figure the median of `runs` after
one warm-up. `Engines.bench` (the update gate, `blazar bench`) calls
`bench_audio`; the figure lands in the bench table's decode column, so the same
gate (`blazar.engines.bench.gate`) compares it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import statistics
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.engines.bench import BenchError
from blazar.engines.ledger import BenchResult, EngineRecord
from blazar.engines.process import EngineServer

CLIP = Path(__file__).with_name("bench_clip.wav")
SENTENCE = (
    "Speech engines are measured on this sentence. The quick brown fox jumps over the lazy "
    "dog, and the lighthouse keeper climbs the stairs to light the lamp."
)
RUNS = 3


@dataclass(frozen=True)
class AudioWorkload:
    runs: int = RUNS
    threads: int = max(1, (os.cpu_count() or 1) // 2)  # as serve runs its children


def wav_seconds(data: bytes) -> float:
    """The duration of a WAV file's audio."""
    with wave.open(io.BytesIO(data), "rb") as wav:
        return wav.getnframes() / float(wav.getframerate())


def transcribe(
    url: str, audio: bytes, query: str = "", timeout: float = 3600
) -> list[dict[str, Any]]:
    """POST audio to a whisper engine (`query`: its parameters); its answer's JSON lines.
    Also `blazar whisper --local`'s call."""
    path = f"{url}/v1/transcribe" + (f"?{query}" if query else "")
    request = urllib.request.Request(path, data=audio, method="POST")
    with _opened(request, timeout) as resp:
        return [json.loads(line) for line in resp.read().splitlines() if line.strip()]


def synthesize_body(url: str, body: dict[str, Any], timeout: float = 600) -> bytes:
    """POST a synthesis request to a piper engine; the audio it answers. Also `blazar tts
    --local`'s call."""
    request = urllib.request.Request(
        f"{url}/v1/synthesize",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with _opened(request, timeout) as resp:
        return bytes(resp.read())


def synthesize(url: str, text: str, timeout: float = 600) -> bytes:
    """POST text to a piper engine; the WAV it answers."""
    return synthesize_body(url, {"input": text}, timeout)


@contextmanager
def _opened(request: urllib.request.Request, timeout: float) -> Iterator[Any]:
    """The engine's answer; its own error message (a 400 for audio it cannot decode) as a
    BenchError."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            yield resp
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise BenchError(f"the engine refused: {message}") from None


def _one(kind: str, url: str, clip: bytes) -> tuple[float, float]:
    """(audio seconds, seconds of work) of one request."""
    started = time.perf_counter()
    if kind == "whisper":
        lines = transcribe(url, clip)
        elapsed = time.perf_counter() - started
        if not any(line.get("type") == "segment" for line in lines):
            raise BenchError(f"the whisper engine at {url} heard nothing in the bench clip")
        return wav_seconds(clip), elapsed
    audio = synthesize(url, SENTENCE)
    return wav_seconds(audio), time.perf_counter() - started


def bench_audio(
    engines: Sequence[EngineRecord],
    model_path: Path,
    model_name: str,
    sha256: str,
    log_dir: Path,
    *,
    workload: AudioWorkload | None = None,
    note: str = "bench",
) -> list[BenchResult]:
    """Run the lane's fixed workload on every engine (all of one kind) in one run."""
    workload = workload or AudioWorkload()
    kinds = {e.kind for e in engines}
    if len(kinds) != 1 or not kinds <= {"whisper", "piper"}:
        raise BenchError(f"bench_audio measures whisper or piper engines, not {sorted(kinds)}")
    kind = kinds.pop()
    args = ["--model", str(model_path), "--threads", str(workload.threads)]
    logs = [log_dir / f"bench-{e.tag}.log" for e in engines]
    samples = asyncio.run(_measure(kind, engines, args, logs, workload))
    results = []
    for engine in engines:
        runs = samples[engine.tag]
        audio = statistics.median(a for a, _ in runs)
        results.append(
            BenchResult(
                model=model_name,
                sha256=sha256,
                kind=engine.kind,
                tag=engine.tag,
                prompt_tps=0.0,
                decode_tps=statistics.median(a / w for a, w in runs if w > 0),
                prompt_n=0,
                predicted_n=int(audio * 1000),  # milliseconds of audio per run
                runs=len(runs),
                note=note,
            )
        )
    return results


async def _measure(
    kind: str,
    engines: Sequence[EngineRecord],
    args: list[str],
    logs: list[Path],
    workload: AudioWorkload,
) -> dict[str, list[tuple[float, float]]]:
    clip = CLIP.read_bytes()
    samples: dict[str, list[tuple[float, float]]] = {e.tag: [] for e in engines}
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(EngineServer(e.command, args, log))
            for e, log in zip(engines, logs, strict=True)
        ]
        for server in servers:  # warm-up: the first request pays for allocations
            await asyncio.to_thread(_one, kind, server.url, clip)
        for _ in range(workload.runs):
            for engine, server in zip(engines, servers, strict=True):
                samples[engine.tag].append(await asyncio.to_thread(_one, kind, server.url, clip))
    return samples
