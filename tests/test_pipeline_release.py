"""The slot goes back however a request ends: the pipeline's one release (`Leased`).

Fault injection only (a scripted child behind the real app, scheduler and child client,
`tests.gateway_harness`). Hypothesis draws the request (chat or completion, whole or
streamed, and a client that hangs up after the first chunk) and what the child does
(answers, refuses with a 500, breaks its stream off, closes the connection unanswered,
sends bytes that are not HTTP, stays silent past `serving.upstream_timeout`); after
every one the model's slots are all free again and the client got an answer or its
error, never a hang. Before the pipeline had one sequence, release was called from
three places behind a flag; this pins that no path is left out.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway_harness import InProcessGateway, runtime
from tests.loopback import LoopbackHTTP
from tests.waiting import wait_until

FAULTS = ("answers", "refuses", "breaks_off", "hangs_up", "garbles", "is_silent")
SCRIPT = {"fault": "answers"}  # what the child does with the next request
SILENCE = 0.3  # serving.upstream_timeout here: the silent child is a 504 this soon


def event(data: dict[str, Any]) -> bytes:
    line = f"data: {json.dumps(data)}\n\n".encode()
    return f"{len(line):x}\r\n".encode() + line + b"\r\n"


class Scripted(BaseHTTPRequestHandler):
    """Does with each request what `SCRIPT` says."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fault = SCRIPT["fault"]
        if fault == "hangs_up":
            self._hang_up()
            return
        if fault == "garbles":
            self.wfile.write(b"HTTP/1.1 two hundred\r\n\x00\x01\r\n\r\n")
            self.wfile.flush()
            self._hang_up()
            return
        if fault == "is_silent":
            time.sleep(SILENCE * 3)
            return
        if fault == "refuses":
            self._json(500, {"error": {"code": 500, "message": "scripted failure"}})
            return
        chat = self.path.endswith("chat/completions")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if not body.get("stream"):
            choice.update({"message": {"role": "assistant", "content": "ok"}} if chat else {})
            choice.update({} if chat else {"text": "ok"})
            self._json(200, {"choices": [choice], "usage": {"prompt_tokens": 1}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = {"delta": {"content": "ok"}} if chat else {"text": "ok"}
        for _ in range(3 if fault == "answers" else 1):
            self.wfile.write(event({"choices": [{"index": 0, **piece, "finish_reason": None}]}))
            self.wfile.flush()
            time.sleep(0.02)  # the chunks arrive apart, as an engine's do
        if fault == "breaks_off":
            self._hang_up()
            return
        done = b"data: [DONE]\n\n"
        self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.connection.shutdown(socket.SHUT_RDWR)  # close() alone leaves the files' hold
        self.close_connection = True

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def gateway() -> Iterator[InProcessGateway]:
    child = LoopbackHTTP(Scripted)
    tiny = runtime("tiny", preflight="off", slots=2)
    try:
        with InProcessGateway(child.url, tiny, upstream_timeout=SILENCE) as gateway:
            yield gateway
    finally:
        child.stop()


def busy_slots(gateway: InProcessGateway) -> int:
    return sum(m.in_flight for p in gateway.scheduler.pools.values() for m in p.members)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    stream=st.booleans(),
    client_hangs_up=st.booleans(),
    fault=st.sampled_from(FAULTS),
)
def test_every_ending_gives_the_slot_back(
    gateway: InProcessGateway, route: str, stream: bool, client_hangs_up: bool, fault: str
) -> None:
    SCRIPT["fault"] = fault
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "stream": stream}
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    port = int(gateway.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        answer = connection.getresponse()
        if client_hangs_up and stream and answer.status == 200:
            answer.read(1)  # the client goes away mid-stream
        else:
            text = answer.read()
            if answer.status == 200 and stream and fault in ("breaks_off", "is_silent"):
                assert b"error" in text  # the stream ends with the envelope's error event
    finally:
        connection.close()
    expected = {"answers": {200}, "refuses": {500}, "is_silent": {504, 200}}
    assert answer.status in expected.get(fault, {200, 502}), (fault, answer.status)
    wait_until(lambda: busy_slots(gateway) == 0, f"the slot back after {fault}", timeout=10)
