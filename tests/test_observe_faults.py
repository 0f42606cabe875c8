"""Traces and counters under faults (fault injection only: a scripted child behind the real
app, scheduler and observer, `tests.gateway_harness`): a request refused busy is counted as
a rejection with its reason, and a stream whose child fails after the headers keeps the
failure on its trace."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_harness import InProcessGateway
from tests.loopback import LoopbackHTTP
from tests.test_gateway_faults import StallsMidStream


class Slow(BaseHTTPRequestHandler):
    """Answers a chat request after a second."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(1.0)
        body = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def post(url: str, trace: str, stream: bool = False) -> tuple[int, bytes]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-request-id": trace},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def why(url: str, trace: str) -> dict[str, Any]:
    """The request's trace, once the request has ended: a streamed answer reaches the
    client before the gateway ends its request, and `wait` waits for that end."""
    with urllib.request.urlopen(f"{url}/api/why/{trace}?wait=10", timeout=30) as resp:
        return dict(json.load(resp))


def rejected(url: str, reason: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "blazar_rejected_total" and sample.labels["reason"] == reason:
                return sample.value
    return 0.0


def test_a_busy_refusal_is_counted_with_its_reason() -> None:
    child = LoopbackHTTP(Slow)
    try:
        with InProcessGateway(child.url) as gateway:
            gateway.scheduler.max_queue = 0  # one slot, no queue: a second request is refused
            first, second = uuid.uuid4().hex, uuid.uuid4().hex
            answered: list[int] = []
            worker = threading.Thread(target=lambda: answered.append(post(gateway.url, first)[0]))
            worker.start()
            deadline = time.monotonic() + 10
            while not any(p.in_flight for p in gateway.scheduler.pools.values()):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            status, body = post(gateway.url, second)
            worker.join(timeout=10)
            assert status == 503 and json.loads(body)["error"]["code"] == "all_slots_busy"
            assert answered == [200]
            refused = why(gateway.url, second)
            assert refused["rejected"] == "busy" and refused["code"] == "all_slots_busy"
            assert refused["model"] == "tiny" and refused["instance"] is None
            assert why(gateway.url, first)["rejected"] is None
            assert rejected(gateway.url, "busy") == 1
    finally:
        child.stop()


def test_a_stream_that_fails_after_its_headers_keeps_the_failure() -> None:
    child = LoopbackHTTP(StallsMidStream)
    try:
        with InProcessGateway(child.url, upstream_timeout=0.5) as gateway:
            trace = uuid.uuid4().hex
            status, body = post(gateway.url, trace, stream=True)
            assert status == 200 and b"timed out" in body  # the error event, headers long gone
            record = why(gateway.url, trace)
            assert record["stream"] is True and record["status"] == 504
            assert record["code"] == "upstream_timeout" and "timed out" in record["error"]
            assert record["output"]["excerpt"] == "fox"  # what reached the client
    finally:
        child.stop()
