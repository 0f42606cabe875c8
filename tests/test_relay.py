"""The relay lane against a real `blazar serve` and llama-server child (issue 30).

Each test runs on both lanes (`serving.relay` true and false): what a client sees is the
same, whichever carried it. The relay's answers carry no `Server` header (aiohttp adds
its own), which is how a test knows which lane answered. Keep-alive with requests of
both lanes on one connection, pipelined requests, `Expect: 100-continue`, a client
that goes away mid-stream (the child stops generating), traces and `blazar why`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from blazar.testing.tiny import write_tiny_model
from tests.fixtures import ENGINE, WHEELS
from tests.serving import (
    Served,
    assert_generation_cancelled,
    tokens_in_progress,
    tokens_predicted,
)

HI = [{"role": "user", "content": "hi"}]


class Lane:
    def __init__(self, served: Served, relay: bool) -> None:
        self.served, self.relay = served, relay
        self.url = served.url
        self.openai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)

    def relayed(self, headers: Any) -> bool:
        return "server" not in {k.lower() for k in headers}


@pytest.fixture(scope="module", params=[True, False], ids=["relay", "interpreted"])
def lane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lane]:
    root = tmp_path_factory.mktemp("relay")
    tiny = write_tiny_model(root / "tiny.gguf", n_ctx_train=4096)
    relay = "true" if request.param else "false"
    text = f"[serving]\nrelay = {relay}\n\n" + ENGINE
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 4096\n\n'
    text += f'[models.capped]\nsource = "{tiny.as_uri()}"\nctx = 4096\nmax_tokens = 7\n\n'
    manifest = root / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with Served(manifest, home) as served:
            yield Lane(served, request.param)


def test_whole_and_streamed_chat_through_the_sdk(lane: Lane) -> None:
    raw = lane.openai.chat.completions.with_raw_response.create(
        model="tiny", messages=HI, max_tokens=4, extra_headers={"x-request-id": "relay-1"}
    )
    answer = raw.parse()
    assert answer.model == "tiny" and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert raw.headers["x-request-id"] == "relay-1"
    assert raw.headers["x-blazar-spec"] == "off"
    assert lane.relayed(raw.headers) is lane.relay
    stream = lane.openai.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    why = httpx.get(f"{lane.url}/api/why/relay-1?wait=5", timeout=30).json()
    assert why["model"] == "tiny" and why["status"] == 200, why
    assert why["generated_tokens"] == 4, why


def test_a_models_default_output_limit_without_a_rewrite(lane: Lane) -> None:
    """models.NAME.max_tokens: the child is started with it (`--n-predict`), so a request
    that sets no limit is relayed as it came and still stops there, whole and streamed."""
    raw = lane.openai.chat.completions.with_raw_response.create(model="capped", messages=HI)
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.completion_tokens == 7
    assert answer.choices[0].finish_reason == "length"
    assert lane.relayed(raw.headers) is lane.relay
    stream = lane.openai.chat.completions.create(
        model="capped", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    longer = lane.openai.chat.completions.create(model="capped", messages=HI, max_tokens=9)
    assert longer.usage is not None and longer.usage.completion_tokens == 9


def test_errors_in_openais_shape(lane: Lane) -> None:
    with pytest.raises(openai.NotFoundError) as found:
        lane.openai.chat.completions.create(model="tinyy", messages=HI, max_tokens=1)
    assert "tiny" in str(found.value)
    with pytest.raises(openai.BadRequestError) as bad:  # the child's own refusal
        lane.openai.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": 5}],  # type: ignore[list-item]
            max_tokens=1,
        )
    body = bad.value.body
    assert isinstance(body, dict), body
    assert body["message"] == "Expected 'content' to be a string or an array", body


def _events(url: str, path: str, body: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """An SSE stream's head and its events' data, read raw."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        data = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
        return resp.headers, data


def test_anthropic_and_responses_stay_interpreted(lane: Lane) -> None:
    """Step 5 of issue 30, checked and left (docs/performance.md): llama-server's native
    /v1/messages and /v1/responses differ from what the clients need in the body (ids,
    `ping`, usage, sequence numbers, the incomplete status), so both lanes answer them
    on the interpreted one. The child's own answers are checked too: when llama-server
    writes those shapes itself, this fails, and relaying them may be worth doing."""
    message = {"model": "tiny", "max_tokens": 3, "messages": HI}
    response = {"model": "tiny", "max_output_tokens": 3, "input": "hi"}

    headers, events = _events(lane.url, "/v1/messages", message)
    assert not lane.relayed(headers)
    assert events[0]["message"]["id"].startswith("msg_")
    assert [e["type"] for e in events][2] == "ping"
    headers, events = _events(lane.url, "/v1/responses", response)
    assert not lane.relayed(headers)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.incomplete"

    [port, *_] = [r["port"] for r in lane.served.ps() if r["model"] == "tiny"]
    child = f"http://127.0.0.1:{port}"
    _, native = _events(child, "/v1/messages", message)
    assert not native[0]["message"]["id"].startswith("msg_")
    assert "ping" not in [e["type"] for e in native]
    _, native = _events(child, "/v1/responses", response)
    assert all("sequence_number" not in e for e in native)
    assert native[-1]["type"] == "response.completed"  # cut by the limit all the same


def _request(body: dict[str, Any], *, extra: bytes = b"") -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + extra
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


def _responses(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """`count` whole responses (head, body) read off a keep-alive connection."""
    buffer = b""
    out: list[tuple[bytes, bytes]] = []
    while len(out) < count:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(65536)
            assert chunk, (out, buffer)
            buffer += chunk
            continue
        head = buffer[:end]
        lines = head.lower().split(b"\r\n")
        length = next(
            (int(v.split(b":")[1]) for v in lines if v.startswith(b"content-length:")), None
        )
        rest = buffer[end + 4 :]
        if length is not None:
            while len(rest) < length:
                chunk = sock.recv(65536)
                assert chunk
                rest += chunk
            out.append((head, rest[:length]))
            buffer = rest[length:]
            continue
        while b"0\r\n\r\n" not in rest:  # chunked: to its last chunk
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
        done = rest.index(b"0\r\n\r\n") + 5
        out.append((head, rest[:done]))
        buffer = rest[done:]
    return out


def test_pipelined_requests_of_both_lanes_on_one_connection(lane: Lane) -> None:
    plain = {"model": "tiny", "messages": HI, "max_tokens": 2}
    streamed = {**plain, "stream": True}
    models = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", lane.served.port), timeout=30) as sock:
        sock.sendall(_request(plain) + models + _request(streamed) + _request(plain))
        got = _responses(sock, 4)
        for head, _ in got:
            assert head.startswith(b"HTTP/1.1 200"), head
        assert json.loads(got[0][1])["object"] == "chat.completion"
        assert json.loads(got[1][1])["object"] == "list"
        assert b"data: [DONE]" in got[2][1]
        assert json.loads(got[3][1])["object"] == "chat.completion"
        # the same connection still serves, after a pause
        sock.sendall(_request(plain, extra=b"Connection: close\r\n"))
        [(head, _)] = _responses(sock, 1)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
        assert sock.recv(1) == b""  # closed as asked


def test_expect_100_continue(lane: Lane) -> None:
    body = json.dumps({"model": "tiny", "messages": HI, "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", lane.served.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        [(head, answer)] = _responses(sock, 1)
        assert head.startswith(b"HTTP/1.1 200")
        assert json.loads(answer)["object"] == "chat.completion"


def test_a_body_that_trails_its_head(lane: Lane) -> None:
    body = json.dumps({"model": "tiny", "messages": HI, "max_tokens": 2}).encode()
    request = _request({"model": "tiny", "messages": HI, "max_tokens": 2})
    head = request[: len(request) - len(body)]
    with socket.create_connection(("127.0.0.1", lane.served.port), timeout=30) as sock:
        sock.sendall(head)
        sock.sendall(body[:10])
        sock.sendall(body[10:])
        [(answer_head, answer)] = _responses(sock, 1)
        assert answer_head.startswith(b"HTTP/1.1 200")
        assert json.loads(answer)["object"] == "chat.completion"


def test_a_client_gone_mid_stream_stops_the_child(lane: Lane, tmp_path: Path) -> None:
    [row] = [r for r in lane.served.ps() if r["model"] == "tiny"]
    max_tokens = 3000
    request = _request({"model": "tiny", "messages": HI, "max_tokens": max_tokens, "stream": True})
    sock = socket.create_connection(("127.0.0.1", lane.served.port))
    sock.sendall(request)
    received = b""
    while received.count(b"data: ") < 3:  # tokens are flowing
        chunk = sock.recv(4096)
        assert chunk, received.decode(errors="replace")
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    in_progress = tokens_in_progress(row["port"])
    assert in_progress > 0
    at_disconnect = tokens_predicted(row["port"]) + in_progress
    sock.close()
    assert_generation_cancelled(row["port"], at_disconnect, max_tokens)
    # the slot went back: the next request is served
    answer = lane.openai.chat.completions.create(model="tiny", messages=HI, max_tokens=1)
    assert answer.choices[0].message.content is not None


def test_a_slow_reader_gets_the_whole_stream(lane: Lane) -> None:
    """The client reads nothing for a while, then slowly: the gateway stops reading the
    child meanwhile (the relay holds it, past serving.upstream_timeout's silence count
    too) and the stream arrives whole, every token, in order."""
    tokens = 3000
    request = _request(
        {
            "model": "tiny",
            "messages": HI,
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            # about 2 KB an event, 6 MB in all: past what the sockets' buffers hold, so
            # the client's transport pauses (measured: the relay held the child 4 times)
            "logprobs": True,
            "top_logprobs": 20,
        }
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", lane.served.port))
    with sock:
        sock.sendall(request)
        time.sleep(2)  # the child finishes long before: everything waits on the reader
        [(head, body)] = _responses(sock, 1)
    assert head.startswith(b"HTTP/1.1 200")
    events = [
        json.loads(line[6:])
        for line in _dechunked(body).split(b"\n")
        if line.startswith(b"data: {")
    ]
    content = [e for e in events if e.get("choices") and e["choices"][0]["delta"].get("content")]
    assert len(content) == tokens
    assert events[-1]["usage"]["completion_tokens"] == tokens


def _dechunked(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)
