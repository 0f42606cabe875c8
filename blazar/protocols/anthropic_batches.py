"""Anthropic's Message Batches API: the shapes of `/v1/messages/batches`, pure.

The gateway (`blazar.serve.routes.batches_api`, `blazar.serve.request.batches`) parses
a create request with `batch_requests` (every request's `params` checked as
`/v1/messages` checks them, before the batch is accepted: one bad request refuses the
whole batch, naming its `custom_id`), answers with `batch_object` and `page`, and
writes each request's result as `result_line` of the JSON Lines `results_url` serves:
`succeeded` with the message, `errored` with the error in Anthropic's envelope,
`canceled` or `expired`. Times are given in (epoch seconds); nothing here reads a clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from blazar.protocols import ProtocolError
from blazar.protocols.anthropic import messages_request
from blazar.protocols.anthropic_stream import STATUS_TYPES, error

IN_PROGRESS, CANCELING, ENDED = "in_progress", "canceling", "ended"
# A request's state; all but QUEUED are the `result.type` Anthropic's results carry.
QUEUED, SUCCEEDED, ERRORED, CANCELED, EXPIRED = (
    "queued",
    "succeeded",
    "errored",
    "canceled",
    "expired",
)
RESULTS = (SUCCEEDED, ERRORED, CANCELED, EXPIRED)
MAX_REQUESTS = 100_000  # Anthropic's limit per batch
CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
PAGE_DEFAULT, PAGE_MAX = 20, 1000
ITEM_FIELDS = frozenset({"custom_id", "params"})


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


@dataclass(frozen=True)
class Request:
    """One request of a batch, as accepted: its name and its Messages API body."""

    custom_id: str
    params: dict[str, Any]


def batch_requests(body: Mapping[str, Any]) -> list[Request]:
    """A create request's `requests`, each checked as `/v1/messages` would check it; the
    first problem refuses the batch (400) and names the request's index and custom_id."""
    extra = sorted(set(body) - {"requests"})
    if extra:
        raise _bad(f"{extra[0]}: Extra inputs are not permitted (a batch takes only 'requests')")
    items = body.get("requests")
    if not isinstance(items, list) or not items:
        raise _bad("requests: a non-empty list of {custom_id, params} is required")
    if len(items) > MAX_REQUESTS:
        raise _bad(f"requests: at most {MAX_REQUESTS} requests in one batch, got {len(items)}")
    out: list[Request] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"requests[{index}]"
        if not isinstance(item, Mapping):
            raise _bad(f"{where}: expected an object with custom_id and params")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            raise _bad(
                f"{where}.custom_id: 1 to 64 letters, digits, '-' or '_' are required, "
                f"got {custom_id!r}"
            )
        where = f"{where} (custom_id {custom_id!r})"
        if custom_id in seen:
            raise _bad(f"{where}: custom_id is used twice; each request needs its own")
        seen.add(custom_id)
        extra = sorted(set(item) - ITEM_FIELDS)
        if extra:
            raise _bad(f"{where}: {extra[0]}: Extra inputs are not permitted")
        params = item.get("params")
        if not isinstance(params, Mapping):
            raise _bad(f"{where}.params: a Messages API request (model, max_tokens, messages)")
        if params.get("stream"):
            raise _bad(f"{where}.params.stream: a batch's requests are not streamed")
        try:
            messages_request(params, has_vision=True)
        except ProtocolError as exc:
            raise ProtocolError(exc.status, f"{where}.params.{exc.message}", exc.code) from None
        out.append(Request(custom_id, dict(params)))
    return out


def iso(moment: float | None) -> str | None:
    """RFC 3339 in UTC with a `Z`, as Anthropic writes its times."""
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def epoch(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def request_counts(states: Sequence[str]) -> dict[str, int]:
    """Anthropic's `request_counts`: queued and running requests count as `processing`."""
    counts = dict.fromkeys(("processing", *RESULTS), 0)
    for state in states:
        counts[state if state in RESULTS else "processing"] += 1
    return counts


def batch_object(
    batch_id: str,
    status: str,
    states: Sequence[str],
    *,
    created_at: float,
    expires_at: float,
    ended_at: float | None,
    cancel_initiated_at: float | None,
    base_url: str,
) -> dict[str, Any]:
    """A `message_batch` object; `results_url` (on `base_url`) once it has ended."""
    ended = status == ENDED
    return {
        "id": batch_id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": request_counts(states),
        "ended_at": iso(ended_at),
        "created_at": iso(created_at),
        "expires_at": iso(expires_at),
        "archived_at": None,
        "cancel_initiated_at": iso(cancel_initiated_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch_id}/results" if ended else None,
    }


def page_bounds(query: Mapping[str, str]) -> tuple[int, str | None, str | None]:
    """(limit, before_id, after_id) of a list request; 400 for a limit out of range."""
    raw = query.get("limit")
    try:
        limit = PAGE_DEFAULT if raw is None else int(raw)
    except ValueError:
        raise _bad(f"limit: expected a whole number from 1 to {PAGE_MAX}, got {raw!r}") from None
    if not 1 <= limit <= PAGE_MAX:
        raise _bad(f"limit: expected a whole number from 1 to {PAGE_MAX}, got {limit}")
    before, after = query.get("before_id"), query.get("after_id")
    if before and after:
        raise _bad("before_id and after_id cannot both be given")
    return limit, before or None, after or None


def page(
    ids: Sequence[str], limit: int, before_id: str | None, after_id: str | None
) -> tuple[list[str], bool]:
    """The ids of one page of a list (`ids` newest first) and whether more follow in the
    direction asked: after `after_id` (older ones), before `before_id` (newer ones)."""
    if after_id is not None:
        start = ids.index(after_id) + 1 if after_id in ids else len(ids)
        chosen = list(ids[start : start + limit])
        return chosen, start + limit < len(ids)
    if before_id is not None:
        end = ids.index(before_id) if before_id in ids else 0
        begin = max(0, end - limit)
        return list(ids[begin:end]), begin > 0
    return list(ids[:limit]), len(ids) > limit


def list_body(objects: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "data": objects,
        "has_more": has_more,
        "first_id": objects[0]["id"] if objects else None,
        "last_id": objects[-1]["id"] if objects else None,
    }


def succeeded(message: Any) -> dict[str, Any]:
    return {"type": SUCCEEDED, "message": message}


def errored(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """An errored result: the error as Anthropic's envelope (`{"type": "error", ...}`)."""
    known = code if code in STATUS_TYPES.values() else None  # Blazar's codes confuse SDKs
    return {"type": ERRORED, "error": error(status, known, message)}


def result_line(custom_id: str, result: Mapping[str, Any]) -> bytes:
    """One line of the results file."""
    return orjson.dumps({"custom_id": custom_id, "result": result}) + b"\n"
