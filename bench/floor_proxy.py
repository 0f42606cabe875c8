"""The floor: the least a Python proxy can do per request, to set Blazar's relay against.

    .venv/bin/python bench/floor_proxy.py UPSTREAM_URL PORT [--uvloop]

A bare asyncio protocol in front of one llama-server child, bound to 127.0.0.1:PORT. It
does only what any HTTP/1.1 pass-through must: find each request's head and its
Content-Length, write head and body to a pooled keep-alive connection to the child, find
where the child's answer ends (Content-Length or chunked framing) and write the child's
bytes to the client as they arrive. No access check, no model resolution, no scheduler,
no trace, no metrics, no head of its own. `bench/gateway_overhead.py --front floor` runs
it in place of `blazar serve` and measures it with the same client and the same method,
so the figures say how much of the gateway's cost per request is Python and asyncio on
this machine and how much is Blazar's own work. It handles what the benchmark sends and
nothing more (no pipelining, no Expect, no errors beyond closing): it is a yardstick,
not a server.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from urllib.parse import urlsplit

REUSE_IDLE = 4.0  # seconds, as Blazar's child client


class Upstream(asyncio.Protocol):
    """One keep-alive connection to the child, one answer at a time, spliced to `client`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.pool = proxy.pool
        self.request = b""
        self.received = False
        self.reused = False
        self.transport: asyncio.Transport | None = None
        self.client: Downstream | None = None
        self.buffer = b""
        self.head_done = False
        self.left = 0  # body bytes still due (Content-Length), or -1: chunked
        self.reusable = True
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, client: Downstream, request: bytes) -> None:
        self.client, self.buffer, self.head_done, self.left = client, b"", False, 0
        self.request, self.received = request, False
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        self.received = True
        client.transport.write(data)
        if self.head_done and self.left > 0:  # the usual case: a body piece
            self.left -= len(data)
            if self.left <= 0:
                self.done()
            return
        self.buffer += data
        if not self.head_done:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            self.buffer = self.buffer[end + 4 :]
            self.head_done = True
            if b"transfer-encoding: chunked" in head:
                self.left, self.reusable = -1, False  # llama-server closes after a stream
            else:
                at = head.find(b"content-length:")
                self.left = int(head[at + 15 : head.find(b"\r\n", at) % (len(head) + 1)])
                self.left -= len(self.buffer)
                self.buffer = b""
                if self.left <= 0:
                    self.done()
                return
        if self.left < 0 and self.buffer.endswith(b"0\r\n\r\n"):
            self.done()
        elif self.left < 0:
            self.buffer = self.buffer[-5:]

    def done(self) -> None:
        client, self.client = self.client, None
        if self.reusable and self.transport is not None:
            self.idle_since = time.monotonic()
            self.pool.append(self)
        elif self.transport is not None:
            self.transport.close()
        if client is not None:
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        client, self.client = self.client, None
        if client is None:
            return
        if self.reused and not self.received:  # closed by the child as it was reused: anew
            asyncio.get_running_loop().create_task(self.proxy.carry(client, self.request))
        else:
            client.transport.close()


class Downstream(asyncio.Protocol):
    """One client connection: requests one at a time, each carried by an `Upstream`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport
        self.buffer = b""
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self.next()

    def next(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end]
        at = head.lower().find(b"content-length:")
        length = int(head[at + 15 : head.find(b"\r\n", at) % (len(head) + 1)]) if at >= 0 else 0
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        request, self.buffer = self.buffer[:total], self.buffer[total:]
        self.busy = True
        asyncio.get_running_loop().create_task(self.proxy.carry(self, request))

    def answered(self) -> None:
        self.busy = False
        if self.buffer:
            self.next()


class Proxy:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.pool: list[Upstream] = []

    async def carry(self, client: Downstream, request: bytes) -> None:
        upstream = None
        while self.pool and upstream is None:  # llama-server drops a connection idle 5 s
            upstream = self.pool.pop()
            if time.monotonic() - upstream.idle_since > REUSE_IDLE:
                assert upstream.transport is not None
                upstream.transport.close()
                upstream = None
        if upstream is not None:
            upstream.reused = True
        if upstream is None:
            loop = asyncio.get_running_loop()
            _, upstream = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        upstream.start(client, request)


async def serve(upstream: str, port: int) -> None:
    parts = urlsplit(upstream)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 80)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Downstream(proxy), "127.0.0.1", port)
    print(f"floor proxy on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream")
    parser.add_argument("port", type=int)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop  # type: ignore[import-not-found, unused-ignore]

        uvloop.run(serve(args.upstream, args.port))
    else:
        asyncio.run(serve(args.upstream, args.port))


if __name__ == "__main__":
    main()
