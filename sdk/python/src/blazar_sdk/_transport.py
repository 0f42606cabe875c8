"""HTTP for the SDK, on `urllib.request`: JSON calls, streamed answers, SSE and JSON Lines.

`Transport` is what `Client` (and `Batches`) send through: the base URL, the key
(sent as `Authorization: Bearer`, which every Blazar route takes) and the timeout
(of the connection and of each read, so a stream may run longer as long as data
keeps coming). An error status becomes the matching `blazar_sdk.errors` class;
a refused or dead connection an `APIConnectionError` that says what to run.
urllib rather than `http.client` by hand: it brings proxies from the environment
and HTTPS with the system's certificates, and a local gateway gains nothing a
connection pool would save (a loopback connect is tens of microseconds).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from http.client import HTTPResponse
from typing import Any, Optional

from blazar_sdk.errors import APIConnectionError, APITimeoutError, from_event, from_response

Query = Mapping[str, Optional[object]]


class Answer:
    """A whole answer: its decoded JSON body and the trace id it carried."""

    def __init__(self, body: Any, trace_id: str | None) -> None:
        self.body = body
        self.trace_id = trace_id


class Transport:
    """Requests to one gateway; shared by a `Client` and its sub-APIs."""

    def __init__(self, url: str, key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self._opener = urllib.request.build_opener()

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        out = {"Accept": "application/json", "User-Agent": "blazar-sdk"}
        if self.key:
            out["Authorization"] = f"Bearer {self.key}"
        out.update(extra or {})
        return out

    def _url(self, path: str, query: Query | None) -> str:
        url = self.url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        return url + ("?" + urllib.parse.urlencode(params) if params else "")

    def open(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Query | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HTTPResponse:
        """Send a request; the open response (the caller reads and closes it)."""
        data = None if body is None else json.dumps(body).encode()
        all_headers = self.headers(headers)
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            self._url(path, query), data=data, method=method, headers=all_headers
        )
        try:
            response: HTTPResponse = self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                raise from_response(exc.code, exc.read(), dict(exc.headers.items())) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, socket.timeout):
                raise self._timed_out(method, path) from None
            raise APIConnectionError(
                f"cannot reach Blazar at {self.url} ({exc.reason}): start it with "
                "`blazar serve`, or point BLAZAR_URL at a running gateway"
            ) from None
        except (socket.timeout, TimeoutError):
            raise self._timed_out(method, path) from None
        return response

    def _timed_out(self, method: str, path: str) -> APITimeoutError:
        return APITimeoutError(
            f"{method} {self.url}{path}: no answer within {self.timeout:g} s; pass a larger "
            "Client(timeout=...) for slow models"
        )

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Query | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Send a request and read its JSON answer whole."""
        with self.open(method, path, body, query=query, headers=headers) as response:
            try:
                payload = response.read()
            except (socket.timeout, TimeoutError):
                raise self._timed_out(method, path) from None
            trace = response.headers.get("x-request-id")
        if not payload:
            return Answer(None, trace)
        try:
            return Answer(json.loads(payload), trace)
        except ValueError:
            return Answer(payload.decode("utf-8", errors="replace"), trace)


def lines(response: HTTPResponse) -> Iterator[bytes]:
    """The response's lines as they arrive, without their line endings."""
    while True:
        try:
            line = response.readline()
        except (socket.timeout, TimeoutError):
            raise APITimeoutError("the stream sent nothing within the client's timeout") from None
        if not line:
            return
        yield line.rstrip(b"\r\n")


def sse_events(response: HTTPResponse) -> Iterator[Any]:
    """Server-sent events' `data` payloads, decoded, until `[DONE]` or the end; an error
    event (`{"error": ...}` after a 200) is raised as its `APIError`."""
    trace = response.headers.get("x-request-id")
    data: list[bytes] = []
    for line in _with_end(lines(response)):
        if line is not None and line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
            continue
        if line or not data:  # None (the end) ends a pending event as a blank line does
            continue  # `event:`, `id:`, comments; or a blank line with nothing pending
        payload, data = b"\n".join(data), []
        if payload == b"[DONE]":
            return
        event = json.loads(payload)
        if isinstance(event, dict) and "error" in event and "choices" not in event:
            raise from_event(event, trace)
        yield event


def _with_end(source: Iterator[bytes]) -> Iterator[bytes | None]:
    """The lines, then None: the end of the stream ends a pending event as a blank line."""
    yield from source
    yield None


def json_lines(response: HTTPResponse) -> Iterator[Any]:
    """JSON Lines (one object per line), as they arrive."""
    for line in lines(response):
        if line.strip():
            yield json.loads(line)
