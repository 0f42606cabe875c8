"""The realtime client's WebSocket (RFC 6455) against a small WebSocket server of the test's.

The framing is checked against `Peer`, a standard-library WebSocket server
written here, independently of the client: it checks the handshake, unmasks what
the client sends (and fails if a frame is not masked), and answers like a
Realtime server, using what a client must cope with: 16- and 64-bit lengths, a
message in fragments with a ping between them, a close with a code. RFC 6455's
own examples pin the encoding. Then the real gateway's `/v1/realtime` (aiohttp's
WebSocket server) with the tiny model: a text session, the key in the header and
in the subprotocol, refusals as typed errors. Voice in and voice out, with the
audio lanes, is in the repository's tests/test_audio_served.py.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from blazar_sdk import AuthenticationError, Client, NotFoundError, RealtimeError
from blazar_sdk._websocket import Reader, accept_key, encode_frame
from blazar_sdk.realtime import realtime_url
from conftest import Gateway


def test_rfc_6455_examples() -> None:
    # Section 5.7: "Hello", unmasked and masked with 37 fa 21 3d; a 256-byte binary frame.
    assert encode_frame(0x1, b"Hello", mask=None) == bytes.fromhex("810548656c6c6f")
    masked = encode_frame(0x1, b"Hello", mask=bytes.fromhex("37fa213d"))
    assert masked == bytes.fromhex("818537fa213d7f9f4d5158")
    assert encode_frame(0x2, b"\0" * 256, mask=None)[:4] == bytes.fromhex("827e0100")
    assert encode_frame(0x2, b"\0" * 65536, mask=None)[:10] == bytes.fromhex("827f0000000000010000")
    assert encode_frame(0x1, b"Hel", fin=False, mask=None) == bytes.fromhex("010348656c")
    # Section 1.3: the handshake's accept value.
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    # Frames a server must not send.
    for frame, says in (
        (bytes.fromhex("818537fa213d7f9f4d5158"), "masked a frame"),
        (bytes.fromhex("c100"), "reserved bits"),
        (encode_frame(0x9, b"x" * 126, mask=None), "control frame over 125 bytes"),
        (bytes.fromhex("0900"), "control frame over 125 bytes or fragmented"),
        (bytes.fromhex("8300"), "unknown opcode"),
        (encode_frame(0x2, b"x" * 2000, mask=None), "2000 bytes (max 1000)"),
    ):
        data = bytearray(frame)

        def read(n: int, data: bytearray = data) -> bytes:
            out = bytes(data[:n])
            del data[:n]
            return out

        with pytest.raises(RealtimeError) as refused:
            Reader(read, max_message=1000).frame()
        assert says in str(refused.value)


def test_the_realtime_url() -> None:
    assert (
        realtime_url("http://127.0.0.1:11435", "m 1")
        == "ws://127.0.0.1:11435/v1/realtime?model=m+1"
    )
    assert realtime_url("https://box/", None) == "wss://box/v1/realtime"


class Peer:
    """A WebSocket server on 127.0.0.1 for one connection at a time, speaking Realtime events."""

    def __init__(self, *, accept: str | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.bad_accept = accept
        self.requests: list[dict[str, str]] = []
        self.received: list[Any] = []  # events, and ("pong", payload), ("close", code)
        self.audio = b""
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self.listener.close()
        self.thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    self._session(conn)
                except (OSError, AssertionError, ValueError) as exc:
                    self.failures.append(repr(exc))

    def _read(self, conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("client went away")
            data += chunk
        return data

    def _frame(self, conn: socket.socket) -> tuple[int, bytes]:
        first, second = self._read(conn, 2)
        assert second & 0x80, "a client frame was not masked"
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", self._read(conn, 2))
        elif size == 127:
            (size,) = struct.unpack("!Q", self._read(conn, 8))
        mask = self._read(conn, 4)
        data = self._read(conn, size)
        return first & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    def _send(self, conn: socket.socket, event: dict[str, Any]) -> None:
        conn.sendall(encode_frame(0x1, json.dumps(event).encode(), mask=None))

    def _session(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        lines = head.decode().split("\r\n")
        fields = (line.partition(":") for line in lines[1:] if line)
        headers = {name.lower(): value.strip() for name, _, value in fields}
        headers["request-line"] = lines[0]
        self.requests.append(headers)
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        accept = self.bad_accept or accept_key(headers["sec-websocket-key"])
        answer = [
            "HTTP/1.1 101 Switching Protocols",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Accept: {accept}",
        ]
        if "realtime" in offered:
            answer.append("Sec-WebSocket-Protocol: realtime")
        conn.sendall(("\r\n".join(answer) + "\r\n\r\n").encode())
        self._send(conn, {"type": "session.created", "session": {"id": "sess_1"}})
        while True:
            opcode, payload = self._frame(conn)
            if opcode == 0xA:
                self.received.append(("pong", payload))
                continue
            if opcode == 0x8:
                self.received.append(("close", struct.unpack("!H", payload[:2])[0]))
                conn.sendall(encode_frame(0x8, payload[:2], mask=None))
                return
            event = json.loads(payload)
            self.received.append(event)
            self._answer(conn, event)

    def _answer(self, conn: socket.socket, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.update":
            self._send(conn, {"type": "session.updated", "session": event["session"]})
        elif kind == "input_audio_buffer.append":
            self.audio += base64.b64decode(event["audio"])
        elif kind == "input_audio_buffer.commit":
            self._send(conn, {"type": "input_audio_buffer.committed", "item_id": "item_1"})
        elif kind == "response.create":
            # The audio back, as one message in three fragments with a ping between them;
            # the first fragment is over 64 KiB (a 64-bit length), the last 126+ bytes.
            audio = base64.b64encode(self.audio).decode()
            whole = json.dumps({"type": "response.audio.delta", "delta": audio}).encode()
            cut1, cut2 = 70_000, len(whole) - 300
            conn.sendall(encode_frame(0x1, whole[:cut1], fin=False, mask=None))
            conn.sendall(encode_frame(0x9, b"are you there", mask=None))
            conn.sendall(encode_frame(0x0, whole[cut1:cut2], fin=False, mask=None))
            conn.sendall(encode_frame(0x0, whole[cut2:], mask=None))
            self._send(conn, {"type": "response.text.delta", "delta": "héllo"})
            self._send(conn, {"type": "response.done", "response": {"status": "completed"}})
        elif kind == "conversation.item.create":
            text = event["item"]["content"][0]["text"]
            self._send(conn, {"type": "error", "error": {"message": f"no model for {text!r}"}})
        elif kind == "response.cancel":
            conn.sendall(encode_frame(0x8, struct.pack("!H", 4000) + b"bye", mask=None))


@pytest.fixture
def peer() -> Iterator[Peer]:
    server = Peer()
    yield server
    server.close()
    assert server.failures == []


def test_a_session_sends_and_receives_realtime_events(peer: Peer) -> None:
    pcm = os.urandom(60_000)  # base64 makes it an 80 KB event: a 64-bit length each way
    with Client(peer.url, "plm_key").realtime("gemma", voice="joe") as session:
        assert session.ws.subprotocol == "realtime"
        assert session.recv() == {"type": "session.created", "session": {"id": "sess_1"}}
        assert session.recv() == {"type": "session.updated", "session": {"voice": "joe"}}
        session.send_audio(pcm[:30_000])
        session.send_audio(pcm[30_000:])
        session.commit()
        events = list(session.events(until="response.done"))
        assert [e["type"] for e in events] == [
            "input_audio_buffer.committed",
            "response.audio.delta",
            "response.text.delta",
            "response.done",
        ]
        assert session.audio(events[1]) == pcm and events[2]["delta"] == "héllo"
        session.send_text("hello")  # an error event is an event; the session goes on
        assert session.recv()["error"]["message"] == "no model for 'hello'"
    request = peer.requests[0]
    assert request["request-line"] == "GET /v1/realtime?model=gemma HTTP/1.1"
    assert request["authorization"] == "Bearer plm_key"
    assert request["sec-websocket-version"] == "13" and request["upgrade"] == "websocket"
    assert ("pong", b"are you there") in peer.received  # answered between the fragments
    assert peer.received[-1] == ("close", 1000)
    assert [e["type"] for e in peer.received if isinstance(e, dict)] == [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "response.create",
        "conversation.item.create",
        "response.create",
    ]


def test_the_key_as_a_subprotocol_and_a_close_from_the_server(peer: Peer) -> None:
    with Client(peer.url, "plm_key").realtime(auth="subprotocol") as session:
        session.recv()
        session.cancel()  # the peer closes with 4000
        with pytest.raises(RealtimeError) as closed:
            session.recv()
        assert (closed.value.close_code, closed.value.close_reason) == (4000, "bye")
    request = peer.requests[0]
    assert request["sec-websocket-protocol"] == "realtime, openai-insecure-api-key.plm_key"
    assert "authorization" not in request and request["request-line"].startswith(
        "GET /v1/realtime HTTP/1.1"
    )


def test_a_wrong_accept_is_refused() -> None:
    server = Peer(accept="d3Jvbmc=")
    try:
        with pytest.raises(RealtimeError, match="Sec-WebSocket-Accept does not match"):
            Client(server.url).realtime()
    finally:
        server.close()


def test_a_session_on_the_gateway(client: Client, gateway: Gateway) -> None:
    """The real `/v1/realtime` with the tiny model (text only: this gateway serves no voice)."""
    with client.realtime("tiny", instructions="Be brief.") as session:
        assert session.ws.subprotocol == "realtime"
        created = session.recv()["session"]
        assert created["model"] == "tiny" and created["modalities"] == ["text"]
        assert created["voice"] is None and created["input_audio_transcription"] is None
        assert session.recv()["session"]["instructions"] == "Be brief."
        session.update_session(max_response_output_tokens=5, temperature=0)
        assert session.recv()["type"] == "session.updated"
        session.send_text("hello")
        events = list(session.events(until="response.done"))
        session.send_audio(b"\0\0" * 4800)  # 0.2 s: heard by no one, since no model listens
        session.commit(respond=False)
        committed = [session.recv() for _ in range(3)]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == [
        "conversation.item.created",
        "response.created",
        "response.output_item.added",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert len(text.split()) == 5
    done = events[-1]["response"]
    assert done["status"] == "incomplete" and done["output"][0]["content"][0]["text"] == text
    assert client.explain(done["id"])["route"] == "/v1/realtime"  # each response is traced
    failed = committed[-1]
    assert failed["type"] == "conversation.item.input_audio_transcription.failed"
    assert "no transcription model" in failed["error"]["message"]


def test_the_key_in_the_subprotocol_and_refusals_in_their_types(gateway: Gateway) -> None:
    app = Client(gateway.url, gateway.app_key)
    with app.realtime("tiny", auth="subprotocol") as session:
        assert session.ws.subprotocol == "realtime"
        assert session.recv()["type"] == "session.created"
        session.send({"type": "input_audio_buffer.commit", "event_id": "mine"})
        error = session.recv()
        assert error["type"] == "error" and error["error"]["event_id"] == "mine"
        assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    for auth in ("header", "subprotocol"):
        with pytest.raises(AuthenticationError) as refused:
            Client(gateway.url, "plm_not-a-key").realtime("tiny", auth=auth)
        assert refused.value.status == 401 and refused.value.trace_id
    with pytest.raises(NotFoundError) as unknown:
        app.realtime("nope")
    assert "model 'nope' not found" in unknown.value.message
