"""The pass-through's HTTP/1.1 client (`blazar.serve.supervisor.child_http`) against small servers.

Each test runs its own asyncio server on 127.0.0.1 whose answers are written by hand,
byte by byte where it matters: framing (Content-Length, chunks, the connection's end),
keep-alive reuse and its limits, the retry of a reused connection that was dropped,
failures mid-answer, streaming as bytes arrive, and pausing for a slow reader.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.serve.supervisor import child_http
from blazar.serve.supervisor.child_http import ChildConnection, ChildConnections, UpstreamError

# (reader, writer, the connection's number from 0, the request's number on it from 0)
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int, int], Awaitable[bool]]


def run(coro: Coroutine[Any, Any, None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(2):  # a stall fails, never hangs
            await coro

    asyncio.run(bounded())


def response(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """A request's body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


class Server:
    """Answers each request with `answer`, which returns whether to keep the connection."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.accepted = 0
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[Any]] = set()  # one per connection

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the listener and end the connections' handlers (Python 3.11's
        `wait_closed` does not wait for them)."""
        assert self.server is not None
        self.server.close()
        for handler in self.handlers:
            handler.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        handler.add_done_callback(self.handlers.discard)
        index, self.accepted = self.accepted, self.accepted + 1
        number = 0
        try:
            while (body := await read_request(reader)) is not None:
                self.bodies.append(body)
                if not await self.answer(reader, writer, index, number):
                    break
                number += 1
        except ConnectionError:
            pass
        finally:
            writer.close()


async def post(children: ChildConnections, server: Server, body: bytes = b"{}") -> bytes:
    """One request read to its end and given back, as the gateway does."""
    connection = await children.post(server.url, "/v1/chat/completions", body)
    try:
        return await connection.read_all()
    finally:
        children.release(server.url, connection)


def keep_alive(body: bytes) -> Answer:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(response(body))
        await writer.drain()
        return True

    return answer


# -- framing -------------------------------------------------------------------------------


def test_content_length_body() -> None:
    async def main() -> None:
        async with Server(keep_alive(b'{"ok": true}')) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/v1/completions", b'{"model": "m"}')
            assert connection.status == 200
            assert connection.content_type == "application/json"
            assert not connection.chunked
            assert await connection.read_all() == b'{"ok": true}'
            assert connection.complete
            children.release(server.url, connection)
            assert server.bodies == [b'{"model": "m"}']
            children.close()

    run(main())


CHUNKED = (
    b"HTTP/1.1 201 Created\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n"
    b"7;name=value\r\n, world\r\n"  # a chunk extension
    b"A \r\n0123456789\r\n"  # upper-case hex, whitespace before the CRLF
    b"0\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n"  # trailers
)


def test_chunked_body_byte_by_byte_with_extensions_and_trailers() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        for i in range(len(CHUNKED)):  # every split point: one byte per segment
            writer.write(CHUNKED[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0)
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            assert (connection.status, connection.content_type) == (201, "text/event-stream")
            assert connection.chunked
            assert await connection.read_all() == b"hello, world0123456789"
            assert connection.complete
            children.release(server.url, connection)  # chunked: closed, not kept
            assert connection.closed
            children.close()

    run(main())


def test_chunked_body_in_one_piece() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(CHUNKED)
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            assert await post(children, server) == b"hello, world0123456789"
            children.close()

    run(main())


def test_body_until_close() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        for part in (b"no ", b"length ", b"here"):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        return False  # closes: the end of the body

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            assert not connection.keep_alive
            assert await connection.read_all() == b"no length here"
            assert connection.complete
            children.release(server.url, connection)
            assert connection.closed
            assert await post(children, server) == b"no length here"
            assert server.accepted == 2
            children.close()

    run(main())


def test_interim_100_continue_is_skipped() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"real"))
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            assert await post(children, server) == b"real"
            children.close()

    run(main())


# -- reuse ---------------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection() -> None:
    async def main() -> None:
        async with Server(keep_alive(b"same")) as server:
            children = ChildConnections()
            for _ in range(3):
                assert await post(children, server) == b"same"
            assert server.accepted == 1
            assert len(server.bodies) == 3
            children.close()

    run(main())


def test_server_closing_after_each_answer_despite_keep_alive() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, number: int) -> bool:
        writer.write(response(f"answer {number}".encode(), extra="Connection: keep-alive\r\n"))
        await writer.drain()
        return False  # and closes anyway

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            assert await post(children, server) == b"answer 0"
            assert await post(children, server) == b"answer 0"
            assert server.accepted == 2
            children.close()

    run(main())


def test_server_closing_at_once_after_the_answer() -> None:
    """The close may race the next request: either way the next request succeeds."""

    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, number: int) -> bool:
        writer.write(response(b"ok"))
        return False  # no drain: the close follows the answer's bytes at once

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            for _ in range(5):
                assert await post(children, server) == b"ok"
            assert server.accepted == 5
            children.close()

    run(main())


def test_reused_connection_dropped_before_the_answer_is_retried_once() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, index: int, number: int) -> bool:
        if index == 0 and number == 1:
            return False  # the reused connection: read the request, then close unanswered
        writer.write(response(f"conn {index} req {number}".encode()))
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            assert await post(children, server, b"first") == b"conn 0 req 0"
            assert await post(children, server, b"second") == b"conn 1 req 0"
            assert server.accepted == 2
            assert server.bodies == [b"first", b"second", b"second"]  # sent twice
            children.close()

    run(main())


def test_reused_connection_dropped_after_part_of_the_answer_is_not_retried() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, index: int, number: int) -> bool:
        if number == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nCont")
            await writer.drain()
            return False
        writer.write(response(b"ok"))
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            assert await post(children, server) == b"ok"
            with pytest.raises(UpstreamError):
                await children.post(server.url, "/", b"{}")
            assert server.accepted == 1  # not sent again: the child had begun to answer
            children.close()

    run(main())


def test_fresh_connection_dropped_before_the_answer_is_an_error() -> None:
    async def answer(*_: Any) -> bool:
        return False

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            with pytest.raises(UpstreamError):
                await children.post(server.url, "/", b"{}")
            assert server.accepted == 1  # a new connection is not retried
            children.close()

    run(main())


def test_refused_connection_is_an_error() -> None:
    async def main() -> None:
        async with Server(keep_alive(b"")) as server:
            url = server.url
        children = ChildConnections()
        with pytest.raises(UpstreamError, match="Cannot connect"):
            await children.post(url, "/", b"{}")

    run(main())


def test_death_mid_body_raises_and_nothing_is_reused() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, index: int, _n: int) -> bool:
        if index == 0:
            writer.write(response(b"0123456789")[:-4])  # six of its ten bytes, then gone
            await writer.drain()
            return False
        writer.write(response(b"whole"))
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            with pytest.raises(UpstreamError):
                await connection.read_all()
            assert not connection.complete
            children.release(server.url, connection)
            assert connection.closed
            assert await post(children, server) == b"whole"
            assert server.accepted == 2
            children.close()

    run(main())


def test_death_mid_chunked_body_raises() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(CHUNKED[: CHUNKED.index(b"0123")])
        await writer.drain()
        return False

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            got = b""
            with pytest.raises(UpstreamError):
                while part := await connection.read():
                    got += part
            assert got == b"hello, world"  # what arrived was handed over first
            children.release(server.url, connection)
            assert connection.closed
            children.close()

    run(main())


@pytest.mark.parametrize(
    "head",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_malformed_response_is_an_error(head: bytes) -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(1)  # the client must not wait for the close
        return True

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            with pytest.raises(UpstreamError, match="malformed"):
                async with asyncio.timeout(0.5):
                    connection = await children.post(server.url, "/", b"{}")
                    await connection.read_all()
            children.close()

    run(main())


def test_idle_connections_past_reuse_idle_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]

    class Clock:  # for child_http alone: the event loop keeps the real one
        @staticmethod
        def monotonic() -> float:
            return clock[0]

    monkeypatch.setattr(child_http, "time", Clock)

    async def main() -> None:
        async with Server(keep_alive(b"ok")) as server:
            children = ChildConnections()
            await post(children, server)
            clock[0] += child_http.REUSE_IDLE - 0.5
            await post(children, server)  # idle for less: reused
            assert server.accepted == 1
            clock[0] += child_http.REUSE_IDLE
            await post(children, server)  # idle for REUSE_IDLE: a new connection
            assert server.accepted == 2
            children.close()

    run(main())


def test_connection_closed_by_the_child_while_idle_leaves_the_pool() -> None:
    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(response(b"ok"))
        await writer.drain()
        return False

    async def main() -> None:
        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            await connection.read_all()
            children.release(server.url, connection)
            while not connection.closed:
                await asyncio.sleep(0.01)
            assert connection.idle_in is None
            assert children._idle[children.address(server.url)] == []
            children.close()

    run(main())


# -- streaming and flow control ------------------------------------------------------------


def test_pieces_are_handed_over_as_they_arrive() -> None:
    async def main() -> None:
        got_first = asyncio.Event()

        async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            writer.write(b"8\r\ndata: 1\n\r\n")
            await writer.drain()
            await got_first.wait()  # the rest only once the client has the first piece
            writer.write(b"8\r\ndata: 2\n\r\n0\r\n\r\n")
            await writer.drain()
            return True

        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            assert await connection.read() == b"data: 1\n"
            got_first.set()
            assert await connection.read() == b"data: 2\n"
            assert await connection.read() == b""
            children.release(server.url, connection)
            children.close()

    run(main())


def _reading(connection: ChildConnection) -> bool:
    assert connection.transport is not None
    return connection.transport.is_reading()


def test_slow_reader_pauses_reading_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_http, "READ_AHEAD", 4096)
    body = bytes(range(256)) * 4096 * 16  # 16 MiB: more than the kernel's buffers hold
    piece = 64 * 1024

    async def main() -> None:
        sent = [0]

        async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for start in range(0, len(body), piece):
                writer.write(body[start : start + piece])
                await writer.drain()
                sent[0] = start + piece
            return True

        async with Server(answer) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            await asyncio.sleep(0.2)  # a reader that takes nothing for a while
            assert not _reading(connection)
            assert connection._paused
            assert 4096 < connection._queued < 4096 + 512 * 1024  # one socket read past it
            assert sent[0] < len(body)  # the server is held back: the kernel buffers fill
            got = bytearray()
            pauses = 0
            while part := await connection.read():
                assert _reading(connection) or connection.complete  # taking resumes reading
                got += part
                await asyncio.sleep(0.002)  # a slow reader: more arrives meanwhile, then stops
                if connection._paused and not _reading(connection):
                    pauses += 1
            assert bytes(got) == body
            assert pauses > 1
            children.release(server.url, connection)
            assert await post(children, server) == body  # and the connection is still good
            assert server.accepted == 1
            children.close()

    run(main())


def test_unread_body_given_back_while_paused_does_not_stall_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finished answer nobody read (the handler cancelled as its last bytes arrived)
    is kept: reading must be on again for the next request on that connection."""
    monkeypatch.setattr(child_http, "READ_AHEAD", 100)

    async def main() -> None:
        async with Server(keep_alive(b"x" * 1000)) as server:
            children = ChildConnections()
            connection = await children.post(server.url, "/", b"{}")
            while not connection.complete:
                await asyncio.sleep(0.01)
            assert connection._paused
            children.release(server.url, connection)  # complete: kept, its body unread
            assert await post(children, server) == b"x" * 1000
            assert server.accepted == 1
            children.close()

    run(main())


# -- the read timeout ----------------------------------------------------------------------


def chunks_every(gap: float, count: int, then_silent: float = 0.0) -> Answer:
    """A chunked response: `count` chunks `gap` seconds apart, then (optionally) silence."""

    async def answer(_r: Any, writer: asyncio.StreamWriter, _i: int, _n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(count):
            await asyncio.sleep(gap)
            writer.write(b"2\r\nok\r\n")
            await writer.drain()
        await asyncio.sleep(then_silent)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return False

    return answer


def test_a_steady_stream_longer_than_the_timeout_is_not_cut() -> None:
    async def main() -> None:
        async with Server(chunks_every(0.1, 8)) as server:  # 0.8 s in all, 0.1 s apart
            children = ChildConnections(timeout=0.3)
            assert await post(children, server) == b"ok" * 8
            children.close()

    run(main())


def test_a_child_silent_past_the_timeout_fails_the_wait() -> None:
    async def main() -> None:
        async with Server(chunks_every(0.05, 2, then_silent=1.5)) as server:
            children = ChildConnections(timeout=0.3)
            connection = await children.post(server.url, "/v1/chat/completions", b"{}")
            began = asyncio.get_running_loop().time()
            got = b""
            with pytest.raises(child_http.UpstreamTimeout, match=r"nothing for 0\.3 s"):
                while chunk := await connection.read():
                    got += chunk
            waited = asyncio.get_running_loop().time() - began
            assert got == b"okok" and 0.3 <= waited < 1.0
            children.release(server.url, connection)  # not finished: closed, not kept
            assert connection.closed
            children.close()

    run(main())


# -- splicing a chunked body (the relay's stream) -----------------------------------------

_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _dechunk(wire: bytes) -> tuple[bytes, bool]:
    """A chunked body's data, and whether its last chunk came."""
    data, at = b"", 0
    while True:
        eol = wire.index(b"\r\n", at)
        size = int(wire[at:eol].split(b";")[0], 16)
        if size == 0:
            return data, wire[eol:] == b"\r\n\r\n"
        data += wire[eol + 2 : eol + 2 + size]
        assert wire[eol + 2 + size : eol + 4 + size] == b"\r\n"
        at = eol + 4 + size


def _spliced(reads: list[bytes]) -> tuple[ChildConnection, list[bytes], list[bytes]]:
    """A connection given a streamed answer's head, spliced as the relay does, then fed
    `reads`: what the client got (its chunks), and the pieces that went as they came."""
    connection = ChildConnection()
    connection.data_received(_STREAM_HEAD)
    client: list[bytes] = []
    whole: list[bytes] = []

    def framed(wire: bytes, pieces: list[bytes]) -> None:
        whole.extend(pieces)
        client.append(wire)

    connection.splice(lambda piece: client.append(b"%x\r\n%s\r\n" % (len(piece), piece)), framed)
    for read in reads:
        connection.data_received(read)
    return connection, client, whole


def test_a_read_of_one_whole_chunk_goes_as_it_came() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(3)]
    reads = [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    connection, client, whole = _spliced(reads)
    assert whole == events  # each read went unparsed
    assert client[:3] == reads[:3]  # the child's own bytes, framing and all
    assert connection.complete
    assert _dechunk(b"".join(client) + b"0\r\n\r\n") == (b"".join(events), True)


@pytest.mark.parametrize(
    "reads",
    [
        [b"5\r\nhel", b"lo\r\n", b"5\r\nworld\r\n"],  # one cut inside
        [b"5;ext=1\r\nhello\r\n", b"5\r\nworld\r\n"],  # an extension
        [b"05\r\nhello\r", b"\n5\r\nworld\r\n"],  # a CR at a read's end
    ],
)
def test_other_reads_are_parsed_and_framed_again(reads: list[bytes]) -> None:
    connection, client, _ = _spliced([*reads, b"0\r\n\r\n"])
    assert connection.complete
    assert _dechunk(b"".join(client) + b"0\r\n\r\n") == (b"helloworld", True)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=10),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8),
    extension=st.booleans(),
)
def test_a_spliced_body_reaches_the_client_whole_however_it_is_cut(
    pieces: list[bytes], cuts: list[int], extension: bool
) -> None:
    """Whatever the reads (whole chunks, several, cut anywhere, with extensions), the
    client's chunks carry the body's bytes in order, and the answer ends."""
    ext = b";a=b" if extension else b""
    wire = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in pieces) + b"0\r\n\r\n"
    bounds = sorted({0, len(wire), *(c for c in cuts if c < len(wire))})
    reads = [wire[a:b] for a, b in itertools.pairwise(bounds)]
    connection, client, whole = _spliced(reads)
    assert connection.complete
    assert _dechunk(b"".join(client) + b"0\r\n\r\n") == (b"".join(pieces), True)
    assert all(piece in pieces for piece in whole)
