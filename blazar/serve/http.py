"""Small HTTP helpers every gateway route shares: trace ids, Retry-After, JSON bodies, times.

Used by the route modules (`openai_api`, `ollama_api`, `ollama_admin`,
`ollama_pull`, `anthropic_api`, `blazar_api`), by `pipeline` and by the
middlewares `app` installs. No route logic lives here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError

TRACE = "x-request-id"  # the header a client may send and every response carries
PRIORITY = "x-blazar-priority"
TRACE_KEY = web.RequestKey("trace", str)
# The name (never the secret) of the API key a request authenticated with, set by the
# access middleware; absent when keys are off. Traces and logs record this, nothing else.
KEY_NAME = web.RequestKey("key_name", str)


def trace_id(request: web.Request) -> str:
    """The request's trace id: the client's `x-request-id`, or a new one (kept per request)."""
    trace = request.get(TRACE_KEY)
    if trace is None:
        trace = request[TRACE_KEY] = request.headers.get(TRACE) or uuid.uuid4().hex
    return trace


def wants_priority(request: web.Request) -> bool:
    """`x-blazar-priority: high` puts the request at the front of its model's queue."""
    return request.headers.get(PRIORITY, "").lower() == "high"


def add_retry_after(headers: MutableMapping[str, str], retry_after: float | None) -> None:
    """A 503 says when to retry, in whole seconds, at least one."""
    if retry_after is not None:
        headers["Retry-After"] = str(int(max(1, retry_after)))


def now_rfc3339() -> str:
    """The gateway's clock as ollama writes it (UTC, microseconds, `Z`)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a ProtocolError(400) that says what is wrong."""
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError as exc:
        raise ProtocolError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(400, "the request body must be a JSON object")
    return body


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object (see `parse_json_object`)."""
    return parse_json_object(await request.read())


def name_in(body: dict[str, Any], *keys: str) -> str:
    """The first of `keys` that holds a non-empty string (ollama takes `model` or `name`)."""
    for key in keys:
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
    raise ProtocolError(400, f"{keys[0]} is required")
