"""The one request path under faults: a silent child, a child that stops mid-stream, a bug.

Fault injection only (a scripted child behind the real app, scheduler and child
client; `tests.gateway_harness`): what the official clients see must be each
protocol's own error shape, a 504 when the child stays silent past
`serving.upstream_timeout`, and never a hang or a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.protocols import anthropic as anthropic_protocol
from tests import gateway_harness
from tests.gateway_harness import InProcessGateway, one_chunk_of_a_stream
from tests.loopback import LoopbackHTTP

HI = [{"role": "user", "content": "hi"}]


class Silent(BaseHTTPRequestHandler):
    """Reads the request, then says nothing for longer than any test waits."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(5)

    def log_message(self, *args: Any) -> None:
        pass


class StallsMidStream(BaseHTTPRequestHandler):
    """Starts an event stream, sends one chunk, then goes silent."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        one_chunk_of_a_stream(self)
        time.sleep(5)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True, params=[True, False], ids=["relay", "interpreted"])
def lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each test on both lanes (issue 30): what the clients see is the same."""
    monkeypatch.setattr(gateway_harness, "RELAY", request.param)
    return bool(request.param)


@pytest.fixture
def silent() -> Iterator[InProcessGateway]:
    child = LoopbackHTTP(Silent)
    try:
        with InProcessGateway(child.url, upstream_timeout=0.5) as gateway:
            yield gateway
    finally:
        child.stop()


def test_a_silent_child_is_a_504_in_each_protocols_shape(silent: InProcessGateway) -> None:
    began = time.monotonic()
    oai = openai.OpenAI(base_url=f"{silent.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as failed:
        oai.chat.completions.create(model="tiny", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert failed.value.status_code == 504
    body = failed.value.response.json()["error"]
    assert body["code"] == "upstream_timeout" and "upstream_timeout" in body["message"]

    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=silent.url).chat(model="tiny", messages=HI, stream=False)
    assert refused.value.status_code == 504 and "timed out" in refused.value.error

    claude = anthropic.Anthropic(base_url=silent.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as error:
        claude.messages.create(model="tiny", max_tokens=4, messages=HI)  # type: ignore[arg-type]
    assert error.value.status_code == 504
    assert error.value.response.json()["error"]["type"] == "timeout_error"
    assert time.monotonic() - began < 4, "each timed out after 0.5 s, not after the child's 5 s"


def test_a_child_silent_mid_stream_ends_the_stream_with_an_error() -> None:
    child = LoopbackHTTP(StallsMidStream)
    try:
        with InProcessGateway(child.url, upstream_timeout=0.5) as gateway:
            oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
            stream = oai.chat.completions.create(
                model="tiny",
                messages=HI,  # type: ignore[arg-type]
                stream=True,
            )
            pieces = []
            with pytest.raises(openai.APIError, match="timed out"):
                for chunk in stream:
                    pieces.append(chunk.choices[0].delta.content)
            assert pieces == ["fox"]  # what the child sent reached the client first

            lines = []
            with pytest.raises(ollama.ResponseError, match="timed out"):
                for part in ollama.Client(host=gateway.url).chat(
                    model="tiny", messages=HI, stream=True
                ):
                    lines.append(part.message.content)
            assert lines == ["fox"]
    finally:
        child.stop()


def test_a_bug_in_a_route_is_a_500_in_the_protocols_shape(
    silent: InProcessGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(body: Any, **_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(anthropic_protocol, "messages_request", broken)
    claude = anthropic.Anthropic(base_url=silent.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as error:
        claude.messages.create(model="tiny", max_tokens=4, messages=HI)  # type: ignore[arg-type]
    assert error.value.status_code == 500
    body = error.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "RuntimeError" in body["error"]["message"] and "Traceback" not in str(body)


def test_before_the_first_pass_health_and_unknown_names_say_starting(
    silent: InProcessGateway,
) -> None:
    """serve opens its port before its first pass has built what it serves: /health says
    so (503 `starting`), and a name not known yet is a 503 to retry, not a 404."""
    import httpx

    silent.scheduler.starting = True
    try:
        health = httpx.get(f"{silent.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "starting"
        oai = openai.OpenAI(base_url=f"{silent.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as early:
            oai.completions.create(model="not-yet", prompt="a", max_tokens=1)
        assert early.value.status_code == 503 and early.value.response.headers["Retry-After"]
        assert "starting" in early.value.response.json()["error"]["message"]
    finally:
        silent.scheduler.starting = False
    assert httpx.get(f"{silent.url}/health").json()["status"] == "ok"
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="not-yet", prompt="a", max_tokens=1)
