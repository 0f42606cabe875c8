"""A request's end as an event: `/api/why/{id}?wait=SECONDS` waits for a request that has not
ended yet, so a client that asks for its trace right after its answer never races it.

The race this pins: a streamed answer's last byte reaches the client before the gateway's
middleware ends the request, so `/api/why/{id}` asked at once could be a 404; tests slept
50 ms and hoped. Here a scripted child (fault injection: it holds the stream open until the
test lets it finish) keeps the request in flight for as long as the test needs, so each
step is deterministic: asked while in flight, the trace is a 404 without `wait` and a
pending wait with it, which the request's end answers with the finished trace.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway_harness import InProcessGateway, one_chunk_of_a_stream, runtime
from tests.loopback import LoopbackHTTP
from tests.waiting import wait_until

RELEASE = threading.Event()  # the held stream ends once the test sets it
TINY = runtime("tiny", preflight="off")  # the child answers the request's call, nothing else


class HeldStream(BaseHTTPRequestHandler):
    """Starts an OpenAI event stream ("fox"), holds it open until `RELEASE`, then ends it."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        one_chunk_of_a_stream(self)
        RELEASE.wait(30)
        data = b"data: [DONE]\n\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[InProcessGateway]:
    RELEASE.clear()
    child = LoopbackHTTP(HeldStream)
    try:
        with InProcessGateway(child.url, TINY) as gateway:
            yield gateway
    finally:
        RELEASE.set()
        child.stop()


def start_stream(url: str, trace: str) -> Any:
    """A streamed chat request, read up to its first chunk: in flight, held by the child."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-request-id": trace},
    )
    resp = urllib.request.urlopen(request, timeout=30)
    while b"fox" not in resp.readline():
        pass
    return resp


def why(url: str, trace: str, wait: str | None = None) -> tuple[int, dict[str, Any]]:
    query = "" if wait is None else f"?wait={wait}"
    try:
        with urllib.request.urlopen(f"{url}/api/why/{trace}{query}", timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_why_with_wait_answers_once_the_request_has_ended(gateway: InProcessGateway) -> None:
    trace = uuid.uuid4().hex
    stream = start_stream(gateway.url, trace)
    try:
        assert why(gateway.url, trace)[0] == 404  # in flight: not ended, no trace yet
        answered: list[tuple[int, dict[str, Any]]] = []
        asker = threading.Thread(target=lambda: answered.append(why(gateway.url, trace, "10")))
        asker.start()
        observer = gateway.services.observer
        wait_until(lambda: trace in observer._waiting, "the why request waits for the end", 10)
        assert not answered  # the child still holds the stream: nothing to answer yet
        RELEASE.set()
        assert stream.read().endswith(b"data: [DONE]\n\n")
    finally:
        stream.close()
    asker.join(timeout=10)
    [(status, record)] = answered
    assert status == 200 and record["id"] == trace and record["status"] == 200
    assert record["stream"] is True and record["output"]["excerpt"] == "fox"


def test_the_observers_wait_is_answered_by_the_end_itself(gateway: InProcessGateway) -> None:
    """In process, without HTTP: `find(id, wait=...)` registers before it searches, so an
    end that comes while it waits answers it (nothing is polled, nothing times out)."""
    trace = uuid.uuid4().hex
    stream = start_stream(gateway.url, trace)
    observer = gateway.services.observer
    try:
        found = asyncio.run_coroutine_threadsafe(observer.find(trace, wait=30), gateway.loop)
        # Scheduled after it, this runs once `find` has registered and awaits the end.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), gateway.loop).result(10)
        assert not found.done()
        RELEASE.set()
        stream.read()
    finally:
        stream.close()
    record = found.result(10)
    assert record is not None and record["id"] == trace and record["status"] == 200
    assert not observer._waiting  # nobody is left waiting


@pytest.fixture(scope="module")
def answered() -> Iterator[tuple[InProcessGateway, str]]:
    """A gateway with one finished streamed request: its id."""
    RELEASE.set()
    child = LoopbackHTTP(HeldStream)
    try:
        with InProcessGateway(child.url, TINY) as gateway:
            trace = uuid.uuid4().hex
            start_stream(gateway.url, trace).close()
            assert why(gateway.url, trace, "10")[0] == 200
            yield gateway, trace
    finally:
        child.stop()


WAITS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-1000, max_value=1000).map(str),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-0", "1e3", "60", "60.0001", "0x10", " 5", "5 "]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(WAITS)
def test_any_wait_is_a_number_of_seconds_up_to_a_minute_or_a_400(
    answered: tuple[InProcessGateway, str], wait: str
) -> None:
    gateway, trace = answered
    quoted = urllib.parse.quote(wait, safe="")
    status, body = why(gateway.url, trace, quoted)
    try:
        seconds = float(wait)
    except ValueError:
        seconds = float("nan")
    if 0 <= seconds <= 60:
        assert status == 200 and body["id"] == trace  # ended long ago: no wait at all
    else:
        assert status == 400 and "wait must be" in str(body["error"])
