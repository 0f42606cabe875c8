"""A request id with a byte that is not UTF-8 costs no trace, through a real `blazar serve`.

The bug (issue 28, class 3): a request whose `x-request-id` carried the byte 0xFF (HTTP
allows it in a field value) was answered 200, but writing its trace failed (SQLite:
"surrogates not allowed") and the whole one-second batch was dropped: the other
requests of that second were missing from the store after serve stopped, and `blazar
why` could not find them. It reproduces on every run: the byte is fixed and the bad
trace's own record was always lost with its batch.

Several requests arrive at once: plain ones, one whose id carries 0xFF (sent over a raw
socket, as no client library would send it), and one whose body names a model with a
lone surrogate (`\\ud800`, a JSON escape). All are answered; once serve has stopped,
each trace is in the store, the bad id's written as the response header carried it
(`\\xff`), and `blazar why` finds it there.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from blazar.observe import trace_store as trace_store
from blazar.paths import resolve_paths
from blazar.store.db import Store
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.serving import Served

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def raw_chat(port: int, request_id: bytes) -> tuple[int, bytes]:
    """A chat request with this x-request-id, over a socket: (status, the echoed id)."""
    body = json.dumps(CHAT).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nx-request-id: " + request_id + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    lines = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    fields = (line.partition(b":") for line in lines[1:])
    [echoed] = [value.strip() for name, _, value in fields if name.lower() == b"x-request-id"]
    return int(lines[0].split()[1]), echoed


def post(url: str, body: bytes, request_id: str) -> int:
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "x-request-id": request_id},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def test_a_request_id_that_is_not_utf8_costs_no_trace(
    tmp_path: Path, blazar_home: Path, tiny_model: Path, blazar: Blazar
) -> None:
    manifest = write_manifest(tmp_path, ENGINE + model_block("tiny", tiny_model))
    plain = [f"plain-{uuid.uuid4().hex}" for _ in range(4)]
    lone = f"lone-{uuid.uuid4().hex}"
    bad = f"bad-{uuid.uuid4().hex}-".encode() + b"\xff"
    statuses: dict[str, int] = {}
    echoes: list[bytes] = []
    with Served(manifest, blazar_home) as served:
        assert post(served.url, json.dumps(CHAT).encode(), "warm") == 200  # loads the model

        def send(name: str) -> None:
            if name == "bad":
                statuses[name], echoed = raw_chat(served.port, bad)
                echoes.append(echoed)
            elif name == lone:  # a model name no UTF-8 can hold: 404, traced
                body = b'{"model": "\\ud800x", "messages": []}'
                statuses[name] = post(served.url, body, name)
            else:
                statuses[name] = post(served.url, json.dumps(CHAT).encode(), name)

        threads = [threading.Thread(target=send, args=(n,)) for n in [*plain, "bad", lone]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert statuses == {**dict.fromkeys(plain, 200), "bad": 200, lone: 404}
    escaped = (bad[:-1] + b"\\xff").decode()  # the byte, escaped, as the trace records it
    with Store(resolve_paths().db) as store:
        for trace in [*plain, lone, escaped]:
            assert trace_store.find(store, trace) is not None, f"the trace of {trace!r} was lost"
    assert echoes == [escaped.encode()]  # the response carried the id the trace has
    # serve has stopped: `blazar why` reads the store
    shown = json.loads(blazar("why", escaped, "--json").output)
    assert shown["id"] == escaped and shown["status"] == 200
