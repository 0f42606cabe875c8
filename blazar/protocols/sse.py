"""Decode and encode server-sent events, incrementally and without I/O.

llama-server streams `/v1/chat/completions`, `/completion` and `/v1/messages` as
server-sent events: `event:` lines (Anthropic's endpoint only), `data:` lines with
one JSON object each, a blank line between events, and `data: [DONE]` at the end of
the OpenAI streams. The gateway feeds the bytes it reads from a child into
`SSEDecoder.feed` as they arrive (they may split anywhere) and hands each decoded
event to a protocol's stream translator. `encode` writes an event back out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["DONE", "SSEDecoder", "SSEEvent", "encode"]

DONE = "[DONE]"


@dataclass(frozen=True)
class SSEEvent:
    """One event: its `event:` name (None when absent) and its `data:` payload.

    `data` is the parsed JSON object, or the string `DONE` for `data: [DONE]`, or the
    raw text when the payload is not JSON.
    """

    event: str | None
    data: Any


class SSEDecoder:
    """Splits a byte stream into events; keeps an incomplete tail for the next feed."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add bytes; return the events they complete."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                return events
            line = self._buffer[:newline].rstrip(b"\r").decode("utf-8")
            self._buffer = self._buffer[newline + 1 :]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def close(self) -> list[SSEEvent]:
        """End of stream: flush an event that lacked its closing blank line."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(self._dispatch())
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch() if self._data else None
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> SSEEvent:
        text = "\n".join(self._data)
        event, self._event, self._data = self._event, None, []
        if text == DONE:
            return SSEEvent(event, DONE)
        try:  # orjson: each streamed token is one of these, on the request path
            return SSEEvent(event, orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
        try:  # what orjson refuses and json takes (NaN)
            return SSEEvent(event, json.loads(text))
        except json.JSONDecodeError:
            return SSEEvent(event, text)


def encode(data: Any, event: str | None = None) -> bytes:
    """One event as bytes: an optional `event:` line, a `data:` line and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
