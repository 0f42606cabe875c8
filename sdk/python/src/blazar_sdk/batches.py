"""`Client.batches`: Anthropic's Message Batches API on the gateway (`/v1/messages/batches`).

The shapes are Anthropic's: `create` takes `requests`, each `{"custom_id",
"params"}` where `params` is a Messages API request; a batch is a
`message_batch` object (`processing_status` `in_progress`, `canceling` or
`ended`, `request_counts`, `results_url`, ...); `results` are JSON Lines, one
`{"custom_id", "result": {"type": "succeeded" | "errored" | "canceled" |
"expired", ...}}` per request. Requests carry `anthropic-version`, so errors
come in Anthropic's envelope. The gateway runs a batch's requests in the
background at low priority and keeps them across restarts (docs/compatibility.md).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from blazar_sdk._transport import Query, Transport, json_lines
from blazar_sdk.errors import BlazarError
from blazar_sdk.types import JSON

__all__ = ["ANTHROPIC_VERSION", "ROUTES", "Batches", "check_requests"]

PATH = "/v1/messages/batches"
ANTHROPIC_VERSION = "2023-06-01"
# Each call's method and path (Anthropic's: tests/test_batches.py reads them out of the
# official `anthropic` package and compares). `results` follows the batch's `results_url`.
ROUTES = {
    "create": ("POST", PATH),
    "get": ("GET", PATH + "/{id}"),
    "list": ("GET", PATH),
    "results": ("GET", PATH + "/{id}/results"),
    "cancel": ("POST", PATH + "/{id}/cancel"),
    "delete": ("DELETE", PATH + "/{id}"),
}


def check_requests(requests: Sequence[Mapping[str, Any]]) -> list[JSON]:
    """The batch's requests, checked for what every one needs before anything is sent."""
    if isinstance(requests, (str, bytes)) or not requests:
        raise ValueError("requests: expected a non-empty list of {custom_id, params}")
    out, seen = [], set()
    for i, request in enumerate(requests):
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError(f"requests[{i}]: needs a custom_id (a string naming its result)")
        if custom_id in seen:
            raise ValueError(f"requests[{i}]: custom_id {custom_id!r} is used twice")
        seen.add(custom_id)
        params = request.get("params")
        if not isinstance(params, Mapping) or "model" not in params:
            raise ValueError(
                f"requests[{i}]: params must be a Messages request (model, max_tokens, messages)"
            )
        out.append({"custom_id": custom_id, "params": dict(params)})
    return out


class Batches:
    """Message batches: `create`, `get`, `list`, `results`, `cancel`, `delete`."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._headers = {"anthropic-version": ANTHROPIC_VERSION}

    def _call(
        self, route: str, batch_id: str = "", body: Any = None, query: Query | None = None
    ) -> JSON:
        method, path = ROUTES[route]
        path = path.format(id=urllib.parse.quote(batch_id, safe=""))
        answer = self._transport.call(method, path, body, query=query, headers=self._headers)
        return dict(answer.body or {})

    def create(self, requests: Sequence[Mapping[str, Any]]) -> JSON:
        """Submit a batch; the `message_batch` object (`processing_status: in_progress`)."""
        return self._call("create", body={"requests": check_requests(requests)})

    def get(self, batch_id: str) -> JSON:
        """A batch's `message_batch` object: its status and request counts."""
        return self._call("get", batch_id)

    def list(
        self, *, limit: int | None = None, before_id: str | None = None, after_id: str | None = None
    ) -> JSON:
        """A page of batches, newest first: `{data, has_more, first_id, last_id}`."""
        query = {"limit": limit, "before_id": before_id, "after_id": after_id}
        return self._call("list", query=query)

    def results(self, batch_id: str) -> Iterator[JSON]:
        """An ended batch's results, one `{custom_id, result}` per request, as they stream.
        Read from the batch's `results_url` (its path, on this client's gateway), as
        Anthropic's client does; a batch without one has not ended."""
        batch = self.get(batch_id)
        url = batch.get("results_url")
        if not url:
            status = batch.get("processing_status")
            raise BlazarError(
                f"batch {batch_id!r} has no results yet (processing_status {status!r}): wait "
                "until it has ended (batches.get(...)['processing_status'] == 'ended')"
            )
        parts = urllib.parse.urlsplit(str(url))  # never another host: it would get the key
        path = parts.path + ("?" + parts.query if parts.query else "")
        with self._transport.open("GET", path, headers=self._headers) as response:
            yield from json_lines(response)

    def cancel(self, batch_id: str) -> JSON:
        """Ask to cancel a batch; it goes `canceling`, then `ended`."""
        return self._call("cancel", batch_id)

    def delete(self, batch_id: str) -> JSON:
        """Delete an ended batch and its results."""
        return self._call("delete", batch_id)
