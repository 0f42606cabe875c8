"""A WebSocket client on `socket` and `ssl` (RFC 6455), for `blazar_sdk.realtime`.

The standard library has no WebSocket client, and the SDK takes no
dependencies, so this is one, small: the opening handshake (`Sec-WebSocket-Key`
and the `Sec-WebSocket-Accept` it must come back as, subprotocols offered and
the one chosen checked, extra headers such as `Authorization`), and framing:
client frames masked with a fresh key each, 7-, 16- and 64-bit payload lengths,
fragmented messages put back together, pings answered with pongs between
fragments, the closing handshake. What a server may not do is a
`RealtimeError`: a masked frame, reserved bits (no extension is negotiated), a
control frame over 125 bytes or fragmented, a continuation out of place, text
that is not UTF-8, a message over `max_message` bytes. No compression
(permessage-deflate is never offered).

`encode_frame` and `Reader` are the framing alone, tested against RFC 6455's
own examples; `WebSocket` puts them on a socket.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import ssl
import struct
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

from blazar_sdk.errors import RealtimeError, from_response

__all__ = ["GUID", "WebSocket", "accept_key", "encode_frame"]

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONTROL = (CLOSE, PING, PONG)
MAX_HEAD = 64 << 10  # the handshake answer's head


def accept_key(key: str) -> str:
    """The `Sec-WebSocket-Accept` a server must answer a `Sec-WebSocket-Key` with."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def encode_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None) -> bytes:
    """One frame; `mask` is the 4-byte masking key (a client always masks), None unmasked."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask is not None else 0
    size = len(payload)
    if size < 126:
        head.append(bit | size)
    elif size < 1 << 16:
        head.append(bit | 126)
        head += struct.pack("!H", size)
    else:
        head.append(bit | 127)
        head += struct.pack("!Q", size)
    if mask is None:
        return bytes(head) + payload
    return bytes(head) + mask + _masked(payload, mask)


def _masked(payload: bytes, mask: bytes) -> bytes:
    # XOR with the key repeated, as one big integer: fast enough for audio chunks.
    key = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(
        len(payload), "big"
    )


class Reader:
    """Frames from a byte source (`read(n)` returns exactly n bytes or raises)."""

    def __init__(self, read: Callable[[int], bytes], max_message: int) -> None:
        self._read = read
        self.max_message = max_message

    def frame(self) -> tuple[bool, int, bytes]:
        """The next frame: (fin, opcode, payload)."""
        read = self._read
        first, second = read(2)
        if first & 0x70:
            raise RealtimeError("the server set reserved bits (no extension was negotiated)")
        fin, opcode = bool(first & 0x80), first & 0x0F
        if second & 0x80:
            raise RealtimeError("the server masked a frame (RFC 6455: servers must not)")
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", read(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", read(8))
        if opcode in CONTROL and (size > 125 or not fin):
            raise RealtimeError("the server sent a control frame over 125 bytes or fragmented")
        if opcode not in (CONTINUATION, TEXT, BINARY, *CONTROL):
            raise RealtimeError(f"the server sent a frame of unknown opcode {opcode:#x}")
        if size > self.max_message:
            raise RealtimeError(f"the server sent a frame of {size} bytes (max {self.max_message})")
        return fin, opcode, read(size) if size else b""


class WebSocket:
    """An open client connection: `send_text`, `send_binary`, `recv`, `close`."""

    def __init__(self, sock: socket.socket, buffered: bytes, max_message: int) -> None:
        self.sock = sock
        self._buffer = bytearray(buffered)
        self._reader = Reader(self._read_exactly, max_message)
        self.subprotocol: str | None = None
        self.closed = False

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        subprotocols: Sequence[str] = (),
        timeout: float = 60.0,
        max_message: int = 16 << 20,
        ssl_context: ssl.SSLContext | None = None,
    ) -> WebSocket:
        """Open `ws://` or `wss://` `url` and complete the handshake. A refusal (any answer
        but 101) is raised as the gateway's `APIError` (401, 404, ...), body and trace
        id included."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"expected a ws:// or wss:// URL, got {url!r}")
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        try:
            sock = socket.create_connection((parts.hostname, port), timeout=timeout)
            if secure:
                context = ssl_context or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=parts.hostname)
        except OSError as exc:
            raise RealtimeError(f"cannot connect to {url}: {exc}") from None
        key = base64.b64encode(os.urandom(16)).decode()
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        lines = [
            f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {host}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if subprotocols:
            lines.append(f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            status, answer, rest = _read_head(sock)
        except OSError as exc:
            sock.close()
            raise RealtimeError(f"the handshake with {url} failed: {exc}") from None
        if status != 101:
            body = _read_body(sock, answer, rest)
            sock.close()
            raise from_response(status, body, answer)
        try:
            chosen = _check_upgrade(answer, key, subprotocols)
        except RealtimeError:
            sock.close()
            raise
        ws = cls(sock, rest, max_message)
        ws.subprotocol = chosen
        return ws

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            except socket.timeout:
                raise RealtimeError("the server sent nothing within the timeout") from None
            if not chunk:
                self.closed = True
                raise RealtimeError("the server closed the connection without a close frame")
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def _send(self, opcode: int, payload: bytes) -> None:
        if self.closed:
            raise RealtimeError("the WebSocket is closed")
        self.sock.sendall(encode_frame(opcode, payload, mask=os.urandom(4)))

    def send_text(self, text: str) -> None:
        self._send(TEXT, text.encode())

    def send_binary(self, data: bytes) -> None:
        self._send(BINARY, data)

    def recv(self) -> str | bytes:
        """The next whole message (text as str, binary as bytes). Pings are answered on the
        way; a close frame is answered and raised as `RealtimeError` with its code."""
        parts: list[bytes] = []
        kind: int | None = None
        size = 0
        while True:
            fin, opcode, payload = self._reader.frame()
            if opcode == PING:
                self._send(PONG, payload)
                continue
            if opcode == PONG:
                continue
            if opcode == CLOSE:
                self._closed_by_server(payload)
            if opcode == CONTINUATION:
                if kind is None:
                    raise RealtimeError("the server sent a continuation with no message begun")
            elif kind is not None:
                raise RealtimeError("the server began a message inside a fragmented one")
            else:
                kind = opcode
            size += len(payload)
            if size > self._reader.max_message:
                raise RealtimeError(f"a message over {self._reader.max_message} bytes")
            parts.append(payload)
            if fin:
                data = b"".join(parts)
                if kind == BINARY:
                    return data
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    self.close(1007, "invalid UTF-8")
                    raise RealtimeError("the server sent text that is not UTF-8") from None

    def _closed_by_server(self, payload: bytes) -> None:
        code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
        reason = payload[2:].decode("utf-8", errors="replace")
        if not self.closed:
            with contextlib.suppress(OSError):
                self._send(CLOSE, payload[:2])
            self.closed = True
            self.sock.close()
        raise RealtimeError(
            f"the server closed the WebSocket ({code}{': ' + reason if reason else ''})",
            close_code=code,
            close_reason=reason,
        )

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame, wait briefly for the server's, and close the socket."""
        if self.closed:
            return
        try:
            self._send(CLOSE, struct.pack("!H", code) + reason.encode()[:123])
            self.closed = True
            self.sock.settimeout(2.0)
            for _ in range(64):  # what the server still had in flight, then its close
                _, opcode, _ = self._reader.frame()
                if opcode == CLOSE:
                    break
        except (OSError, RealtimeError):
            pass
        finally:
            self.closed = True
            self.sock.close()


def _read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise RealtimeError("the server closed the connection during the handshake")
        data += chunk
        if len(data) > MAX_HEAD:
            raise RealtimeError("the handshake answer's head is too large")
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(status_line.split(" ", 2)[1])
    except (IndexError, ValueError):
        raise RealtimeError(f"not an HTTP answer: {status_line!r}") from None
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


def _read_body(sock: socket.socket, headers: Mapping[str, str], rest: bytes) -> bytes:
    """A refusal's body (by Content-Length; at most 64 KiB), for its error message."""
    want = min(int(headers.get("content-length", "0") or 0), 64 << 10)
    body = rest
    try:
        while len(body) < want:
            chunk = sock.recv(want - len(body))
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    return body[:want] if want else body


def _check_upgrade(headers: Mapping[str, str], key: str, offered: Sequence[str]) -> str | None:
    if headers.get("upgrade", "").lower() != "websocket":
        raise RealtimeError("the server answered 101 without Upgrade: websocket")
    if "upgrade" not in headers.get("connection", "").lower():
        raise RealtimeError("the server answered 101 without Connection: Upgrade")
    if headers.get("sec-websocket-accept") != accept_key(key):
        raise RealtimeError("the server's Sec-WebSocket-Accept does not match the key sent")
    if headers.get("sec-websocket-extensions"):
        raise RealtimeError("the server chose an extension, and none was offered")
    chosen = headers.get("sec-websocket-protocol") or None
    if chosen is not None and chosen not in offered:
        raise RealtimeError(f"the server chose subprotocol {chosen!r}, which was not offered")
    return chosen
