"""One error envelope per protocol: the only place a gateway error body is built.

Every route answers its failures through `Envelope.response`: OpenAI's
`{"error": {"message", "type", "param", "code"}}` on `/v1/*`, ollama's
`{"error": "..."}` on `/api/*`, Anthropic's `{"type": "error", "error": {...}}`
on `/v1/messages`, and on the other `/v1/*` paths both protocols share (`/v1/models`)
when the request carries Anthropic's `anthropic-version` header. `for_path` picks
the envelope for a path, `for_request` for a request (the header too), for the
middleware that answers what a route raised and what the router refused
(unknown routes, wrong methods, bodies over the limit). `Envelope.stream_error` is the
same error as the one event that ends a stream cut short once its headers are gone:
OpenAI's `data: {...}`, Anthropic's `event: error`, an ollama NDJSON line.
The bodies themselves come from the translators in `blazar.protocols`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import anthropic, ollama, openai
from blazar.serve.http import TRACE, add_retry_after, trace_id

_ANTHROPIC_TYPES = frozenset(anthropic.STATUS_TYPES.values())


@dataclass(frozen=True)
class Envelope:
    """A protocol's error shape: `body(status, message, code)` and the headers it adds."""

    name: str
    body: Callable[[int, str, str | None], dict[str, Any]]
    event: Callable[[dict[str, Any]], bytes]  # one object as an event of this protocol
    request_id_header: bool = False  # Anthropic's SDK reads `request-id`

    def headers(self, request: web.Request) -> dict[str, str]:
        trace = trace_id(request)
        return {TRACE: trace, "request-id": trace} if self.request_id_header else {TRACE: trace}

    def response(
        self,
        request: web.Request,
        status: int,
        message: str,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> web.Response:
        headers = self.headers(request)
        add_retry_after(headers, retry_after)
        return web.json_response(self.body(status, message, code), status=status, headers=headers)

    def stream_error(self, status: int, message: str, code: str | None = None) -> bytes:
        """The error as the last event of a stream whose headers are gone."""
        return self.event(self.body(status, message, code))


def _anthropic_body(status: int, message: str, code: str | None) -> dict[str, Any]:
    # Only Anthropic's own error types name the type; Blazar's codes (all_slots_busy, ...)
    # would confuse its SDK, which maps types to exception classes.
    return anthropic.error(status, code if code in _ANTHROPIC_TYPES else None, message)


def _sse_data(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


OPENAI = Envelope(
    "openai", lambda status, message, code: openai.error(status, message, code=code), _sse_data
)
OLLAMA = Envelope("ollama", lambda status, message, code: ollama.error(message), ollama.ndjson)
ANTHROPIC = Envelope("anthropic", _anthropic_body, anthropic.sse, request_id_header=True)


ANTHROPIC_VERSION = "anthropic-version"  # every Anthropic SDK request carries it
# OpenAI's own inference paths: OpenAI's shape whatever headers come with them.
_OPENAI_ONLY = ("/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/audio/")


def for_path(path: str) -> Envelope:
    """The envelope of the protocol a path belongs to."""
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/api/"):
        return OLLAMA
    return OPENAI


def wants_anthropic(request: web.Request) -> bool:
    """An Anthropic client on a `/v1/*` path both protocols share (`/v1/models`, or one
    Blazar does not serve): it sends `anthropic-version`, OpenAI's clients never do."""
    return ANTHROPIC_VERSION in request.headers and not request.path.startswith(_OPENAI_ONLY)


def for_request(request: web.Request) -> Envelope:
    """The envelope for a request: its path's (`for_path`), or Anthropic's for an Anthropic
    client on a shared `/v1/*` path."""
    envelope = for_path(request.path)
    if envelope is OPENAI and request.path.startswith("/v1/") and wants_anthropic(request):
        return ANTHROPIC
    return envelope
