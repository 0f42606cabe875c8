"""OpenAI's audio API: the transcription request's fields and its answers in every format.

Pure: the gateway (`blazar.serve.routes.audio_api`) hands in the multipart form's
fields and the whisper engine's JSON lines (`blazar.engines.launchers.whisper_launcher`:
an `info` line, `segment` lines, `done`), and gets back what the engine is asked
(`TranscriptionRequest.query`) and the answer OpenAI's clients expect:

- `json`: `{"text": ...}`; `text`: the text alone;
- `srt`, `vtt`: subtitles, one cue per segment;
- `verbose_json`: `task`, `language` (by name, as OpenAI spells it), `duration`,
  `text`, `segments` (id, seek, start, end, text, tokens, temperature,
  avg_logprob, compression_ratio, no_speech_prob) and, with
  `timestamp_granularities[]=word`, `words` (word, start, end).

The speech request (`SpeechRequest`) is checked here too: what the piper lane
encodes (wav, pcm), the speed range, the input length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from blazar.protocols import ProtocolError

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
CONTENT_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}
GRANULARITIES = ("word", "segment")
# What the piper lane answers in, and what OpenAI also offers that it does not encode.
SPEECH_FORMATS = ("wav", "pcm")
SPEECH_CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}
OTHER_SPEECH_FORMATS = ("mp3", "opus", "aac", "flac")
MAX_SPEECH_INPUT = 4096
TRUE = ("1", "true", "yes", "on")

# Whisper's language codes and the names OpenAI's verbose_json gives them.
LANGUAGES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}
CODES = {name: code for code, name in LANGUAGES.items()}


def _bad(message: str, param: str | None = None) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


@dataclass(frozen=True)
class TranscriptionRequest:
    """A transcription or translation request's fields, checked."""

    model: str
    task: str = "transcribe"  # transcribe | translate
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    response_format: str = "json"
    granularities: tuple[str, ...] = ()
    run_async: bool = False

    @property
    def words(self) -> bool:
        return "word" in self.granularities

    def query(self) -> str:
        """The whisper engine's query string for this request."""
        params: dict[str, str] = {"task": self.task}
        if self.language:
            params["language"] = self.language
        if self.prompt:
            params["prompt"] = self.prompt
        if self.temperature is not None:
            params["temperature"] = repr(self.temperature)
        if self.words:
            params["words"] = "1"
        return urlencode(params)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "task": self.task,
            "language": self.language,
            "prompt": self.prompt,
            "temperature": self.temperature,
            "response_format": self.response_format,
            "granularities": list(self.granularities),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TranscriptionRequest:
        return cls(
            model=str(data["model"]),
            task=str(data.get("task") or "transcribe"),
            language=data.get("language"),
            prompt=data.get("prompt"),
            temperature=data.get("temperature"),
            response_format=str(data.get("response_format") or "json"),
            granularities=tuple(data.get("granularities") or ()),
        )


def transcription_request(
    fields: Mapping[str, Sequence[str]], task: str = "transcribe"
) -> TranscriptionRequest:
    """Check the form's text fields (each name -> its values, in order)."""

    def one(name: str) -> str | None:
        values = fields.get(name)
        return values[-1] if values else None

    model = one("model")
    if not model:
        raise _bad("'model' is required: the name of a transcription model")
    fmt = one("response_format") or "json"
    if fmt not in FORMATS:
        raise _bad(f"response_format {fmt!r} is not one of {', '.join(FORMATS)}")
    temperature = None
    if (raw := one("temperature")) not in (None, ""):
        try:
            temperature = float(raw or "")
        except ValueError:
            raise _bad(f"temperature must be a number from 0 to 1, not {raw!r}") from None
        if not 0 <= temperature <= 1:
            raise _bad(f"temperature must be a number from 0 to 1, not {raw!r}")
    language = one("language") or None
    if task == "translate" and language:
        raise _bad("translations take no 'language': the answer is English")
    if language is not None:
        language = CODES.get(language.lower(), language.lower())
        if language not in LANGUAGES:
            raise _bad(
                f"language {one('language')!r} is not a language code Whisper knows "
                "(ISO 639-1, such as en, de, fr)"
            )
    granularities = tuple(
        dict.fromkeys(
            [
                *fields.get("timestamp_granularities[]", ()),
                *fields.get("timestamp_granularities", ()),
            ]
        )
    )
    for granularity in granularities:
        if granularity not in GRANULARITIES:
            raise _bad(f"timestamp_granularities[] {granularity!r} is not word or segment")
    if (stream := one("stream")) is not None and stream.lower() in TRUE:
        raise _bad(
            "stream is not supported for transcriptions here; use async=true for "
            "a job to poll instead"
        )
    return TranscriptionRequest(
        model=model,
        task=task,
        language=language,
        prompt=one("prompt") or None,
        temperature=temperature,
        response_format=fmt,
        granularities=granularities,
        run_async=(one("async") or "").lower() in TRUE,
    )


@dataclass
class Transcript:
    """What the engine heard, as its JSON lines said."""

    language: str | None = None
    duration: float = 0.0
    task: str = "transcribe"
    segments: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, line: Mapping[str, Any]) -> None:
        """Take one of the engine's lines (info, segment; done and error are the caller's)."""
        if line.get("type") == "info":
            self.language = line.get("language")
            self.duration = float(line.get("duration") or 0.0)
            self.task = str(line.get("task") or self.task)
        elif line.get("type") == "segment":
            self.segments.append(dict(line))

    @property
    def done(self) -> float:
        """Seconds of audio transcribed so far."""
        return float(self.segments[-1]["end"]) if self.segments else 0.0

    @property
    def text(self) -> str:
        return "".join(str(s.get("text", "")) for s in self.segments).strip()


def _clock(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def srt(transcript: Transcript) -> str:
    cues = [
        f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{str(s['text']).strip()}\n"
        for i, s in enumerate(transcript.segments, 1)
    ]
    return "\n".join(cues)


def vtt(transcript: Transcript) -> str:
    cues = [
        f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{str(s['text']).strip()}\n"
        for s in transcript.segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


SEGMENT_FIELDS = (
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
)


def verbose(transcript: Transcript, request: TranscriptionRequest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "task": transcript.task,
        "language": LANGUAGES.get(transcript.language or "", transcript.language or ""),
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if "segment" in request.granularities or not request.granularities:
        out["segments"] = [{k: s.get(k) for k in SEGMENT_FIELDS} for s in transcript.segments]
    if request.words:
        out["words"] = [
            {"word": str(w["word"]).strip(), "start": w["start"], "end": w["end"]}
            for s in transcript.segments
            for w in s.get("words") or ()
        ]
    out["usage"] = {"type": "duration", "seconds": round(transcript.duration)}
    return out


def render(transcript: Transcript, request: TranscriptionRequest) -> tuple[str, str]:
    """(body, content type) of the answer in the request's response_format."""
    fmt = request.response_format
    if fmt == "text":
        body = transcript.text + "\n"
    elif fmt == "srt":
        body = srt(transcript)
    elif fmt == "vtt":
        body = vtt(transcript)
    elif fmt == "verbose_json":
        body = json.dumps(verbose(transcript, request))
    else:
        usage = {"type": "duration", "seconds": round(transcript.duration)}
        body = json.dumps({"text": transcript.text, "usage": usage})
    return body, CONTENT_TYPES[fmt]


@dataclass(frozen=True)
class SpeechRequest:
    """A speech request's fields, checked: what the piper engine is asked."""

    model: str
    voice: str | None
    input: str
    response_format: str = "wav"
    speed: float = 1.0

    def engine_body(self) -> dict[str, Any]:
        return {"input": self.input, "speed": self.speed, "format": self.response_format}


def speech_request(body: Mapping[str, Any]) -> SpeechRequest:
    """Check `/v1/audio/speech`'s JSON body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: the name of a speech model (a voice)")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise _bad("'voice' must be a string")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _bad("'input' is required: the text to speak")
    if len(text) > MAX_SPEECH_INPUT:
        raise _bad(f"'input' is {len(text)} characters; at most {MAX_SPEECH_INPUT}")
    fmt = body.get("response_format", "wav")
    if fmt in OTHER_SPEECH_FORMATS:
        raise _bad(
            f"response_format {fmt!r} is not available here: the piper lane encodes "
            f"{' and '.join(SPEECH_FORMATS)} (16-bit mono at the voice's sample rate); ask "
            "for wav"
        )
    if fmt not in SPEECH_FORMATS:
        raise _bad(f"response_format {fmt!r} is not one of {', '.join(SPEECH_FORMATS)}")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0.25 <= speed <= 4:
        raise _bad("'speed' must be a number from 0.25 to 4.0")
    return SpeechRequest(model, voice, text, str(fmt), float(speed))
