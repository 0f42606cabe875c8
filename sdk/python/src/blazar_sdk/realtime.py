"""`Client.realtime(...)`: a session on `/v1/realtime`, OpenAI's Realtime event protocol.

Events are JSON objects in WebSocket text messages (`blazar_sdk._websocket`).
The client sends `session.update`, `input_audio_buffer.append` (base64 audio:
PCM16, mono, little-endian, at the session's rate), `input_audio_buffer.commit`
and `.clear`, `conversation.item.create`, `response.create` and
`response.cancel`; the server answers `session.created`,
`input_audio_buffer.committed`, transcription, `response.text.delta`,
`response.audio.delta`, `response.audio_transcript.delta`, `response.done` and
`error` events, which the session yields as dicts (an `error` event is an event,
not an exception: the session goes on). The key goes in the `Authorization`
header, or, with `auth="subprotocol"`, in the `openai-insecure-api-key.KEY`
subprotocol browsers use (they cannot set headers on a WebSocket).

The gateway answers with `session.created` first; an answer comes as
`response.text.delta` events when the session's modalities are `["text"]`, else
as `response.audio_transcript.delta` and `response.audio.delta` (PCM16 at 24 kHz,
spoken sentence by sentence while the model writes). A refused handshake (an
unknown model, a missing key) raises the gateway's typed `APIError`.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from blazar_sdk._websocket import WebSocket
from blazar_sdk.errors import RealtimeError
from blazar_sdk.types import JSON

__all__ = ["Realtime", "connect", "realtime_url"]

PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def realtime_url(base: str, model: str | None) -> str:
    """The WebSocket URL of `/v1/realtime` on the gateway at `base` (http -> ws)."""
    parts = urllib.parse.urlsplit(base.rstrip("/"))
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = urllib.parse.urlencode({"model": model}) if model else ""
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path + PATH, query, ""))


def connect(
    base: str,
    key: str | None,
    *,
    model: str | None,
    auth: str = "header",
    timeout: float = 60.0,
    max_message: int = 16 << 20,
) -> Realtime:
    """Open a session: the handshake with the key as `auth` says ("header" or
    "subprotocol")."""
    if auth not in ("header", "subprotocol"):
        raise ValueError(f"auth: expected 'header' or 'subprotocol', got {auth!r}")
    headers: dict[str, str] = {"User-Agent": "blazar-sdk"}
    protocols = [SUBPROTOCOL]
    if key and auth == "header":
        headers["Authorization"] = f"Bearer {key}"
    elif key:
        protocols.append(KEY_SUBPROTOCOL + key)
    ws = WebSocket.connect(
        realtime_url(base, model),
        headers=headers,
        subprotocols=protocols,
        timeout=timeout,
        max_message=max_message,
    )
    return Realtime(ws)


class Realtime:
    """An open realtime session; a context manager and an iterator of server events."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    def send(self, event: Mapping[str, Any]) -> None:
        """Send one client event as it is."""
        if not isinstance(event.get("type"), str):
            raise ValueError(f"an event needs a 'type': {dict(event)!r}")
        self.ws.send_text(json.dumps(event))

    def update_session(self, **session: Any) -> None:
        """`session.update`: voice, instructions, modalities, turn detection, ..."""
        self.send({"type": "session.update", "session": session})

    def send_audio(self, pcm: bytes) -> None:
        """Append audio (PCM16 bytes) to the input buffer."""
        self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})

    def commit(self, *, respond: bool = True) -> None:
        """Commit the input buffer as a user turn, and (by default) ask for a response."""
        self.send({"type": "input_audio_buffer.commit"})
        if respond:
            self.send({"type": "response.create"})

    def clear_audio(self) -> None:
        self.send({"type": "input_audio_buffer.clear"})

    def send_text(self, text: str, *, respond: bool = True) -> None:
        """A user message in text, and (by default) ask for a response."""
        content = [{"type": "input_text", "text": text}]
        item = {"type": "message", "role": "user", "content": content}
        self.send({"type": "conversation.item.create", "item": item})
        if respond:
            self.send({"type": "response.create"})

    def cancel(self) -> None:
        """`response.cancel`: stop the response in progress."""
        self.send({"type": "response.cancel"})

    def recv(self) -> JSON:
        """The next server event."""
        message = self.ws.recv()
        if isinstance(message, bytes):
            raise RealtimeError("the server sent a binary message; events are JSON text")
        try:
            event = json.loads(message)
        except ValueError:
            raise RealtimeError(f"the server sent text, not JSON: {message[:80]!r}") from None
        if not isinstance(event, dict):
            raise RealtimeError(f"the server sent JSON that is not an event: {message[:80]!r}")
        return event

    def __iter__(self) -> Iterator[JSON]:
        """Server events until the server closes the session normally (code 1000)."""
        while True:
            try:
                yield self.recv()
            except RealtimeError as exc:
                if exc.close_code in (1000, 1001):
                    return
                raise

    def events(self, until: str = "response.done") -> Iterator[JSON]:
        """Server events up to and including the first of type `until`."""
        for event in self:
            yield event
            if event.get("type") == until:
                return

    @staticmethod
    def audio(event: Mapping[str, Any]) -> bytes:
        """The PCM16 bytes of a `response.audio.delta` event."""
        return base64.b64decode(event.get("delta") or "")

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> Realtime:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
