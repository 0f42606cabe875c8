"""The one HTTP/1.1 client the gateway talks to the children with.

`ChildConnections` keeps keep-alive connections to each child (a llama-server
instance, an audio engine), reused across requests. Every engine request goes
through it: the pipeline's call (`blazar.serve.request.exchange` on
`child_calls.LeasedChild`, the answer copied back as it arrives), an answer's helper
calls (the same `LeasedChild`: `/apply-template`, `/tokenize`), the preflight's
counts (`prompts`) and the audio engines' calls (`blazar.serve.state.audio_engine`).
Each connection is a `ChildConnection`, an `asyncio.Protocol` that parses the
response in `data_received`: the status line and headers, then a body framed by
Content-Length, by chunks, or by the connection's end. Body bytes queue up for
`read`, which hands over whatever has arrived; reading from the child pauses once
`READ_AHEAD` bytes wait for a slow client. Anything that goes wrong with a child is
an `UpstreamError`; a child that sends nothing for `timeout` seconds while a
response is awaited (`serving.upstream_timeout`: a limit between chunks, not on the
whole answer) is an `UpstreamTimeout`, which the gateway answers with a 504.

It is hand-written because this is the hot path: aiohttp's `ClientSession`
measured about 100 - 135 us of CPU per request by itself, against 10 - 36 us
for a bare asyncio protocol. It does only what the pass-through needs (JSON
POSTs to llama-server), and carries two rules learned from llama-server: no
connection idle for `REUSE_IDLE` or more is reused, and a connection that
carried a chunked response is not kept. docs/performance.md has the numbers
and the story.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

# llama-server closes a keep-alive connection after 5 s idle: reuse none that old, so a
# request is never sent on a connection the child is closing at that moment (the
# remotes' pool, `state.remotes.Fleet.client`, keeps none longer either).
REUSE_IDLE = 4.0
CONNECT_TIMEOUT = 10.0
READ_AHEAD = 1 << 20  # bytes read from a child beyond what a slow client took: then pause


class UpstreamError(Exception):
    """A child did not answer: refused the connection, closed it, or sent bad HTTP."""


class UpstreamTimeout(UpstreamError):
    """A child sent nothing for the read timeout while a response was awaited."""


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK, _CHUNK_END, _TRAILER, _TO_CLOSE, _DONE = range(8)
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _whole_chunks(data: bytes) -> tuple[int, list[bytes]]:
    """How many bytes at the start of `data` are whole chunks of a chunked body (a size
    line without extensions, the data, its CRLF; not the last, empty chunk), and their
    data."""
    at, end, pieces = 0, len(data), []
    while at < end:
        eol = data.find(b"\r\n", at, at + 18)
        if eol <= at or not _HEX.issuperset(data[at:eol]):
            break
        size = int(data[at:eol], 16)
        stop = eol + 2 + size
        if not size or data[stop : stop + 2] != b"\r\n":
            break
        pieces.append(data[eol + 2 : stop])
        at = stop + 2
    return at, pieces


class ChildConnection(asyncio.Protocol):
    """One connection to a child, one request at a time (HTTP/1.1 keep-alive).

    `data_received` parses the response as it comes: the status line and headers,
    then a body framed by Content-Length, by chunks, or by the connection's end. Body
    bytes queue up for `read`, which hands over whatever has arrived: nothing is held
    back waiting for more.
    """

    def __init__(self, timeout: float | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.timeout = timeout  # seconds without a byte while waiting; None: no limit
        self.closed = False
        self.idle_since = 0.0
        self.idle_in: list[ChildConnection] | None = None  # the pool's list, while it waits there
        self._waiter: asyncio.Future[None] | None = None
        # The read timeout: one timer per connection, re-armed only when it fires early, so a
        # stream of many chunks costs a timestamp per chunk, not a timer per wait.
        self._timer: asyncio.TimerHandle | None = None
        self._heard = 0.0  # when the child last sent a byte, or a wait began
        # Where body bytes go as they are parsed, instead of the queue `read` takes them
        # from: the gateway's relay writes them to its client from here (one call per
        # read from the socket, no task woken); `read` then only waits for the end or a
        # failure.
        self.sink: Callable[[bytes], None] | None = None
        # With the sink, where the whole chunks a read starts with go as they came (their
        # framing, their pieces): the relay writes those bytes to its client unchanged, so
        # the usual stream (llama-server writes one event per chunk) is neither parsed
        # into the buffer nor framed again (`splice`).
        self.framed: Callable[[bytes, list[bytes]], None] | None = None
        self._held = False  # reading paused for a slow client (`hold`): silence not counted
        self._begin()

    def _begin(self) -> None:
        self.sink = self.framed = None
        self.status = 0
        self.content_type = ""
        self.keep_alive = True
        self.chunked = False
        self.received = False  # any byte of the current request's response
        self.complete = False
        self._state = _HEAD
        self._buffer = bytearray()
        self._remaining = 0
        self._pieces: list[bytes] = []
        self._queued = 0
        self._paused = False
        self._error: UpstreamError | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._heard = time.monotonic()
        if self.framed is not None and self._state == _CHUNK_SIZE and not self._buffer:
            # Whole chunks (size line, data, CRLF) from the read's start: as they came.
            whole, pieces = _whole_chunks(data)
            if pieces:
                self.framed(data if whole == len(data) else data[:whole], pieces)
                if whole == len(data):
                    return
                data = data[whole:]  # the rest (the last chunk, a cut one): parsed
        self._buffer += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(UpstreamError(f"the child sent a malformed response ({exc})"))
            self.close()
        if self.sink is not None and self._pieces:  # what this read completed, at once
            pieces, self._pieces, self._queued = self._pieces, [], 0
            self.sink(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if self._queued > READ_AHEAD and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self.sink is None or self.complete or self._error is not None:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_in is not None:  # closed by the child while idle: out of the pool
            self.idle_in.remove(self)
            self.idle_in = None
        if self._state == _TO_CLOSE:
            self._finish()
        elif not self.complete:
            self._fail(UpstreamError(str(exc) if exc else "Server disconnected"))
        self._wake()

    # -- parsing ------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buffer
        while buf:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > 1 << 16:
                        raise ValueError("response headers over 64 KiB")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._head(head)
            elif state in (_LENGTH, _CHUNK):
                piece = bytes(buf[: self._remaining])
                del buf[: len(piece)]
                self._push(piece)
                self._remaining -= len(piece)
                if self._remaining == 0:
                    if state == _LENGTH:
                        self._finish()
                    else:
                        self._state = _CHUNK_END
            elif state in (_CHUNK_SIZE, _TRAILER):
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == _TRAILER:
                    if not line:
                        self._finish()
                    continue
                self._remaining = int(line.split(b";", 1)[0], 16)
                self._state = _CHUNK if self._remaining else _TRAILER
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("a chunk without its CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TO_CLOSE:
                self._push(bytes(buf))
                buf.clear()
            else:  # _DONE: bytes after the response; this connection is not reused
                self.keep_alive = False
                buf.clear()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        if not version.startswith(b"HTTP/1."):
            raise ValueError(f"not HTTP/1.x: {lines[0][:40]!r}")
        self.status = int(status)
        if self.status < 200:  # an interim response (100 Continue): the real one follows
            return
        length: int | None = None
        self.keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-type":
                self.content_type = value.strip().decode("latin-1")
            elif name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif name == b"connection":
                self.keep_alive = b"close" not in value.lower()
        if self.chunked:
            self._state = _CHUNK_SIZE
        elif self.status in (204, 304) or length == 0:
            self._finish()
        elif length is not None:
            self._state, self._remaining = _LENGTH, length
        else:
            self._state, self.keep_alive = _TO_CLOSE, False

    def _push(self, piece: bytes) -> None:
        if piece:
            self._pieces.append(piece)
            self._queued += len(piece)

    def _finish(self) -> None:
        self._state, self.complete = _DONE, True

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if self.timeout is not None:
            # Silence counts from the start of this wait (the gateway may have been busy
            # writing to a slow client, reading paused) or from the child's last byte.
            self._heard = time.monotonic()
            if self._timer is None:
                self._timer = loop.call_at(self._heard + self.timeout, self._check_silence)
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _check_silence(self) -> None:
        """The timer: fail the wait if the child has been silent for the timeout, else
        look again when it would have been."""
        self._timer = None
        if self._waiter is None or self.timeout is None or self.complete:
            return  # nobody waits now; the next wait arms the timer again
        due = self._heard + self.timeout
        if time.monotonic() >= due:
            self._fail(UpstreamTimeout(f"the model sent nothing for {self.timeout:g} s"))
            self._wake()
        else:
            self._timer = asyncio.get_running_loop().call_at(due, self._check_silence)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- one request -------------------------------------------------------------------

    async def send(self, request: bytes) -> None:
        """Send a request; return once the response's status line and headers are in."""
        assert self.transport is not None
        if self._paused or self._held:  # the last body was left unread, reading paused
            self._held = False
            self.transport.resume_reading()
        self._begin()
        self.transport.write(request)
        while self._state == _HEAD:
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at
        the end of the body."""
        while not self._pieces:
            if self.complete:
                return b""
            await self._wait()
        pieces, self._pieces, self._queued = self._pieces, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def read_all(self) -> bytes:
        parts = []
        while part := await self.read():
            parts.append(part)
        return b"".join(parts)

    def splice(
        self,
        sink: Callable[[bytes], None],
        framed: Callable[[bytes, list[bytes]], None] | None = None,
    ) -> None:
        """Hand the body bytes queued so far to `sink`, and each later piece as it is
        parsed (`read` then waits only for the end or a failure). With `framed`, the
        whole chunks a read of a chunked body starts with go there instead, unparsed:
        (those bytes, framing and all; each chunk's data)."""
        pieces, self._pieces, self._queued = self._pieces, [], 0
        if pieces:
            sink(b"".join(pieces))
        self.sink = sink
        self.framed = framed if self.chunked else None
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def hold(self) -> None:
        """Stop reading the child while the client cannot take more; the silence limit
        does not run meanwhile."""
        if not self._held and self.transport is not None:
            self._held = True
            self._disarm()
            self.transport.pause_reading()

    def unhold(self) -> None:
        """Read the child again (`hold`), the silence limit counting from now."""
        if self._held and self.transport is not None:
            self._held = False
            self._heard = time.monotonic()
            self.transport.resume_reading()
            if self._waiter is not None and self.timeout is not None and self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_at(self._heard + self.timeout, self._check_silence)

    def close(self) -> None:
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()


class ChildConnections:
    """Keep-alive HTTP/1.1 connections to the children, reused across requests.

    `timeout` (seconds, None for no limit) bounds each wait for a child's bytes; it
    may be changed at any time (a manifest reload) and applies to new requests."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout
        self._idle: dict[tuple[str, int], list[ChildConnection]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}

    def address(self, base_url: str) -> tuple[str, int]:
        found = self._addresses.get(base_url)
        if found is None:
            parts = urlsplit(base_url)
            found = self._addresses[base_url] = (parts.hostname or "", parts.port or 80)
        return found

    async def post(
        self, base_url: str, path: str, body: bytes, method: str = "POST"
    ) -> ChildConnection:
        """Send a JSON POST (or, with `method`, a GET); return the connection with the
        response's head read. Give the connection back with `release` (in a `finally`: that
        closes one left unfinished)."""
        host, port = address = self.address(base_url)
        request = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        connection = self._reuse(address)
        if connection is not None:
            connection.timeout = self.timeout
            try:
                await connection.send(request)
                return connection
            except UpstreamError:
                connection.close()
                if connection.received:
                    raise
                # The child closed this idle connection as it was reused: once more, anew.
            except BaseException:
                connection.close()
                raise
        connection = await self._connect(host, port)
        connection.timeout = self.timeout
        try:
            await connection.send(request)
        except BaseException:
            connection.close()
            raise
        return connection

    def release(self, base_url: str, connection: ChildConnection) -> None:
        """Keep a connection whose response is finished for the next request, or close it."""
        # llama-server closes the connection after a streamed (chunked) response, though
        # it says keep-alive: one reused then would fail. So chunked ones are not kept.
        if (
            not connection.complete
            or not connection.keep_alive
            or connection.closed
            or connection.chunked
        ):
            connection.close()
            return
        connection._disarm()
        connection.idle_since = time.monotonic()
        connection.idle_in = self._idle.setdefault(self.address(base_url), [])
        connection.idle_in.append(connection)

    def _reuse(self, address: tuple[str, int]) -> ChildConnection | None:
        idle = self._idle.get(address)
        while idle:
            connection = idle.pop()
            connection.idle_in = None
            if not connection.closed and time.monotonic() - connection.idle_since < REUSE_IDLE:
                return connection
            connection.close()
        return None

    async def _connect(self, host: str, port: int) -> ChildConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, connection = await loop.create_connection(ChildConnection, host, port)
        except TimeoutError:
            raise UpstreamError(f"Cannot connect to {host}:{port}: timed out") from None
        except OSError as exc:
            raise UpstreamError(f"Cannot connect to {host}:{port}: {exc}") from None
        return connection

    async def json(
        self, base_url: str, path: str, payload: Any = None, *, raw: bytes | None = None
    ) -> tuple[int, Any]:
        """One small request that is not a client's (slots, tokenizer, templates): POST
        `payload` as JSON (or `raw` bytes), or GET when both are None; (status, decoded body).
        Raises UpstreamError as `post` does."""
        body = raw if raw is not None else b"" if payload is None else json.dumps(payload).encode()
        method = "GET" if payload is None and raw is None else "POST"
        connection = await self.post(base_url, path, body, method)
        try:
            data = await connection.read_all()
        finally:
            self.release(base_url, connection)
        try:
            return connection.status, json.loads(data)
        except ValueError:
            return connection.status, data.decode(errors="replace")

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.idle_in = None
                connection.close()
        self._idle.clear()
