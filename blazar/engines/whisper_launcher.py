"""Serve faster-whisper (speech to text) over HTTP: the launcher of Blazar's whisper lane.

Blazar copies this file into each whisper engine (`blazar.engines.audio`) and its
supervisor runs it with that engine's Python, as it runs llama-server:

    python whisper_launcher.py --model DIR --host 127.0.0.1 --port 0 [--threads N]
        [--parallel N] [--compute-type int8] [--device cpu] [--beam-size N]
    python whisper_launcher.py --version

DIR is a CTranslate2 Whisper model (config.json, model.bin, tokenizer.json,
vocabulary.*). The model is loaded first; then the server listens and prints
`listening on http://HOST:PORT`, so `/health` answers 200 only once it can work.

    GET  /health          {"status": "ok"}
    POST /v1/transcribe   the audio file's bytes as the body; the query holds
                          task (transcribe | translate), language, prompt,
                          temperature, words (1: word timestamps)

The audio is decoded in memory by faster-whisper's own decoder (PyAV), never
written anywhere. The answer is JSON Lines, one object per line as the work goes:
`{"type": "info", "duration": s, "language": ..}`, then one `{"type": "segment",
..}` per segment (start, end, text, words), then `{"type": "done"}`. A client that
closes the connection stops the work at the next segment. A file it cannot decode
or a bad parameter is a 400 with `{"error": {"message": ...}}`. SIGTERM ends it.

It runs under the engine's Python, not Blazar's: standard library and faster-whisper
only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import faster_whisper  # type: ignore[import-untyped, import-not-found, unused-ignore]

TASKS = ("transcribe", "translate")


class BadRequest(Exception):
    """The client's mistake: answered 400 with this message."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="whisper_launcher.py", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    parser.add_argument("--model", help="a CTranslate2 Whisper model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: the default)")
    parser.add_argument("--parallel", type=int, default=1, help="transcriptions at once")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--beam-size", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.version and not args.model:
        parser.error("--model is required")
    return args


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
        raise BadRequest(f"task must be transcribe or translate, not {task!r}")
    out: dict[str, Any] = {"task": task, "beam_size": beam_size}
    if (language := one("language")) is not None:
        out["language"] = language
    if (prompt := one("prompt")) is not None:
        out["initial_prompt"] = prompt
    if (temperature := one("temperature")) is not None:
        try:
            value = float(temperature)
        except ValueError:
            raise BadRequest(f"temperature must be a number, not {temperature!r}") from None
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


class Engine:
    """The loaded model; `parallel` transcriptions at once, the rest wait."""

    def __init__(self, args: argparse.Namespace) -> None:
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
            raise BadRequest("the audio file is empty")
        rate = self.model.feature_extractor.sampling_rate
        try:
            return faster_whisper.decode_audio(io.BytesIO(body), sampling_rate=rate)
        except Exception as exc:  # PyAV's errors for what is not audio it can decode
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise BadRequest(f"the file is not audio that can be decoded ({why})") from None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would flood the log; errors are printed below

    def _json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._error(404, f"no such endpoint: {self.path}")

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if url.path != "/v1/transcribe":
            self._error(404, f"no such endpoint: {url.path}")
            return
        engine = self.engine
        try:
            kwargs = options(parse_qs(url.query, keep_blank_values=True), engine.beam_size)
            audio = engine.decode(body)
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        with engine.gate:
            self._transcribe(audio, kwargs)

    def _transcribe(self, audio: Any, kwargs: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            segments, info = self.engine.model.transcribe(audio, **kwargs)
        except ValueError as exc:  # an unknown language code, and the like
            self._error(400, str(exc))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
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
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: stop here
        except Exception as exc:  # after the head: say it in the stream
            print(f"whisper: transcription failed: {exc!r}", file=sys.stderr, flush=True)
            try:
                self._line({"type": "error", "message": str(exc)})
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
            self.close_connection = True

    def _line(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.version:
        print(versions())
        return 0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        engine = Engine(args)
    except Exception as exc:
        print(f"whisper_launcher: cannot load {args.model}: {exc}", file=sys.stderr)
        return 1
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = args.host, server.server_address[1]
    print(f"{versions()}: {args.model}", flush=True)
    print(f"whisper_launcher: listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
