"""`GET /v1/models` and `GET /v1/models/{id}` in OpenAI's shapes and in Anthropic's.

Both APIs serve their model listing at the same path; the gateway
(`blazar.serve.routes.openai_api`) answers in Anthropic's shapes when the request carries
`anthropic-version` (every Anthropic SDK request does, no OpenAI client does) and
in OpenAI's otherwise. It passes plain values in: each served name with the
model's context size, and the gateway's start time as the creation time (a
served model has no other). Pure: no I/O, no clock.

- OpenAI: `{"id", "object": "model", "created", "owned_by"}`; the list is
  `{"object": "list", "data": [...]}`.
- Anthropic: `{"type": "model", "id", "display_name", "created_at" (RFC 3339),
  "lifecycle": "active", "max_input_tokens"}`; the list is one page `{"data",
  "has_more", "first_id", "last_id"}` cut by `limit`, `after_id`, `before_id`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blazar.protocols import ProtocolError

__all__ = ["ServedName", "anthropic_model", "anthropic_page", "openai_list", "openai_model"]


@dataclass(frozen=True)
class ServedName:
    """One name a model is served under (its own or an alias) and its context size."""

    name: str
    ctx: int
    remote: str | None = None  # served from this remote (`[remotes.NAME]`)


def openai_model(served: ServedName, created: int) -> dict[str, Any]:
    out: dict[str, Any] = {"id": served.name, "object": "model", "created": created}
    out["owned_by"] = "blazar"
    if served.remote is not None:  # another Blazar's fleet probe leaves these out
        out["blazar_remote"] = served.remote
    return out


def openai_list(names: Sequence[ServedName], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [openai_model(n, created) for n in names]}


def anthropic_model(served: ServedName, created_at: str) -> dict[str, Any]:
    return {
        "type": "model",
        "id": served.name,
        "display_name": served.name,
        "created_at": created_at,
        "lifecycle": "active",
        "max_input_tokens": served.ctx,
    }


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        raise ProtocolError(400, f"limit: must be an integer from 1 to 1000, got {value!r}")
    return limit


def _position(ids: list[str], key: str, value: str) -> int:
    if value not in ids:
        raise ProtocolError(400, f"{key}: no model '{value}' is served here")
    return ids.index(value)


def anthropic_page(
    names: Sequence[ServedName], created_at: str, query: Mapping[str, str]
) -> dict[str, Any]:
    """One page of the Anthropic listing; `query` holds `limit`, `after_id`, `before_id`."""
    limit = _limit(query.get("limit"))
    ids = [n.name for n in names]
    start, end = 0, len(names)
    if query.get("after_id"):
        start = _position(ids, "after_id", query["after_id"]) + 1
    if query.get("before_id"):
        end = _position(ids, "before_id", query["before_id"])
        start = max(start, end - limit)
    page = [anthropic_model(n, created_at) for n in names[start:end][:limit]]
    more = (start + len(page) < end) if not query.get("before_id") else start > 0
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
