"""Serve faster-whisper (speech to text) over HTTP: the launcher of Blazar's whisper lane.

Blazar copies this file, with `launcher_common.py` beside it, into each whisper engine
(`blazar.engines.audio`) and its supervisor runs it with that engine's Python, as it
runs llama-server:

    python whisper_launcher.py --model DIR --host 127.0.0.1 --port 0 [--threads N]
        [--parallel N] [--compute-type int8] [--device cpu] [--beam-size N]
    python whisper_launcher.py --version

DIR is a CTranslate2 Whisper model (config.json, model.bin, tokenizer.json,
vocabulary.*). The model is loaded first; then the server listens and prints
`whisper_launcher: listening on http://HOST:PORT`, so `/health` answers 200 only once
it can work (the skeleton, the flags and the HTTP side are `launcher_common`'s).

    GET  /health          {"status": "ok"}
    POST /v1/transcribe   the audio file's bytes as the body; the query holds
                          task (transcribe | translate), language, prompt,
                          temperature, words (1: word timestamps)

The audio is decoded in memory by faster-whisper's own decoder (PyAV), never
written anywhere. The answer is JSON Lines, one object per line as the work goes:
`{"type": "info", "duration": s, "language": ..}`, then one `{"type": "segment",
..}` per segment (start, end, text, words), then `{"type": "done"}`. A client that
closes the connection stops the work at the next segment. A file it cannot decode
or a bad parameter is a 400 with `{"error": {"message": ...}}`. SIGTERM or SIGINT
ends it.

It runs under the engine's Python, not Blazar's: standard library and faster-whisper
only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from typing import Any, ClassVar
from urllib.parse import SplitResult, parse_qs

import faster_whisper  # type: ignore[import-untyped, import-not-found, unused-ignore]

if __package__:  # imported as blazar.engines.launchers.whisper_launcher (Blazar's tests)
    from blazar.engines.launchers import launcher_common as common
else:  # run as a script in its engine's environment, launcher_common.py copied beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launcher_common as common  # type: ignore[no-redef, import-not-found, unused-ignore]

TASKS = ("transcribe", "translate")


def parser() -> argparse.ArgumentParser:
    parser = common.flags(
        __doc__, "a CTranslate2 Whisper model directory", "transcriptions at once"
    )
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--beam-size", type=int, default=5)
    return parser


def versions() -> str:
    import ctranslate2  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return f"faster-whisper {faster_whisper.__version__} (ctranslate2 {ctranslate2.__version__})"


def options(query: dict[str, list[str]], beam_size: int) -> dict[str, Any]:
    """faster-whisper's transcribe() keywords from the request's query."""

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values and values[-1] != "" else None

    task = one("task") or "transcribe"
    if task not in TASKS:
        raise common.BadRequest(f"task must be transcribe or translate, not {task!r}")
    out: dict[str, Any] = {"task": task, "beam_size": beam_size}
    if (language := one("language")) is not None:
        out["language"] = language
    if (prompt := one("prompt")) is not None:
        out["initial_prompt"] = prompt
    if (temperature := one("temperature")) is not None:
        try:
            value = float(temperature)
        except ValueError:
            raise common.BadRequest(f"temperature must be a number, not {temperature!r}") from None
        if value > 0:  # 0 (OpenAI's default) keeps faster-whisper's fallback schedule
            out["temperature"] = value
    out["word_timestamps"] = one("words") == "1"
    return out


def segment_json(segment: Any) -> dict[str, Any]:
    words = [
        {
            "word": w.word,
            "start": round(w.start, 3),
            "end": round(w.end, 3),
            "probability": round(w.probability, 4),
        }
        for w in (segment.words or ())
    ]
    return {
        "type": "segment",
        "id": segment.id,
        "seek": segment.seek,
        "start": round(segment.start, 3),
        "end": round(segment.end, 3),
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
        "words": words,
    }


class Whisper(common.Engine):
    """The loaded model; `parallel` transcriptions at once, the rest wait."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.model = faster_whisper.WhisperModel(
            args.model,
            device=args.device,
            compute_type=args.compute_type,
            cpu_threads=args.threads,
            num_workers=max(1, args.parallel),
        )
        self.beam_size = args.beam_size
        self.gate = threading.Semaphore(max(1, args.parallel))

    def decode(self, body: bytes) -> Any:
        if not body:
            raise common.BadRequest("the audio file is empty")
        rate = self.model.feature_extractor.sampling_rate
        try:
            return faster_whisper.decode_audio(io.BytesIO(body), sampling_rate=rate)
        except Exception as exc:  # PyAV's errors for what is not audio it can decode
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise common.BadRequest(f"the file is not audio that can be decoded ({why})") from None


class WhisperHandler(common.Handler):
    engine: Whisper

    def transcribe(self, url: SplitResult, body: bytes) -> None:
        engine = self.engine
        try:
            kwargs = options(parse_qs(url.query, keep_blank_values=True), engine.beam_size)
            audio = engine.decode(body)
        except common.BadRequest as exc:
            self.send_error_json(400, str(exc))
            return
        with engine.gate:
            self._transcribe(audio, kwargs)

    POST: ClassVar[dict[str, common.Route]] = {"/v1/transcribe": transcribe}

    def _transcribe(self, audio: Any, kwargs: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            segments, info = self.engine.model.transcribe(audio, **kwargs)
        except ValueError as exc:  # an unknown language code, and the like
            self.send_error_json(400, str(exc))
            return
        self.start_chunked("application/x-ndjson")
        head = {
            "type": "info",
            "duration": round(info.duration, 3),
            "language": info.language,
            "language_probability": round(info.language_probability, 4),
            "task": kwargs["task"],
        }
        try:
            self._line(head)
            for segment in segments:  # each is decoded as it is asked for
                self._line(segment_json(segment))
            self._line({"type": "done", "seconds": round(time.monotonic() - started, 3)})
            self.end_chunked()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: stop here
        except Exception as exc:  # after the head: say it in the stream
            print(f"whisper: transcription failed: {exc!r}", file=sys.stderr, flush=True)
            try:
                self._line({"type": "error", "message": str(exc)})
                self.end_chunked()
            except OSError:
                pass
            self.close_connection = True

    def _line(self, payload: dict[str, Any]) -> None:
        self.send_chunk(json.dumps(payload).encode() + b"\n")


def main(argv: list[str]) -> int:
    return common.serve_http("whisper_launcher", argv, parser(), versions, Whisper, WhisperHandler)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
