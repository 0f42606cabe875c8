"""How the gateway listens: TCP or TLS, a deadline for request heads, connections per client.

The daemon starts a `GatewaySite` on its aiohttp runner instead of aiohttp's
`TCPSite`. Each connection gets a `GatewayHandler` (aiohttp's own request
handler) that:

- is admitted only while its client address holds fewer than
  `serving.max_connections_per_client` connections; beyond that it is answered
  503 and closed before anything is read (`Admission`);
- must send a whole request head within `serving.header_timeout` of opening or
  of its last response (aiohttp's keep-alive deadline, which also closes a
  connection that stays silent or stops halfway through its headers: slowloris).

A request head aiohttp's parser refuses (a control byte or bare CR in a header, a
line over 8,190 bytes, a bad request line) is answered 400 and logged as one line
with its cause and the client's address (`malformed_head`): aiohttp's own handler
logs the raw line, which may hold a key, with a traceback, at ERROR, for anything
anyone can send without a key.

Bodies have their own deadline in the access middleware (`blazar.serve.gateway.access`).
With `serving.tls_cert`/`tls_key` the site speaks TLS only (`TLSFiles`): a pair
that is missing, unreadable or mismatched refuses to start, naming the file, and
`reload_if_changed` (each control-loop pass) loads rotated files into the same
context, so new connections get the new certificate without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from blazar.errors import BlazarError
from blazar.serve.gateway.relay import RelayCall, Relayer, Sink, read_head
from specs.serving import Serving

log = logging.getLogger(__name__)

RELAYER = web.AppKey("relayer", Relayer)  # build_app's relay, which GatewaySite's handlers use
HOLD_LIMIT = 2 << 20  # bytes held for the next requests while one is relayed: then pause
BODY_GRACE = 1.0  # seconds a relayed request's body may trail its head; then aiohttp's

_BUSY_TEXT = b"too many open connections from this address; retry later\n"
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


class TLSFilesError(BlazarError):
    """A TLS certificate or key that cannot be used; the message names the file."""


def _readable(field: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TLSFilesError(
            f"serving.{field} {path}: cannot read it ({exc.strerror}); fix the path or its "
            "permissions, or remove tls_cert and tls_key to serve plain HTTP"
        ) from None


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context (TLS 1.2 or newer) for the pair, or TLSFilesError naming the file."""
    if b"-----BEGIN CERTIFICATE-----" not in _readable("tls_cert", cert):
        raise TLSFilesError(f"serving.tls_cert {cert}: it holds no PEM certificate")
    if b"PRIVATE KEY-----" not in _readable("tls_key", key):
        raise TLSFilesError(f"serving.tls_key {key}: it holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, cert, key)
    return context


def _load(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TLSFilesError(
                f"serving.tls_key {key} does not match serving.tls_cert {cert}: give the "
                "private key the certificate was issued for"
            ) from None
        raise TLSFilesError(
            f"serving.tls_cert {cert} and serving.tls_key {key} cannot be used together "
            f"({exc.reason or exc}); check that both are PEM files and the key is not "
            "encrypted"
        ) from None


class TLSFiles:
    """The certificate pair a TLS gateway serves, reloaded into its context on change."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = tls_context(cert, key)
        self._stamp = self._mtimes()

    def _mtimes(self) -> tuple[float, float]:
        try:
            return (self.cert.stat().st_mtime, self.key.stat().st_mtime)
        except OSError:
            return (0.0, 0.0)

    def reload_if_changed(self) -> str | None:
        """Load the files again if they changed; what happened, for serve's log."""
        stamp = self._mtimes()
        if stamp == self._stamp:
            return None
        try:
            tls_context(self.cert, self.key)  # the whole check first: a bad pair changes nothing
            _load(self.context, self.cert, self.key)
        except TLSFilesError as exc:
            return f"TLS files changed but are not usable, keeping the loaded ones: {exc}"
        self._stamp = stamp
        return f"TLS certificate reloaded from {self.cert}"


class Admission:
    """Open connections per client address, against a limit read at each admission."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    def admit(self, client: str) -> bool:
        if self.open[client] >= self.limit():
            return False
        self.open[client] += 1
        return True

    def leave(self, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]


# The prose that opens a line of a parse error's message ("Invalid header value char",
# "Got more than 8190 bytes when reading"): words, with no quote, slash, underscore or
# backslash, so none of the request's own bytes, which follow it after a colon or a
# quote (or make up the whole message: a refused path, which never holds a space).
_PROSE = re.compile(r"[A-Za-z][A-Za-z0-9 ,.()-]*")


def malformed_head(exc: HttpProcessingError) -> str:
    """Why aiohttp's parser refused a request head, in its words but without the bytes it
    quotes (the C parser adds the raw line under its reason, the Python one after a
    colon): the prose lines of its message, or the error's class when it has none."""
    reasons = []
    for line in str(exc.message).splitlines():
        match = _PROSE.match(line.strip())
        text = match.group(0).strip(" ,.") if match else ""
        if " " in text:  # a phrase, not the `b` of a quoted b'...'
            reasons.append(text)
    return ": ".join(reasons)[:200] or type(exc).__name__


class GatewayHandler(web.RequestHandler):
    """aiohttp's request handler, admitted per client address first, that logs a
    malformed request as one line without its bytes, and reads each request's head
    itself for the relay (`blazar.serve.gateway.relay`).

    The bytes a connection brings are held here until a request's head is in. A
    request the relay carries (head and body in, aiohttp idle on this connection: no
    answer of its own still going out) is carried out by a task of the relay, which
    writes its answer to the transport; the bytes behind it wait for its end. Any
    other request's bytes go to aiohttp's parser as they came, and once one of them
    is a head the relay's parser is not sure of, everything after it does too."""

    def __init__(
        self,
        manager: web.Server,
        *,
        admission: Admission,
        relayer: Relayer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self.admission = admission
        self.client: str | None = None
        self.relayer = relayer
        self._held = bytearray()  # read, not yet given to aiohttp or the relay
        self._owed = 0  # bytes of a message given to aiohttp still to come; -1: all from now
        self._relay: asyncio.Task[None] | None = None
        self._grace: asyncio.TimerHandle | None = None
        self._late = False  # the held request's body came too late for the relay
        self._handed = False  # aiohttp got a request on this connection
        self._held_paused = False
        self._sink: Sink | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self.admission.admit(client):
            writer = cast(asyncio.WriteTransport, transport)  # uvloop's is no subclass
            writer.write(BUSY)
            writer.close()
            return
        self.client = client
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.client is None:
            return
        if not data:  # aiohttp's own call on resume: its paused parser reads what it holds
            super().data_received(data)
            return
        owed = self._owed
        relayer = self.relayer
        if relayer is None or owed < 0 or (not owed and not self._held and not relayer.on):
            if relayer is not None and owed == 0:
                self._owed = -1  # the relay off: this connection is aiohttp's, as it always was
            super().data_received(data)
            return
        if owed:
            if len(data) <= owed:
                self._owed -= len(data)
                super().data_received(data)
                return
            self._owed = 0
            super().data_received(data[:owed])
            data = data[owed:]
        self._held += data
        if self._relay is None:
            self._next()
        elif len(self._held) > HOLD_LIMIT and not self._held_paused and self.transport:
            self._held_paused = True
            self.transport.pause_reading()

    # -- the relay ----------------------------------------------------------------------

    def _idle(self) -> bool:
        """aiohttp waits for a request on this connection: no answer of its own going out."""
        if not self._handed:  # (its task may not have started yet: Python < 3.12)
            return True
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._messages

    def _next(self) -> None:
        """The held bytes' next requests: relayed, or given to aiohttp."""
        relayer = self.relayer
        assert relayer is not None
        held = self._held
        while held and self._relay is None and self._owed == 0 and not self._force_close:
            head = read_head(held)
            if head is None:
                return  # aiohttp's deadline for a head applies: it waits for one
            if not head.plain:  # this one and all after it: aiohttp's
                self._owed = -1
                data = bytes(held)
                held.clear()
                super().data_received(data)
                return
            total = head.size + head.length
            if not self._late and self._idle() and relayer.wanted(head):
                if len(held) < total:
                    self._wait_for_body()
                    return
                try:
                    call = relayer.prepare(head, bytes(held[head.size : total]))
                except Exception:  # a bug: aiohttp's lane answers, the log has the traceback
                    log.exception("the relay could not read %s %s", head.method, head.path)
                    call = None
                if call is not None:
                    self._stop_grace()
                    del held[:total]
                    self._start(call)
                    return
            self._stop_grace()
            self._late = False
            given = min(total, len(held))
            data = bytes(held[:given])
            del held[:given]
            self._owed = total - given
            self._handed = True
            super().data_received(data)

    def _wait_for_body(self) -> None:
        """A relayed request's body trails its head: wait BODY_GRACE for it, then give it to
        aiohttp (whose serving.body_timeout applies); aiohttp's head deadline waits too."""
        if self._grace is not None:
            return
        loop = self._loop
        self._next_keepalive_close_time = max(
            self._next_keepalive_close_time, loop.time() + BODY_GRACE + 1
        )
        self._grace = loop.call_later(BODY_GRACE, self._graced)

    def _graced(self) -> None:
        self._grace = None
        if self._relay is None and self.client is not None:
            self._late = True  # the waiting request goes to aiohttp, as far as it came
            self._next()

    def _stop_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _start(self, call: RelayCall) -> None:
        relayer = self.relayer
        assert relayer is not None
        # aiohttp's keep-alive deadline must not close the connection while it answers.
        self._next_keepalive_close_time = self._loop.time() + 1e6
        sink = Sink(self._send, self._drain_helper, self._writing_paused, self.client)
        self._sink = sink
        self._relay = self._loop.create_task(self._relayed(relayer, call, sink))

    def resume_writing(self) -> None:
        super().resume_writing()
        sink = self._sink
        if sink is not None and sink.resumed is not None:
            sink.resumed()  # the relay reads the child again

    def _send(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)

    def _writing_paused(self) -> bool:
        return self._paused

    async def _relayed(self, relayer: Relayer, call: RelayCall, sink: Sink) -> None:
        keep = False
        try:
            keep = await relayer.run(call, sink)
        except asyncio.CancelledError:
            return  # the connection is gone (connection_lost cancels it)
        except ConnectionError:
            keep = False
        except Exception:  # a bug: the log gets its traceback, the client a closed connection
            log.exception("relaying %s %s failed", call.head.method, call.head.path)
        finally:
            self._relay = None
            self._sink = None
        transport = self.transport
        if transport is None:
            return
        if not keep or self._force_close:
            self.force_close()
            transport.close()
            return
        if self._keepalive_timeout > 0:
            loop = self._loop
            self._next_keepalive_close_time = loop.time() + self._keepalive_timeout
            if self._keepalive_handle is not None:
                self._keepalive_handle.cancel()
            self._keepalive_handle = loop.call_at(
                self._next_keepalive_close_time, self._process_keepalive
            )
        if self._held_paused:
            self._held_paused = False
            transport.resume_reading()
        self._next()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.client is None:
            return  # refused: aiohttp never saw it
        self._stop_grace()
        if self._relay is not None:
            self._relay.cancel()  # the child's connection closes: it stops generating
            self._relay = None
        self.admission.leave(self.client)
        self.client = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request head aiohttp's parser refused: one line in serve's log, a 400 that
        quotes nothing back, and the connection closed. Any other error is aiohttp's to
        report (a handler's exception is Blazar's bug: its traceback belongs in the log)."""
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        reason = malformed_head(exc)
        client = self.client or request.remote or "unknown"
        log.info("refused a malformed request from %s: %s (%s)", client, reason, type(exc).__name__)
        if request.writer.output_size > 0:  # a response has begun: only closing is left
            raise ConnectionError(f"malformed request from {client} after a response began")
        response = web.Response(status=status, text=f"{status} Bad Request: {reason}\n")
        response.force_close()
        return response


@dataclass
class Limits:
    """What a new connection is held to, read when it opens (so a reload applies)."""

    header_timeout: float
    max_connections_per_client: int

    @classmethod
    def of(cls, serving: Serving) -> Limits:
        return cls(serving.header_timeout, serving.max_connections_per_client)


class GatewaySite(web.BaseSite):
    """A TCP (or TLS) site whose connections are `GatewayHandler`s held to `limits`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: Limits,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self.limits = host, port, limits
        self.admission = Admission(lambda: self.limits.max_connections_per_client)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        app = getattr(self._runner, "app", None)
        relayer = app.get(RELAYER) if isinstance(app, web.Application) else None

        def handler() -> GatewayHandler:
            return GatewayHandler(
                server,
                admission=self.admission,
                relayer=relayer,
                loop=loop,
                access_log=None,  # requests are never logged with their headers
                keepalive_timeout=self.limits.header_timeout,
            )

        self._server = await loop.create_server(
            handler, self._host, self._port, ssl=self._ssl_context, reuse_address=True
        )
