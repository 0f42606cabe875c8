"""Serve piper-tts (text to speech) over HTTP: the launcher of Blazar's piper lane.

Blazar copies this file into each piper engine (`blazar.engines.audio`) and its
supervisor runs it with that engine's Python, as it runs llama-server:

    python piper_launcher.py --model DIR_OR_ONNX --host 127.0.0.1 --port 0
        [--threads N] [--parallel N] [--deterministic]
    python piper_launcher.py --version

The model is a piper voice: NAME.onnx with its NAME.onnx.json, or a directory that
holds them. The voice is loaded first; then the server listens and prints
`listening on http://HOST:PORT`, so `/health` answers 200 only once it can speak.

    GET  /health          {"status": "ok"}
    GET  /v1/voice        {"sample_rate", "language", "speakers", "formats"}
    POST /v1/synthesize   {"input": TEXT, "speed": 1.0, "format": "wav" | "pcm",
                          "speaker": N} -> the audio (16-bit mono at the voice's
                          sample rate: a WAV file, or raw little-endian samples)

A bad request is a 400 with `{"error": {"message": ...}}`. SIGTERM ends it.
It runs under the engine's Python, not Blazar's: standard library and piper-tts
(with the ONNX Runtime it brings) only.
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
import wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import piper  # type: ignore[import-untyped, import-not-found, unused-ignore]

FORMATS = ("wav", "pcm")
MAX_INPUT = 4096  # characters, as OpenAI's speech endpoint allows


class BadRequest(Exception):
    """The client's mistake: answered 400 with this message."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="piper_launcher.py", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    parser.add_argument("--model", help="a piper voice: NAME.onnx, or a directory holding it")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: the default)")
    parser.add_argument("--parallel", type=int, default=1, help="syntheses at once")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="no random variation (noise_scale and noise_w 0): the same text, the same audio",
    )
    args = parser.parse_args(argv)
    if not args.version and not args.model:
        parser.error("--model is required")
    return args


def versions() -> str:
    from importlib.metadata import version

    import onnxruntime  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return f"piper-tts {version('piper-tts')} (onnxruntime {onnxruntime.__version__})"


def voice_file(model: str) -> Path:
    """The .onnx of a voice given as a file or as the directory that holds it."""
    path = Path(model)
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.onnx") if p.with_name(p.name + ".json").is_file())
        if not found:
            raise FileNotFoundError(f"{path} holds no NAME.onnx with its NAME.onnx.json")
        return found[0]
    return path


class Engine:
    """The loaded voice; `parallel` syntheses at once, the rest wait."""

    def __init__(self, args: argparse.Namespace) -> None:
        path = voice_file(args.model)
        self.voice = piper.PiperVoice.load(path, config_path=f"{path}.json")
        if args.threads > 0:  # piper makes its session with ONNX Runtime's defaults
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = args.threads
            options.inter_op_num_threads = 1
            self.voice.session = onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        self.gate = threading.Semaphore(max(1, args.parallel))
        self.noise: dict[str, float] = (
            {"noise_scale": 0.0, "noise_w_scale": 0.0} if args.deterministic else {}
        )
        config = self.voice.config
        self.info = {
            "sample_rate": config.sample_rate,
            "language": getattr(config, "espeak_voice", None),
            "speakers": getattr(config, "num_speakers", 1),
            "formats": list(FORMATS),
            "voice": path.name.removesuffix(".onnx"),
        }

    def synthesize(self, request: Any) -> tuple[bytes, str]:
        if not isinstance(request, dict):
            raise BadRequest("the body must be a JSON object")
        text = request.get("input")
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("'input' must be the text to speak")
        if len(text) > MAX_INPUT:
            raise BadRequest(f"'input' is {len(text)} characters; at most {MAX_INPUT}")
        speed = request.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            raise BadRequest("'speed' must be a number from 0.25 to 4.0")
        fmt = request.get("format", "wav")
        if fmt not in FORMATS:
            raise BadRequest(f"format {fmt!r} is not available: {', '.join(FORMATS)}")
        speaker = request.get("speaker")
        if speaker is not None and not isinstance(speaker, int):
            raise BadRequest("'speaker' must be a speaker number")
        config = piper.SynthesisConfig(
            speaker_id=speaker, length_scale=1.0 / float(speed), **self.noise
        )
        out = io.BytesIO()
        with self.gate, wave.open(out, "wb") as wav:
            self.voice.synthesize_wav(text, wav, syn_config=config)
        data = out.getvalue()
        if fmt == "pcm":
            with wave.open(io.BytesIO(data), "rb") as wav:
                return wav.readframes(wav.getnframes()), "audio/pcm"
        return data, "audio/wav"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Sample-Rate", str(self.engine.info["sample_rate"]))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/v1/voice":
            self._json(200, self.engine.info)
        else:
            self._error(404, f"no such endpoint: {path}")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if path != "/v1/synthesize":
            self._error(404, f"no such endpoint: {path}")
            return
        try:
            audio, content_type = self.engine.synthesize(json.loads(body or b"null"))
        except (BadRequest, ValueError) as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:
            print(f"piper: synthesis failed: {exc!r}", file=sys.stderr, flush=True)
            self._error(500, f"synthesis failed: {exc}")
            return
        self._send(200, audio, content_type)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.version:
        print(versions())
        return 0
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        engine = Engine(args)
    except Exception as exc:
        print(f"piper_launcher: cannot load {args.model}: {exc}", file=sys.stderr)
        return 1
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = args.host, server.server_address[1]
    print(f"{versions()}: {engine.info['voice']} at {engine.info['sample_rate']} Hz", flush=True)
    print(f"piper_launcher: listening on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
