"""OpenAI's Realtime event protocol, its core, for `/v1/realtime`: pure, no I/O.

Events are JSON objects in WebSocket text messages. The session
(`blazar.serve.request.realtime`) hands each client message to `parse_event`, applies
`session.update` with `updated` and `response.create`'s overrides with `for_response`,
adds `conversation.item.create`'s items with `parse_item`, and builds every server
event here (`Events`), so its shapes live in one place:

- client: `session.update`, `input_audio_buffer.append` / `.commit` / `.clear`,
  `conversation.item.create` (text, or audio's transcript), `response.create`,
  `response.cancel`;
- server: `session.created`, `session.updated`, `input_audio_buffer.committed`,
  `.cleared`, `conversation.item.created`,
  `conversation.item.input_audio_transcription.completed` (or `.failed`),
  `response.created`, `response.output_item.added`, `response.content_part.added`,
  `response.text.delta` (text only) or `response.audio_transcript.delta` and
  `response.audio.delta` (base64 PCM16), their `.done` events, `response.done`, and
  `error` for a bad event (the session goes on).

A bad event is an `EventError`: its message says what is wrong and what to send
instead, and the session answers it as an `error` event in OpenAI's shape. What
Blazar does not do is refused the same way, never ignored: turn detection (commit
the buffer yourself), tools, audio formats other than pcm16.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from blazar.protocols.openai_audio import CODES, LANGUAGES

RATE = 24_000  # pcm16: 16-bit mono little-endian at 24 kHz, as OpenAI's protocol fixes it
FORMAT = "pcm16"
MODALITIES = ("text", "audio")
CLIENT_EVENTS = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "response.create",
    "response.cancel",
)
SESSION_FIELDS = frozenset(
    {
        "model",
        "modalities",
        "instructions",
        "voice",
        "input_audio_format",
        "output_audio_format",
        "input_audio_transcription",
        "turn_detection",
        "tools",
        "tool_choice",
        "temperature",
        "max_response_output_tokens",
        "speed",
        "input_audio_noise_reduction",
        "tracing",
    }
)
RESPONSE_FIELDS = frozenset(
    {
        "modalities",
        "instructions",
        "voice",
        "output_audio_format",
        "temperature",
        "max_response_output_tokens",
        "max_output_tokens",
        "metadata",
        "conversation",
        "tools",
        "tool_choice",
    }
)
MAX_OUTPUT_TOKENS = 4096


class EventError(Exception):
    """A client event the session refuses, answered as an `error` event."""

    def __init__(
        self,
        message: str,
        code: str = "invalid_value",
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.kind = message, code, param, kind


@dataclass(frozen=True)
class Transcription:
    """`input_audio_transcription`: the transcription model and its hints."""

    model: str
    language: str | None = None
    prompt: str | None = None

    def to_api(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt}


@dataclass(frozen=True)
class Settings:
    """A session's settings (or one response's, with `response.create`'s overrides)."""

    model: str
    voice: str | None = None  # a served speech model
    transcription: Transcription | None = None
    instructions: str = ""
    modalities: tuple[str, ...] = MODALITIES
    temperature: float = 0.8
    max_tokens: int | None = None  # None: "inf", the model's own limit
    speed: float = 1.0

    def to_api(self, session_id: str) -> dict[str, Any]:
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "modalities": list(self.modalities),
            "instructions": self.instructions,
            "voice": self.voice,
            "input_audio_format": FORMAT,
            "output_audio_format": FORMAT,
            "input_audio_transcription": (
                self.transcription.to_api() if self.transcription is not None else None
            ),
            "turn_detection": None,
            "tools": [],
            "tool_choice": "auto",
            "temperature": self.temperature,
            "max_response_output_tokens": self.max_tokens if self.max_tokens else "inf",
            "speed": self.speed,
        }


def parse_event(data: Any) -> dict[str, Any]:
    """A client message (its JSON, decoded) as an event with a known `type`."""
    if not isinstance(data, dict):
        raise EventError("an event must be a JSON object with a 'type'", "invalid_json")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise EventError(
            "the event has no 'type': name one of " + ", ".join(CLIENT_EVENTS),
            "missing_required_parameter",
            "type",
        )
    if kind not in CLIENT_EVENTS:
        raise EventError(
            f"Invalid value: {kind!r}. The events served here are: {', '.join(CLIENT_EVENTS)}",
            "invalid_value",
            "type",
        )
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise EventError("'event_id' must be a string", "invalid_type", "event_id")
    return data


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise EventError(f"'{param}' must be a string", "invalid_type", param)
    return value


def _number(value: Any, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise EventError(
            f"'{param}' must be a number from {low:g} to {high:g}", "invalid_value", param
        )
    return float(value)


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise EventError(
            f"'{param}' must be an integer from 1 to {MAX_OUTPUT_TOKENS}, or 'inf'",
            "invalid_value",
            param,
        )
    return value


def _modalities(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(m not in MODALITIES for m in value):
        raise EventError(
            f'\'{param}\' must be ["text"] or ["text", "audio"]', "invalid_value", param
        )
    if "text" not in value:
        raise EventError(
            f"'{param}' must include \"text\": an audio answer comes with its transcript",
            "invalid_value",
            param,
        )
    return tuple(m for m in MODALITIES if m in value)


def _format(value: Any, param: str) -> None:
    if value != FORMAT:
        raise EventError(
            f"'{param}' {value!r} is not available here: audio is pcm16 (16-bit mono "
            f"little-endian at {RATE} Hz)",
            "invalid_value",
            param,
        )


def _no_tools(tools: Any, param: str) -> None:
    if tools not in (None, []):
        raise EventError(
            f"'{param}': tools are not available on /v1/realtime here; use "
            "/v1/chat/completions for tool calls",
            "unsupported_value",
            param,
        )


def _unknown(fields: Mapping[str, Any], known: frozenset[str], prefix: str) -> None:
    extra = sorted(set(fields) - known)
    if extra:
        raise EventError(
            f"Unknown parameter: '{prefix}.{extra[0]}'", "unknown_parameter", f"{prefix}.{extra[0]}"
        )


def _transcription(value: Any) -> Transcription | None:
    param = "session.input_audio_transcription"
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("model"), str) or not value["model"]:
        raise EventError(
            f"'{param}' must be null or {{\"model\": NAME}} naming a transcription "
            "model served here",
            "invalid_value",
            param,
        )
    _unknown(value, frozenset({"model", "language", "prompt"}), param)
    language = value.get("language")
    prompt = value.get("prompt")
    for name, item in (("language", language), ("prompt", prompt)):
        if item is not None and not isinstance(item, str):
            where = f"{param}.{name}"
            raise EventError(f"'{where}' must be a string", "invalid_type", where)
    if language:
        language = CODES.get(language.lower(), language.lower())
        if language not in LANGUAGES:
            raise EventError(
                f"'{param}.language' {value['language']!r} is not a language code "
                "Whisper knows (ISO 639-1, such as en, de, fr)",
                "invalid_value",
                f"{param}.language",
            )
    return Transcription(value["model"], language or None, prompt or None)


def updated(settings: Settings, session: Any) -> Settings:
    """The settings after a `session.update` (`session`: its `session` object). Which
    models the names are is the caller's to check (they need the served models)."""
    if not isinstance(session, dict):
        raise EventError(
            "'session' must be an object of the settings to change", "invalid_type", "session"
        )
    _unknown(session, SESSION_FIELDS, "session")
    changes: dict[str, Any] = {}
    if "model" in session:
        changes["model"] = _text(session["model"], "session.model")
    if "modalities" in session:
        changes["modalities"] = _modalities(session["modalities"], "session.modalities")
    if "instructions" in session:
        changes["instructions"] = _text(session["instructions"], "session.instructions")
    if "voice" in session:
        changes["voice"] = _text(session["voice"], "session.voice") or None
    for name in ("input_audio_format", "output_audio_format"):
        if name in session:
            _format(session[name], f"session.{name}")
    if "input_audio_transcription" in session:
        changes["transcription"] = _transcription(session["input_audio_transcription"])
    if session.get("turn_detection") is not None:
        raise EventError(
            "turn detection is not available here: set 'session.turn_detection' to null and "
            "end each turn yourself with input_audio_buffer.commit and response.create",
            "unsupported_value",
            "session.turn_detection",
        )
    if session.get("input_audio_noise_reduction") is not None:
        raise EventError(
            "input audio noise reduction is not available here: set it to null",
            "unsupported_value",
            "session.input_audio_noise_reduction",
        )
    _no_tools(session.get("tools"), "session.tools")
    if "temperature" in session:
        changes["temperature"] = _number(session["temperature"], "session.temperature", 0, 2)
    if "max_response_output_tokens" in session:
        changes["max_tokens"] = _max_tokens(
            session["max_response_output_tokens"], "session.max_response_output_tokens"
        )
    if "speed" in session:
        changes["speed"] = _number(session["speed"], "session.speed", 0.25, 4)
    return dataclasses.replace(settings, **changes)


@dataclass(frozen=True)
class ResponseOptions:
    """One response's settings and what it echoes back (`metadata`)."""

    settings: Settings
    metadata: dict[str, Any] | None = None


def for_response(settings: Settings, response: Any) -> ResponseOptions:
    """The settings one `response.create` asks for (its `response` object overrides)."""
    if response is None:
        return ResponseOptions(settings)
    if not isinstance(response, dict):
        raise EventError("'response' must be an object", "invalid_type", "response")
    _unknown(response, RESPONSE_FIELDS, "response")
    if response.get("conversation", "auto") != "auto":
        raise EventError(
            "'response.conversation' must be 'auto' here: every response joins "
            "the session's conversation",
            "unsupported_value",
            "response.conversation",
        )
    _no_tools(response.get("tools"), "response.tools")
    changes: dict[str, Any] = {}
    if "modalities" in response:
        changes["modalities"] = _modalities(response["modalities"], "response.modalities")
    if "instructions" in response:
        changes["instructions"] = _text(response["instructions"], "response.instructions")
    if "voice" in response:
        changes["voice"] = _text(response["voice"], "response.voice") or None
    if "output_audio_format" in response:
        _format(response["output_audio_format"], "response.output_audio_format")
    if "temperature" in response:
        changes["temperature"] = _number(response["temperature"], "response.temperature", 0, 2)
    for name in ("max_response_output_tokens", "max_output_tokens"):
        if name in response:
            changes["max_tokens"] = _max_tokens(response[name], f"response.{name}")
    metadata = response.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise EventError(
            "'response.metadata' must be an object", "invalid_type", "response.metadata"
        )
    return ResponseOptions(dataclasses.replace(settings, **changes), metadata)


# -- the conversation -------------------------------------------------------------------


@dataclass
class Item:
    """A message of the conversation: `kind` "audio" for committed audio (its `text` is
    the transcript once whisper has it) and for a spoken answer, else "text"."""

    id: str
    role: str
    kind: str = "text"
    text: str | None = None
    status: str = "completed"
    failed: bool = False  # a transcription that failed: the item stays out of the prompt

    def to_api(self) -> dict[str, Any]:
        if self.role == "user" and self.kind == "audio":
            content = [{"type": "input_audio", "transcript": self.text}]
        elif self.role == "assistant":
            key = "transcript" if self.kind == "audio" else "text"
            content = [{"type": self.kind, key: self.text or ""}] if self.text is not None else []
        else:
            content = [{"type": "input_text", "text": self.text}]
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": content,
        }


def parse_item(item: Any, new_id: Callable[[], str]) -> Item:
    """`conversation.item.create`'s `item`: a message in text (or audio's transcript)."""
    param = "item"
    if not isinstance(item, dict):
        raise EventError("'item' must be an object", "invalid_type", param)
    if item.get("type", "message") != "message":
        raise EventError(
            f"item type {item.get('type')!r} is not available here: send messages",
            "unsupported_value",
            "item.type",
        )
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise EventError(
            "'item.role' must be user, assistant or system", "invalid_value", "item.role"
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("'item.content' must be a list of parts", "invalid_type", "item.content")
    texts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_audio" and isinstance(part.get("transcript"), str):
            texts.append(part["transcript"])
        elif kind == "input_audio":
            raise EventError(
                f"'{where}': send audio with input_audio_buffer.append and commit "
                "it; an input_audio part here needs its 'transcript'",
                "unsupported_value",
                where,
            )
        else:
            raise EventError(
                f"'{where}' must be an input_text or text part with its 'text'",
                "invalid_value",
                where,
            )
    given = item.get("id")
    if given is not None and (not isinstance(given, str) or not given or len(given) > 64):
        raise EventError(
            "'item.id' must be a string of at most 64 characters", "invalid_value", "item.id"
        )
    return Item(given or new_id(), role, "text", "\n".join(texts))


@dataclass
class Conversation:
    """The session's items, oldest first, the oldest dropped past `limit` items or past
    `char_limit` characters of text (the newest item is always kept)."""

    limit: int = 200
    char_limit: int = 1 << 20
    items: list[Item] = field(default_factory=list)

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item) -> str | None:
        """Append an item; the id of the one before it (`previous_item_id`)."""
        if any(i.id == item.id for i in self.items):
            raise EventError(
                f"an item with id {item.id!r} is already in the conversation",
                "duplicate_item_id",
                "item.id",
            )
        previous = self.last_id
        self.items.append(item)
        del self.items[: -self.limit]
        total = sum(len(i.text or "") for i in self.items)
        while total > self.char_limit and len(self.items) > 1:
            total -= len(self.items.pop(0).text or "")
        return previous

    def messages(self, instructions: str) -> list[dict[str, str]]:
        """The chat messages: the instructions as the system message, then each item."""
        out = [{"role": "system", "content": instructions}] if instructions else []
        out += [{"role": i.role, "content": i.text} for i in self.items if i.text and not i.failed]
        return out


# -- server events ----------------------------------------------------------------------


class Events:
    """Server events with the session's event ids (`event_<session>_<n>`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._n = itertools.count(1)

    def make(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": f"event_{self.prefix}_{next(self._n)}", **fields}

    def error(self, error: EventError, event_id: str | None = None) -> dict[str, Any]:
        return self.make(
            "error",
            error={
                "type": error.kind,
                "code": error.code,
                "message": error.message,
                "param": error.param,
                "event_id": event_id,
            },
        )


def usage(engine: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An OpenAI chat stream's `usage` as a realtime response's."""
    if not engine:
        return None
    prompt = int(engine.get("prompt_tokens") or 0)
    completion = int(engine.get("completion_tokens") or 0)
    return {
        "total_tokens": prompt + completion,
        "input_tokens": prompt,
        "output_tokens": completion,
        "input_token_details": {"text_tokens": prompt, "audio_tokens": 0},
        "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
    }


def response_object(
    response_id: str,
    options: ResponseOptions,
    status: str,
    *,
    output: list[dict[str, Any]] | None = None,
    details: dict[str, Any] | None = None,
    used: dict[str, Any] | None = None,
) -> dict[str, Any]:
    settings = options.settings
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output or [],
        "usage": used,
        "metadata": options.metadata,
        "modalities": list(settings.modalities),
        "voice": settings.voice,
        "output_audio_format": FORMAT,
        "temperature": settings.temperature,
        "max_output_tokens": settings.max_tokens if settings.max_tokens else "inf",
    }
