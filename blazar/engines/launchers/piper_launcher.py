"""Serve piper-tts (text to speech) over HTTP: the launcher of Blazar's piper lane.

Blazar copies this file, with `launcher_common.py` beside it, into each piper engine
(`blazar.engines.audio`) and its supervisor runs it with that engine's Python, as it
runs llama-server:

    python piper_launcher.py --model DIR_OR_ONNX --host 127.0.0.1 --port 0
        [--threads N] [--parallel N] [--deterministic]
    python piper_launcher.py --version

The model is a piper voice: NAME.onnx with its NAME.onnx.json, or a directory that
holds them. The voice is loaded first; then the server listens and prints
`piper_launcher: listening on http://HOST:PORT`, so `/health` answers 200 only once it
can speak (the skeleton, the flags and the HTTP side are `launcher_common`'s).

    GET  /health          {"status": "ok"}
    GET  /v1/voice        {"sample_rate", "language", "speakers", "formats"}
    POST /v1/synthesize   {"input": TEXT, "speed": 1.0, "format": "wav" | "pcm",
                          "speaker": N} -> the audio (16-bit mono at the voice's
                          sample rate: a WAV file, or raw little-endian samples)

A bad request is a 400 with `{"error": {"message": ...}}`. SIGTERM or SIGINT ends it.
It runs under the engine's Python, not Blazar's: standard library and piper-tts
(with the ONNX Runtime it brings) only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import wave
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import SplitResult

import piper  # type: ignore[import-untyped, import-not-found, unused-ignore]

if __package__:  # imported as blazar.engines.launchers.piper_launcher (Blazar's tests)
    from blazar.engines.launchers import launcher_common as common
else:  # run as a script in its engine's environment, launcher_common.py copied beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launcher_common as common  # type: ignore[no-redef, import-not-found, unused-ignore]

FORMATS = ("wav", "pcm")
MAX_INPUT = 4096  # characters, as OpenAI's speech endpoint allows


def parser() -> argparse.ArgumentParser:
    parser = common.flags(
        __doc__, "a piper voice: NAME.onnx, or a directory holding it", "syntheses at once"
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="no random variation (noise_scale and noise_w 0): the same text, the same audio",
    )
    return parser


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


class Voice(common.Engine):
    """The loaded voice; `parallel` syntheses at once, the rest wait."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
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

    def describe(self) -> str:
        return f"{self.info['voice']} at {self.info['sample_rate']} Hz"

    def synthesize(self, request: Any) -> tuple[bytes, str]:
        if not isinstance(request, dict):
            raise common.BadRequest("the body must be a JSON object")
        text = request.get("input")
        if not isinstance(text, str) or not text.strip():
            raise common.BadRequest("'input' must be the text to speak")
        if len(text) > MAX_INPUT:
            raise common.BadRequest(f"'input' is {len(text)} characters; at most {MAX_INPUT}")
        speed = request.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            raise common.BadRequest("'speed' must be a number from 0.25 to 4.0")
        fmt = request.get("format", "wav")
        if fmt not in FORMATS:
            raise common.BadRequest(f"format {fmt!r} is not available: {', '.join(FORMATS)}")
        speaker = request.get("speaker")
        if speaker is not None and not isinstance(speaker, int):
            raise common.BadRequest("'speaker' must be a speaker number")
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


class VoiceHandler(common.Handler):
    engine: Voice

    def headers_for_all(self) -> dict[str, str]:
        return {"X-Sample-Rate": str(self.engine.info["sample_rate"])}

    def voice(self, url: SplitResult, body: bytes) -> None:
        self.send_json(200, self.engine.info)

    def synthesize(self, url: SplitResult, body: bytes) -> None:
        try:
            audio, content_type = self.engine.synthesize(json.loads(body or b"null"))
        except (common.BadRequest, ValueError) as exc:
            self.send_error_json(400, str(exc))
            return
        except Exception as exc:
            print(f"piper: synthesis failed: {exc!r}", file=sys.stderr, flush=True)
            self.send_error_json(500, f"synthesis failed: {exc}")
            return
        self.send(200, audio, content_type)

    GET: ClassVar[dict[str, common.Route]] = {"/v1/voice": voice}
    POST: ClassVar[dict[str, common.Route]] = {"/v1/synthesize": synthesize}


def main(argv: list[str]) -> int:
    return common.serve_http("piper_launcher", argv, parser(), versions, Voice, VoiceHandler)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
