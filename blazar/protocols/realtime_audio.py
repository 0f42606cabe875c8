"""The audio and text a realtime session handles between its engines: pure, no I/O.

`/v1/realtime` (`blazar.serve.request.realtime`) takes PCM16 from the client
(16-bit mono little-endian samples at the session's rate, base64 in
`input_audio_buffer.append`), holds it in an `AudioBuffer` bounded in seconds,
and hands the whisper engine a WAV of it (`wav`: the engine decodes files, not
bare samples). The chat model's answer arrives token by token; `Sentences` cuts
it into pieces worth speaking as soon as each is whole, so the piper engine
speaks the first sentence while the model writes the next. Piper answers a WAV at
its voice's rate (22,050 Hz for the medium voices); `pcm_of_wav` and `resample`
turn it into PCM16 at the session's rate (24 kHz in OpenAI's protocol), and
`chunks` cuts that into the `response.audio.delta` events.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import wave

import numpy as np

WIDTH = 2  # bytes per PCM16 sample
SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s)|[\u3002\uff01\uff1f]|\n")
CLAUSE_END = re.compile(r"[,;:\u2014](?=\s)")


class AudioError(ValueError):
    """Audio the session cannot take: the message says why."""


def decode_pcm(data: object) -> bytes:
    """The PCM16 bytes of an append's base64 `audio` (an even number of bytes)."""
    if not isinstance(data, str):
        raise AudioError("'audio' must be a base64 string of PCM16 samples")
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("'audio' is not valid base64") from None
    if len(pcm) % WIDTH:
        raise AudioError(f"'audio' holds {len(pcm)} bytes: PCM16 samples are 2 bytes each")
    return pcm


def seconds(pcm_bytes: int, rate: int) -> float:
    return pcm_bytes / (WIDTH * rate)


class AudioBuffer:
    """The input audio buffer: PCM16 appended until a commit takes it, at most `limit_s`
    seconds at `rate`."""

    def __init__(self, rate: int, limit_s: float) -> None:
        self.rate = rate
        self.limit = int(limit_s * rate) * WIDTH
        self._data = bytearray()

    def __len__(self) -> int:
        return len(self._data)

    @property
    def seconds(self) -> float:
        return seconds(len(self._data), self.rate)

    def append(self, pcm: bytes) -> None:
        if len(self._data) + len(pcm) > self.limit:
            limit_s = seconds(self.limit, self.rate)
            raise AudioError(
                f"the input audio buffer holds at most {limit_s:g} s of audio at {self.rate} Hz "
                f"and has {self.seconds:.2f} s; commit it (input_audio_buffer.commit) or clear "
                "it before appending more"
            )
        self._data += pcm

    def take(self) -> bytes:
        out = bytes(self._data)
        self._data.clear()
        return out

    def clear(self) -> None:
        self._data.clear()


def wav(pcm: bytes, rate: int) -> bytes:
    """PCM16 mono samples as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(WIDTH)
        file.setframerate(rate)
        file.writeframes(pcm)
    return out.getvalue()


def pcm_of_wav(data: bytes) -> tuple[bytes, int]:
    """(PCM16 mono samples, rate) of a 16-bit WAV file; several channels are mixed down."""
    try:
        with wave.open(io.BytesIO(data), "rb") as file:
            channels, width, rate = file.getnchannels(), file.getsampwidth(), file.getframerate()
            frames = file.readframes(file.getnframes())
    except (wave.Error, EOFError) as exc:
        raise AudioError(f"the speech engine's answer is not a WAV file: {exc}") from None
    if width != WIDTH:
        raise AudioError(f"the speech engine's WAV has {8 * width}-bit samples, not 16-bit")
    if channels == 1:
        return frames, rate
    samples = np.frombuffer(frames, dtype="<i2").reshape(-1, channels)
    return samples.mean(axis=1).astype("<i2").tobytes(), rate


def resample(pcm: bytes, source: int, target: int) -> bytes:
    """PCM16 at `source` Hz as PCM16 at `target` Hz (linear interpolation: speech, not
    music; piper's 22,050 Hz to OpenAI's 24 kHz adds no content above the source's)."""
    if source == target or not pcm:
        return pcm
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    count = round(len(samples) * target / source)
    at = np.arange(count) * (source / target)
    out = np.interp(at, np.arange(len(samples)), samples)
    return bytes(np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes())


def chunks(pcm: bytes, rate: int, seconds_each: float) -> list[bytes]:
    """PCM16 cut into pieces of `seconds_each` (the last shorter), on sample boundaries."""
    size = max(WIDTH, int(rate * seconds_each) * WIDTH)
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


class Sentences:
    """Cuts streamed text into pieces to speak: each sentence once it is whole.

    A sentence ends at `.`, `!`, `?` or `…` (closing quotes and brackets kept) followed
    by a space, at a full-width `。！？`, or at a line break; one shorter than
    `min_chars` waits for the next ("Dr. Smith" is not two). The first piece may also
    end at a clause break (`,` `;` `:` `—` and a space) once it has `first_chars`,
    so the first audio comes sooner; a piece that reaches `max_chars` with no break
    is cut at its last clause break or space. `close` gives what is left."""

    def __init__(self, *, min_chars: int = 8, first_chars: int = 24, max_chars: int = 160) -> None:
        self.min_chars, self.first_chars, self.max_chars = min_chars, first_chars, max_chars
        self.pending = ""
        self.first = True

    def feed(self, text: str) -> list[str]:
        self.pending += text
        out: list[str] = []
        while (cut := self._cut()) is not None:
            piece, self.pending = self.pending[:cut], self.pending[cut:]
            if (piece := piece.strip()) and any(c.isalnum() for c in piece):
                out.append(piece)
                self.first = False
        return out

    def close(self) -> list[str]:
        piece, self.pending = self.pending.strip(), ""
        return [piece] if any(c.isalnum() for c in piece) else []

    def _cut(self) -> int | None:
        text = self.pending
        for match in SENTENCE_END.finditer(text):
            if len(text[: match.end()].strip()) >= self.min_chars:
                return match.end()
        if self.first:
            for match in CLAUSE_END.finditer(text):
                if len(text[: match.end()].strip()) >= self.first_chars:
                    return match.end()
        if len(text) < self.max_chars:
            return None
        head = text[: self.max_chars]
        clauses = [m.end() for m in CLAUSE_END.finditer(head)]
        if clauses and clauses[-1] >= self.min_chars:
            return clauses[-1]
        space = head.rstrip().rfind(" ")
        return space if space >= self.min_chars else self.max_chars
