"""The relay lane: a request nothing must rewrite, carried below aiohttp as bytes.

`blazar.serve.gateway.listener.GatewayHandler` reads each request's head itself
(`read_head`: a head this parser is not sure of goes to aiohttp, as does everything
after it on that connection). For a whole request (head and body in) on a route the
relay carries, `Relayer.prepare` runs what the interpreted path runs before the lease,
all of it synchronous and cheap: the access checks (`Access.relay_grant`: Host, the
key, its scope and rate), the body parsed as the route parses it, the model resolved
as the key sees it, `shape_request` and `steps.require`, then `lanes.decide`. Any
refusal, unknown model or rewrite hands the request's bytes to aiohttp on the same
connection, which answers it exactly as it did before the relay existed.

A request the relay takes is carried out by `Relayer.run`, in a task of its own: a
trace (the observer's, as for any inference request), the scheduler's lease
(`Pipeline.lease`: the same queue, priority and placement), step 6 (`admitted`: the
preflight, the sessions' slot; a cap it sets changes the body's bytes and says so in
`x-blazar-max-tokens-capped`), the body to the child on the one child client
(keep-alive connections), and the child's answer written straight to the client's
transport as it arrives: a whole answer with its Content-Length, a stream as chunks
(each piece the child sent, one chunk). The response's head is the gateway's own
(Content-Type, x-request-id, x-blazar-spec, Cache-Control for a stream, the cap):
the child's headers (Server, Keep-Alive, its CORS) never reach the client, as on the
interpreted path. Writing waits while the client's transport is paused; the child
client pauses reading the child meanwhile (`READ_AHEAD`). The slot goes back when
the answer ends, fails, or the client goes away (the handler cancels the task: the
child's connection is closed, so llama-server stops generating).

Errors are answered in OpenAI's envelope, as the interpreted path does: the lease's
refusals (503 busy with Retry-After, a model that failed to start: 502), the
preflight's 400, the child's own error answer (`child_calls.refused`), a child that
fails before its answer's head (502, or 504 when silent past
`serving.upstream_timeout`); one that breaks a stream off after it began gets the
envelope's error event, then the stream's end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from blazar.observe.speculation import HEADER
from blazar.observe.trace import CURRENT, Trace, prompt_text
from blazar.protocols import EngineRequest, ProtocolError
from blazar.protocols.openai_requests import shape_request
from blazar.serve.gateway.access import Access
from blazar.serve.gateway.lanes import RELAY, Head, Model, Settings, decide
from blazar.serve.http import TRACE, header_text, new_trace_id, parse_json_object
from blazar.serve.request import steps
from blazar.serve.request.admission import admitted
from blazar.serve.request.asks import Ask
from blazar.serve.request.child_calls import child_failed, decode, refused
from blazar.serve.request.envelopes import OPENAI
from blazar.serve.request.exchange import dumps
from blazar.serve.request.pipeline import Leased, Routed
from blazar.serve.routes.services import Services
from blazar.serve.state.remotes import Forward
from blazar.serve.supervisor.child_http import UpstreamError
from blazar.serve.supervisor.scheduler import PREFIX_BLOCK, SchedulerError, Target, prefix_keys

HEAD_LIMIT = 1 << 16  # a head longer than this goes to aiohttp (which refuses it at 8 KiB lines)
BODY_LIMIT = 1 << 20  # a body longer than this goes to aiohttp (its body budget counts it)
NEEDS = {
    "/v1/chat/completions": steps.CHAT,
    "/v1/completions": steps.ANY,
    "/v1/embeddings": steps.EMBEDDINGS,
}
# The bytes a plain head may hold: printable ASCII; CR and LF only as line ends.
_PRINTABLE = bytes(range(0x20, 0x7F)) + b"\r\n"
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
_METHOD = _TOKEN | frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(slots=True)
class RequestHead:
    """A request head as the relay's parser read it. `plain` heads it is sure of (HTTP/1.1,
    a path without query or escapes, token names, one Content-Length, no
    Transfer-Encoding or Upgrade); `size` is the head's bytes with the blank line,
    `length` the body's."""

    size: int
    method: str
    path: str
    headers: dict[str, str]
    length: int
    close: bool
    plain: bool


_NOT_PLAIN = RequestHead(0, "", "", {}, 0, False, False)


def read_head(buffer: bytes | bytearray) -> RequestHead | None:
    """The head at the start of `buffer`; None while it is incomplete. A head this parser
    cannot read with certainty is returned not `plain` (aiohttp then reads it)."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None if len(buffer) < HEAD_LIMIT else _NOT_PLAIN
    raw = bytes(buffer[:end])
    if raw.translate(None, _PRINTABLE):
        return _NOT_PLAIN
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not parts[1].startswith(b"/"):
        return _NOT_PLAIN
    if not parts[0] or not _METHOD.issuperset(parts[0]):  # a method is a token
        return _NOT_PLAIN
    target = parts[1]
    if b"?" in target or b"%" in target or b"#" in target:
        return _NOT_PLAIN
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if b"\r" in line or b"\n" in line:  # a bare CR or LF: aiohttp refuses it
            return _NOT_PLAIN
        name, colon, value = line.partition(b":")
        lowered = name.lower()
        if not colon or not name or not _TOKEN.issuperset(lowered):
            return _NOT_PLAIN
        key = lowered.decode("ascii")
        text = value.strip(b" \t").decode("ascii")
        if key in headers:
            if key in ("content-length", "host", "transfer-encoding", "authorization"):
                return _NOT_PLAIN
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text
    if "transfer-encoding" in headers or "upgrade" in headers:
        return _NOT_PLAIN
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit() or len(length_text) > 12:
        return _NOT_PLAIN
    close = "close" in headers.get("connection", "").lower()
    method = parts[0].decode("ascii")
    return RequestHead(
        end + 4, method, target.decode("ascii"), headers, int(length_text), close, True
    )


@dataclass(slots=True)
class RelayCall:
    """A request the relay carries: what `prepare` found, for `run`."""

    head: RequestHead
    raw: bytes
    body: dict[str, Any]
    target: Target
    key: str | None
    keep_alive: float | None
    priority: bool
    started: int


class Sink:
    """Where the relay writes: the client's connection (`GatewayHandler`)."""

    def __init__(
        self,
        write: Callable[[bytes], None],
        drain: Callable[[], Any],
        paused: Callable[[], bool],
        client: str | None,
    ) -> None:
        self.write, self.drain, self.paused, self.client = write, drain, paused, client
        self.started = False  # a response's head went out
        self.resumed: Callable[[], None] | None = None  # called when the client can take more
        self.close = False  # the client asked to close the connection after this answer


class Relayer:
    """The relay of one gateway: the services (scheduler, pipeline, observer, settings)
    and the access layer."""

    def __init__(self, services: Services, access: Access) -> None:
        self.services = services
        self.access = access
        self._date = (0, "")

    @property
    def on(self) -> bool:
        """serving.relay, as the manifest says now."""
        return self.services.serving.relay

    # -- before the lease: synchronous, in the connection's data_received --------------

    def wanted(self, head: RequestHead) -> bool:
        """Whether to wait for this request's body and consider it for the relay."""
        return (
            head.method == "POST"
            and head.path in NEEDS
            and head.length <= BODY_LIMIT
            and "expect" not in head.headers
            and self.services.serving.relay
        )

    def prepare(self, head: RequestHead, raw: bytes) -> RelayCall | None:
        """The request, if the relay carries it; None: aiohttp's (with the reason nowhere:
        the interpreted path does whatever it did)."""
        started = time.perf_counter_ns()
        headers = head.headers
        allowed, key, grant = self.access.relay_grant(headers)
        if not allowed:
            return None
        try:
            body = parse_json_object(raw)
        except ProtocolError:
            return None
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return None
        services = self.services
        visible = None
        if grant is not None and grant.models is not None:
            sees = grant.sees
            visible = lambda r: sees(r.name, r.aliases)  # noqa: E731
        try:
            target = services.scheduler.resolve(model, visible)
            runtime = target.runtime
            shaping = shape_request(head.path, body, has_vision=runtime.has_vision)
            steps.require(runtime, NEEDS[head.path], shaping.needs)
            keep_alive = steps.keep_alive(headers, body)
        except Exception:  # any refusal is the interpreted path's to answer
            return None
        serving = services.serving
        cache = getattr(serving, "cache", None)
        facts = Model(
            runtime.name,
            dialect=runtime.dialect,
            refusal=runtime.refusal is not None,
            adapters=target.adapters is not None or runtime.lora_field(None) is not None,
            system=runtime.system is not None,
            params=bool(runtime.params),
            max_tokens=runtime.max_tokens,
            child_max_tokens=runtime.child_max_tokens,
            singleflight=runtime.singleflight,
            sessions=bool(runtime.session_bank) and services.sessions is not None,
            spec=runtime.tuning.describe(),
            failover=bool(services.fleet.chains),
            shaped=shaping.body is not None or shaping.reply is not None,
        )
        settings = Settings(
            relay=serving.relay,
            sentinel=serving.sentinel,
            sentinel_enforce=serving.sentinel_enforce,
            cache=bool(getattr(cache, "enabled", False)),
        )
        lane = decide(
            Head(head.method, head.path, headers), body, facts, settings, images=b"image" in raw
        )
        if lane is not RELAY or not self.access.relay_take(grant):
            return None
        priority = headers.get("x-blazar-priority", "").lower() == "high"
        return RelayCall(head, raw, body, target, key, keep_alive, priority, started)

    # -- the call: a task of the connection ---------------------------------------------

    async def run(self, call: RelayCall, sink: Sink) -> bool:
        """Carry the call out, answering on `sink`; whether the connection may carry
        another request (False: close it)."""
        head = call.head
        sink.close = head.close
        sent_id = head.headers.get(TRACE)
        trace_id = header_text(sent_id) if sent_id else new_trace_id()
        observer = self.services.observer
        trace = Trace(trace_id, "openai", head.path)
        trace.asked.started = call.started
        observer.started(trace)
        token = CURRENT.set(trace)
        status = 500
        try:
            status = await self._carry(call, sink, trace, trace_id)
            return not head.close
        except asyncio.CancelledError:
            trace.failed(499, "the client went away before the answer was complete", None)
            status = 499
            raise
        finally:
            CURRENT.reset(token)
            observer.done(trace, status, sink.client, call.key)

    async def _carry(self, call: RelayCall, sink: Sink, trace: Trace, trace_id: str) -> int:
        head, target = call.head, call.target
        runtime = target.runtime
        trace.asking(runtime.name)
        trace.resolved(runtime.name, None)
        pipeline = self.services.pipeline
        extra: dict[str, str] = {}
        prefix: tuple[bytes, ...] = ()
        pool = target.pool
        if (len(pool.members) > 1 or pool.runtime.slots > 1) and len(call.raw) >= PREFIX_BLOCK:
            prefix = prefix_keys(runtime.name, prompt_text(call.body))  # as `Pipeline.route`
        try:
            routed = Routed(target, None, call.keep_alive, call.priority, prefix)
            leased = await pipeline.lease(None, routed, call.started)
        except (ProtocolError, SchedulerError) as exc:
            return self._refuse(sink, trace, trace_id, exc, sink.close)
        assert not isinstance(leased, Forward)  # no failover chain: `decide`
        with leased:
            stream = call.body.get("stream") is True
            try:
                ask = Ask(runtime.name, head.path, call.body, call.raw)
                engine = EngineRequest(head.path, call.body, stream)
                sent = await admitted(
                    pipeline.prompts,
                    pipeline.sessions,
                    leased.lease,
                    ask,
                    engine,
                    slot=leased.slot,  # the prefix's slot (`scheduler.affinity`)
                )
            except ProtocolError as exc:
                return self._refuse(sink, trace, trace_id, exc, sink.close)
            extra.update(sent.headers)
            extra[HEADER] = leased.spec
            trace.sending(head.path, sent.body)
            return await self._exchange(leased, sent.data, stream, sink, trace, trace_id, extra)

    async def _exchange(
        self,
        leased: Leased,
        data: bytes,
        stream: bool,
        sink: Sink,
        trace: Trace,
        trace_id: str,
        extra: dict[str, str],
    ) -> int:
        path = trace.asked.route
        close = sink.close
        connection = None
        try:
            try:
                connection = await leased.children.post(leased.url, path, data)
                status = connection.status
                if status != 200 or not connection.content_type.startswith("text/event-stream"):
                    payload = await connection.read_all()
                else:
                    payload = None
            except leased.errors as exc:
                return self._refuse(sink, trace, trace_id, leased.failed(exc), close)
            if payload is not None:
                trace.answered(payload, status)
                if status != 200:
                    return self._refuse(
                        sink, trace, trace_id, refused(status, decode(payload)), close
                    )
                headers = {"Content-Type": "application/json", **extra}
                sink.write(self._head(200, headers, trace_id, len(payload), close) + payload)
                sink.started = True
                return 200
            headers = {
                "Content-Type": connection.content_type,
                "Cache-Control": "no-cache",
                **extra,
            }
            sink.write(self._head(200, headers, trace_id, None, close))
            sink.started = True
            chunk, write, paused, child = trace.chunk, sink.write, sink.paused, connection

            def forward(piece: bytes) -> None:
                """Each piece as the child's data_received parses it: to the client at once,
                one chunk each (no task woken per token); reading the child stops while the
                client's transport is paused, until it resumes (`Sink.resumed`)."""
                chunk(piece)
                write(b"%x\r\n%s\r\n" % (len(piece), piece))
                if paused():
                    child.hold()

            def framed(wire: bytes, pieces: list[bytes]) -> None:
                """Whole chunks as the child sent them (llama-server's events, one a
                chunk): their bytes, framing and all, are already the client's chunks."""
                for piece in pieces:
                    chunk(piece)
                write(wire)
                if paused():
                    child.hold()

            sink.resumed = child.unhold
            child.splice(forward, framed)
            try:
                while await connection.read():  # b"" at the end; pieces went to `forward`
                    pass
            except leased.errors as exc:
                failed = leased.failed(exc)
                trace.failed(failed.status, failed.message, failed.code)
                event = OPENAI.stream_error(failed.status, failed.message, failed.code)
                sink.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
                return 200
            finally:
                sink.resumed = None
            sink.write(b"0\r\n\r\n")
            return 200
        finally:
            if connection is not None:  # kept if finished; else closed: the child stops
                leased.release(connection)

    def _refuse(
        self,
        sink: Sink,
        trace: Trace,
        trace_id: str,
        exc: ProtocolError | SchedulerError | UpstreamError,
        close: bool,
    ) -> int:
        if isinstance(exc, UpstreamError):
            exc = child_failed(trace.placement.model or "", exc)
        known = steps.failure(exc)
        assert known is not None
        trace.failed(known.status, known.message, known.code)
        payload = OPENAI.body(known.status, known.message, known.code)
        body = dumps(payload)
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if known.retry_after is not None:
            headers["Retry-After"] = str(int(max(1, known.retry_after)))
        sink.write(self._head(known.status, headers, trace_id, len(body), close) + body)
        sink.started = True
        return known.status

    def _head(
        self,
        status: int,
        headers: dict[str, str],
        trace_id: str,
        length: int | None,
        close: bool,
    ) -> bytes:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        lines.append(f"{TRACE}: {trace_id}")
        lines.append(f"Date: {self._date[1]}")
        if length is None:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {length}")
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
