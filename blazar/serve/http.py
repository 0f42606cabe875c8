"""Small HTTP helpers every gateway route shares: trace ids, Retry-After, JSON bodies, times.

Used by the route modules (`openai_api`, `ollama_api`, `ollama_admin`,
`ollama_pull`, `anthropic_api`, `blazar_api`), by `pipeline` and by the
middlewares `app` installs. No route logic lives here.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.store.db import storable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TRACE = "x-request-id"  # the header a client may send and every response carries
PRIORITY = "x-blazar-priority"
TRACE_KEY = web.RequestKey("trace", str)
# The name (never the secret) of the API key a request authenticated with, set by the
# access middleware; absent when keys are off. Traces and logs record this, nothing else.
KEY_NAME = web.RequestKey("key_name", str)


# New trace ids: 32 hex digits, a random half per process and a counter (uuid4 asks the
# kernel for randomness on every request: a system call on the hot path). Unique on this
# host across restarts; they name requests, they guard nothing.
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count(int.from_bytes(os.urandom(4)))


def new_trace_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


MAX_TRACE_ID = 256  # characters of a client's x-request-id kept (a UUID has 36)


def header_text(value: str, limit: int = MAX_TRACE_ID) -> str:
    """A header's value as text any record can hold: decided here, where it arrives.

    aiohttp decodes header bytes as UTF-8 with surrogateescape, so a byte that is not
    UTF-8 (HTTP allows 0x80-0xFF in a field value) arrives as a lone surrogate, which
    SQLite, orjson and a UTF-8 log refuse later, far from here (one 0xFF in an
    x-request-id once cost a whole second of traces), and which aiohttp leaves out when
    it writes the header back. Such a byte becomes the text `\\xff`, and a character
    that does not print (a tab) its escape (`\\t`); text that is well formed, what
    clients match on, is kept as it is. At most `limit` characters are kept.
    """
    if value.isprintable() and len(value) <= limit:
        return value
    text = str(storable(value[: limit * 4]))  # a byte that was not UTF-8: `\xNN`, as stored
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)[:limit]


def _escape(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def trace_id(request: web.Request) -> str:
    """The request's trace id: the client's `x-request-id` (as `header_text` makes it), or
    a new one; kept per request, so the response header carries what the trace records."""
    trace = request.get(TRACE_KEY)
    if trace is None:
        sent = request.headers.get(TRACE)
        trace = request[TRACE_KEY] = header_text(sent) if sent else new_trace_id()
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


MAX_JSON_DEPTH = 128  # nesting levels a request body may have; real ones use a few dozen
# Every byte but the structural ones (brackets, quotes): deleted before the depth count.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"')
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON text nests deeper than `limit`, found without parsing it.

    A few passes of C-speed bytes methods, so the pass-through stays cheap: drop escaped
    backslashes and quotes, keep only brackets and quotes, drop what lies inside strings,
    then strip innermost bracket pairs one level per pass. Text that is not JSON may be
    counted loosely; the parser refuses it anyway, and never recurses past the limit.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:  # too few brackets, in strings or not
        return False
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"")
    if b'\\"' in raw:
        raw = raw.replace(b'\\"', b"")
    shape = raw.translate(None, _NOT_STRUCTURAL)
    if b'"' in shape:
        shape = b"".join(shape.split(b'"')[::2])
    shape = shape.translate(_BRACKETS)
    for depth in range(limit):
        if not shape:
            return False
        inner = shape.replace(b"()", b"")
        if inner == shape:  # unbalanced: the opening brackets left may all nest
            return depth + shape.count(b"(") > limit
        shape = inner
    return bool(shape)


def _not_finite(token: str) -> float:
    raise ValueError(f"{token} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


_LONG_NUMBER = re.compile(rb"[0-9]{19}")
# One decoder for every body (json.loads with hooks would build one per call).
_DECODER = json.JSONDecoder(parse_constant=_not_finite, parse_float=_finite)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a ProtocolError(400) that says what is wrong.

    Refused before any recursion can fail: nesting deeper than MAX_JSON_DEPTH. Refused
    as JSON itself does: NaN, Infinity, and numbers too large for a float (1e999).
    """
    if json_depth_exceeds(raw):
        raise ProtocolError(
            400,
            f"the request body nests deeper than {MAX_JSON_DEPTH} levels; flatten it",
            "invalid_json",
        )
    body: Any = None
    if raw and not _LONG_NUMBER.search(raw):
        # orjson is several times faster, and refuses what JSON does not allow as the
        # decoder below does; it reads integers past 64 bits as floats, so a body with
        # digits that long, and whatever orjson refuses, go to the decoder.
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            return body
    try:
        body = None if not raw or raw.isspace() else _DECODER.decode(raw.decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(
            400, f"the request body is not valid JSON: {exc}", "invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ProtocolError(400, "the request body must be a JSON object", "invalid_json")
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
