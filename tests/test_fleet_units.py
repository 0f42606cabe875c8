"""The fleet's decisions as tables, and its faults behind the real app (`tests.gateway_harness`):
a child that crashes before any byte fails over, one that fails mid-stream does not, a
down remote is never waited on, and an OpenAI-only remote gets the translated request with
the remote's key and the model's name."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import httpx
import ollama
import openai
import pytest

from blazar.protocols import ProtocolError, anthropic
from blazar.serve.request.asks import Plan
from blazar.serve.routes.anthropic_api import MessagesAsk
from blazar.serve.routes.ollama_api import GenerateAsk
from blazar.serve.state.remotes import (
    FLEET,
    FORWARDED,
    Fleet,
    Health,
    Remote,
    base_url,
    next_health,
)
from specs.loader import load_manifest_text
from tests.gateway_harness import InProcessGateway, one_chunk_of_a_stream
from tests.loopback import LoopbackHTTP
from tests.waiting import wait_until

HI = [{"role": "user", "content": "hi"}]
U, D, N = Health.UP, Health.DOWN, Health.UNKNOWN


@pytest.mark.parametrize(
    ("health", "streak", "ok", "after"),
    [
        (N, 0, True, (U, 0)),  # the first answer: up
        (N, 0, False, (N, 1)),  # one failure is not down yet
        (N, 1, False, (D, 0)),  # two in a row are
        (U, 0, False, (U, 1)),
        (U, 1, True, (U, 0)),  # a success in between starts the count again
        (U, 1, False, (D, 0)),
        (D, 0, False, (D, 0)),
        (D, 0, True, (U, 0)),  # one success: up again
    ],
)
def test_health_moves_by_streaks(
    health: Health, streak: int, ok: bool, after: tuple[Health, int]
) -> None:
    assert next_health(health, streak, ok) == after


def fleet_of(text: str) -> Fleet:
    fleet = Fleet()
    fleet.configure(load_manifest_text(text))
    return fleet


MANIFEST = """
[models.m]
source = "file:///m.gguf"
failover = ["b", "a"]

[remotes.a]
url = "http://127.0.0.1:9/v1/"
models = ["big", "m"]

[remotes.b]
url = "https://b.example:11435"
key_env = "B_KEY"
"""


def test_the_fleet_resolves_names_chains_and_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = fleet_of(MANIFEST)
    a, b = fleet.remotes["a"], fleet.remotes["b"]
    assert (a.url, b.url) == ("http://127.0.0.1:9", "https://b.example:11435")
    assert base_url("http://x:1/v1") == "http://x:1" and base_url("http://x:1/") == "http://x:1"
    assert fleet.remote_for("big") is a and fleet.remote_for("big:latest+fox") is a
    assert fleet.remote_for("small") is None
    b.listed = ("small", "big")
    assert fleet.remote_for("small") is b and fleet.remote_for("big") is a  # first by name
    assert fleet.member("m") is b
    b.drained = True
    assert fleet.member("m") is a
    a.note(False, "refused")
    a.note(False, "refused")
    assert a.health is D and a.last_error == "refused" and fleet.member("m") is None
    assert fleet.member("other") is None
    assert [n for n, _ in fleet.listing(lambda n: n == "m")] == ["big", "small"]
    monkeypatch.setenv("B_KEY", "sekrit")
    assert b.headers() == {"Authorization": "Bearer sekrit"} and a.headers() == {}
    # A reload keeps a remote's state when its settings are the same; a changed one is new.
    fleet.configure(load_manifest_text(MANIFEST.replace("https://b.example", "https://c")))
    assert fleet.remotes["a"] is a and fleet.remotes["b"] is not b
    view = fleet.snapshot()
    assert [m["member"] for m in view["chains"]["m"]] == ["b", "a"]
    assert view["chains"]["m"][1]["health"] == "down"


def test_what_an_openai_only_remote_cannot_do_is_a_400_that_says_so() -> None:
    raw_body = {"model": "m", "prompt": "x", "raw": True}
    with pytest.raises(ProtocolError) as raw:
        GenerateAsk("m", "/api/generate", raw_body, endpoint="generate").openai(None)
    assert raw.value.status == 400 and "send messages to /api/chat" in raw.value.message
    body = {"model": "m", "messages": HI, "max_tokens": 8}
    count = MessagesAsk(
        "m", "/v1/messages/count_tokens", body, req=anthropic.count_tokens_request(body)
    )
    with pytest.raises(ProtocolError) as counted:
        count.openai(None)
    assert counted.value.status == 400
    chat = {"model": "m", "messages": HI, "stream": False}
    made = GenerateAsk("m", "/api/chat", chat, endpoint="chat").openai(None)
    assert isinstance(made, Plan) and made.engine.path == "/v1/chat/completions"


# -- faults behind the real app ---------------------------------------------------------


class HangsUp(BaseHTTPRequestHandler):
    """A child that crashes as it is asked: reads the request, closes, says nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


class CutMidStream(BaseHTTPRequestHandler):
    """Starts an event stream, sends one chunk, then hangs up."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        one_chunk_of_a_stream(self)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


class OpenAIOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that answers every chat with "from the remote"."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, dict[str, Any], dict[str, str]]]] = []

    def do_GET(self) -> None:
        body = {"object": "list", "data": [{"id": "m", "object": "model"}]}
        self._json(200 if self.path == "/v1/models" else 404, body)

    def do_POST(self) -> None:
        data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        OpenAIOnly.seen.append((self.path, data, dict(self.headers)))
        message = {"role": "assistant", "content": "from the remote"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [choice],
            "usage": usage,
        }
        self._json(200, answer)

    def _json(self, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def remote() -> Iterator[LoopbackHTTP]:
    OpenAIOnly.seen.clear()
    served = LoopbackHTTP(OpenAIOnly)
    try:
        yield served
    finally:
        served.stop()


def with_chain(gateway: InProcessGateway, url: str, health: Health = U) -> Remote:
    fleet = gateway.app[FLEET]
    member = Remote("r", url, key_env="R_KEY", kind="openai", health=health, timeout=2.0)
    fleet.remotes, fleet.chains = {"r": member}, {"tiny": ("r",)}
    return member


def test_a_child_that_crashes_before_any_byte_fails_over(
    remote: LoopbackHTTP, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("R_KEY", "remote-secret")
    child = LoopbackHTTP(HangsUp)
    try:
        with InProcessGateway(child.url) as gateway:
            member = with_chain(gateway, remote.url)
            oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
            reply = oai.chat.completions.create(model="tiny", messages=HI)
            assert reply.choices[0].message.content == "from the remote"
            said = ollama.Client(host=gateway.url).chat(model="tiny", messages=HI, stream=False)
            assert said.message.content == "from the remote"
            assert member.forwarded == 2
            (path1, body1, head1), (path2, body2, head2) = OpenAIOnly.seen
            assert path1 == path2 == "/v1/chat/completions"
            assert body1["model"] == "tiny" and body2["model"] == "tiny"
            assert head1["Authorization"] == "Bearer remote-secret"
            assert head2[FORWARDED] == "1" and head2["x-request-id"]
    finally:
        child.stop()


def test_a_child_that_fails_mid_stream_does_not_fail_over(remote: LoopbackHTTP) -> None:
    child = LoopbackHTTP(CutMidStream)
    try:
        with InProcessGateway(child.url) as gateway:
            with_chain(gateway, remote.url)
            oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
            stream = oai.chat.completions.create(model="tiny", messages=HI, stream=True)
            with pytest.raises(openai.APIError):
                for _ in stream:
                    pass
            assert OpenAIOnly.seen == []  # bytes had reached the client: no second answer
    finally:
        child.stop()


class OnceAConnection(OpenAIOnly):
    """Answers the first request on a connection as keep-alive, then closes that
    connection when the next request arrives on it, unanswered: what llama-server does
    to a connection that carried a streamed answer, or that sat idle 5 s, when the
    client reuses it before it has seen the close."""

    def do_POST(self) -> None:
        self.answered = getattr(self, "answered", 0) + 1
        if self.answered == 1:
            super().do_POST()
            return
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True  # no byte back


def test_a_remote_closing_a_reused_connection_is_asked_again_anew() -> None:
    OpenAIOnly.seen.clear()
    stale, child = LoopbackHTTP(OnceAConnection), LoopbackHTTP(HangsUp)
    try:
        with InProcessGateway(child.url) as gateway:
            with_chain(gateway, stale.url).listed = ("far",)
            oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
            olla = ollama.Client(host=gateway.url)
            for _ in range(2):  # each second request met a connection the remote closed
                reply = oai.chat.completions.create(model="far", messages=HI)  # as it came
                assert reply.choices[0].message.content == "from the remote"
                said = olla.chat(model="far", messages=HI, stream=False)  # translated
                assert said.message.content == "from the remote"
            assert len(OpenAIOnly.seen) == 4  # each answered once: none was lost or doubled
    finally:
        stale.stop()
        child.stop()


def test_a_down_remote_is_never_waited_on(remote: LoopbackHTTP) -> None:
    child = LoopbackHTTP(HangsUp)
    try:
        with InProcessGateway(child.url) as gateway:
            with_chain(gateway, "http://127.0.0.1:9", health=D)  # down: never tried
            gateway.app[FLEET].remotes["r"].listed = ("far",)
            started = time.monotonic()
            down = httpx.post(f"{gateway.url}/api/chat", json={"model": "far", "messages": HI})
            assert time.monotonic() - started < 1
            assert down.status_code == 503 and "which is down" in down.json()["error"]
            assert down.headers["Retry-After"]
            # the local child crashed and the only member is down: the child's own 502
            failed = httpx.post(
                f"{gateway.url}/v1/chat/completions", json={"model": "tiny", "messages": HI}
            )
            assert failed.status_code == 502 and failed.json()["error"]["code"] == "upstream_error"
    finally:
        child.stop()


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An address whose connects hang: a listener that accepts nothing, its queue full."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    host, port = listener.getsockname()
    fillers = []
    for _ in range(4):  # fill the accept queue; later SYNs are dropped, connects hang
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect((host, port))
        fillers.append(filler)

    def connected() -> list[socket.socket]:  # a finished connect is writable, and no error
        writable = select.select([], fillers, [], 0)[1]
        return [f for f in writable if f.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]

    # with a backlog of 0, one connection the listener has not accepted fills its queue
    wait_until(connected, "a connect that fills the accept queue", timeout=10, every=0.01)
    yield f"http://{host}:{port}"
    for each in [*fillers, listener]:
        each.close()


def test_a_remote_that_does_not_connect_fails_within_its_timeout(blackhole: str) -> None:
    child = LoopbackHTTP(HangsUp)
    try:
        with InProcessGateway(child.url) as gateway:
            member = with_chain(gateway, blackhole, health=N)
            member.timeout = 0.5
            member.listed = ("far",)
            started = time.monotonic()
            failed = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={"model": "far", "messages": HI},
                timeout=10,
            )
            took = time.monotonic() - started
            assert failed.status_code == 502 and 0.4 < took < 3, (failed.text, took)
            assert "did not answer" in failed.json()["error"]["message"]
            assert member.failed == 1
    finally:
        child.stop()


def test_the_prober_marks_a_remote_up_and_learns_its_models(remote: LoopbackHTTP) -> None:
    async def probe() -> Remote:
        fleet = Fleet()
        member = Remote("r", remote.url, timeout=2.0)
        fleet.remotes = {"r": member}
        await fleet.probe(member)  # no /health (404): /v1/models says it answers
        await fleet.close()
        return member

    import asyncio

    member = asyncio.run(probe())
    assert member.health is U and member.kind == "openai" and member.listed == ("m",)
