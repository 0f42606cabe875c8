"""A request's trace: what happened to it on the gateway's one request path.

The `observe` middleware (`blazar.serve.state.tracing`) starts a `Trace` for each
inference request and makes it `current()` for the request's task; the request
path fills it in as it goes: `pipeline.resolve` (the name asked for), `pipeline.lease`
(the instance, the scheduler's decision, queue wait and load time), `engine` and
the OpenAI pass-through (what was sent, the answer's bytes or events and when each
arrived), `blazar.serve.gateway.relay` (the remote that carried it out, and why), the
`errors` middleware (a failure). Those calls only store references
and clock readings; reading the answer (`outcome`), the sentinels, the cache-bust
check and the record happen in `finish`, which the observer runs once the answer
has gone out. `record()` is the plain dict that `blazar why` shows and the store keeps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import orjson

from blazar.observe import sentinels
from blazar.observe.cachebust import digest
from blazar.observe.outcome import EXCERPT, Outcome, StreamOutcome, from_response

KEEP_BYTES = 1 << 20  # of a passed-through stream, read when it is done
KEEP_EVENTS = 20_000
TAIL = 16  # chunks kept past KEEP_BYTES: the final events carry usage and finish reason

CURRENT: ContextVar[Trace | None] = ContextVar("blazar_trace", default=None)


def current() -> Trace | None:
    """The trace of the request this task is serving, if it is traced."""
    return CURRENT.get()


class Trace:
    """One request. Attributes are set along the request path; `finish` reads them."""

    __slots__ = (
        "_answer_status",
        "_body",
        "_chunks",
        "_events",
        "_kept",
        "_lease_begin",
        "_leased",
        "_overflow",
        "_payload",
        "_tail",
        "_times",
        "adapter",
        "client",
        "code",
        "decision",
        "detections",
        "duration_ns",
        "enforce",
        "engine",
        "engine_path",
        "error",
        "first_ns",
        "gaps",
        "id",
        "instance",
        "key",
        "model",
        "outcome",
        "protocol",
        "rejected",
        "remote",
        "remote_reason",
        "replica",
        "requested",
        "route",
        "spec",
        "started",
        "status",
        "stream",
        "token",
        "tool_rounds",
        "wall",
    )

    def __init__(self, trace_id: str, protocol: str, route: str, *, enforce: bool = False):
        self.id, self.protocol, self.route, self.enforce = trace_id, protocol, route, enforce
        self.wall = time.time()
        self.started = time.perf_counter_ns()
        self.client: str | None = None
        self.key: str | None = None  # the name of the API key it authenticated with
        self.requested: str | None = None
        self.model: str | None = None
        self.adapter: str | None = None
        self.instance: str | None = None
        self.engine: str | None = None
        self.engine_path: str | None = None
        self.replica: int | None = None
        self.spec: str | None = None  # speculative decoding mode: off, ngram, draft:NAME
        self.decision: Any = None  # the scheduler's Decision
        self._lease_begin = self._leased = 0
        self._body: Mapping[str, Any] | None = None
        self._payload: Any = None
        self._answer_status = 0
        self._chunks: list[bytes] | None = None
        self._events: list[Any] | None = None
        self._times: list[int] = []
        self._kept = 0
        self._overflow = False
        self._tail: list[bytes] = []
        self.stream = False
        self.status = 0
        self.error: str | None = None
        self.code: str | None = None
        self.rejected: str | None = None  # busy, preflight, auth, rate: set by who refused
        self.remote: str | None = None  # "NAME (URL)": the remote that carried it out
        self.remote_reason: str | None = None  # why it went there (remote model, failover)
        self.outcome: Outcome | None = None
        self.detections: list[sentinels.Detection] | None = None
        self.first_ns: int | None = None  # first output, ns after `started`
        self.gaps: list[int] = []  # ns between output events of a stream
        self.duration_ns = 0
        self.token: Any = None  # the context variable's token while it is current
        self.tool_rounds: list[dict[str, Any]] | None = None  # the gateway's tool loop

    # -- along the request path ---------------------------------------------------------

    def leased(self, lease: Any, begin: int) -> None:
        """`pipeline.lease` got a slot: the instance and how the scheduler chose it."""
        instance = lease.member.instance
        self.model = lease.runtime.name  # the adapters were noted when the name resolved
        self.instance, self.replica = instance.spec.key, instance.spec.replica
        self.engine = lease.runtime.engine_tag
        tuning = getattr(lease.runtime, "tuning", None)
        self.spec = tuning.describe() if tuning is not None else None
        self.decision = lease.decision
        self._lease_begin, self._leased = begin, time.perf_counter_ns()

    def forwarded(self, name: str, url: str, reason: str) -> None:
        """`blazar.serve.gateway.relay` carries the request out on a remote, for `reason`."""
        self.remote, self.remote_reason = f"{name} ({url})", reason

    def sending(self, path: str, body: Mapping[str, Any]) -> None:
        """The engine endpoint and the body it gets (read again only in `finish`)."""
        self.engine_path, self._body = path, body

    def answered(self, payload: Any, status: int) -> None:
        """A whole answer: the engine's bytes (pass-through) or its decoded JSON."""
        self._payload, self._answer_status = payload, status
        self._times.append(time.perf_counter_ns())

    def chunk(self, data: bytes) -> None:
        """A passed-through stream's bytes, as they went to the client."""
        self._times.append(time.perf_counter_ns())
        if self._chunks is None:
            self._chunks, self.stream = [], True
        if self._kept < KEEP_BYTES:
            self._chunks.append(data)
            self._kept += len(data)
        else:
            self._overflow = True
            self._tail.append(data)
            if len(self._tail) > TAIL:
                del self._tail[0]

    def event(self, data: Any) -> None:
        """One decoded event of a stream the gateway translates."""
        if self._events is None:
            self._events, self.stream = [], True
        if len(self._events) < KEEP_EVENTS:
            self._events.append(data)
            self._times.append(time.perf_counter_ns())

    def tool_round(self, calls: list[dict[str, Any]], finish: str | None) -> None:
        """One round of the gateway's tool loop (`mcp`): the model's answer ended with
        `finish`, and the MCP tools it called (server, tool, ms, error), run before the
        next round; the last round's answer is the one `finish` reads."""
        if self.tool_rounds is None:
            self.tool_rounds = []
        self.tool_rounds.append({"finish": finish, "calls": calls})

    def failed(self, status: int, message: str, code: str | None) -> None:
        self.status, self.error, self.code = status, message, code

    # -- reading it ---------------------------------------------------------------------

    def expectation(self) -> sentinels.Expectation:
        return sentinels.expectation(self._body) if self._body is not None else sentinels.NOTHING

    def gate(self) -> list[sentinels.Detection]:
        """The sentinels' detections on a whole answer, now (serving.sentinel_enforce)."""
        self._read()
        return self.detections or []

    def _read(self) -> None:
        if self.outcome is not None:
            return
        path = self.engine_path or self.route
        expect = self.expectation()
        if self._payload is not None:
            payload = self._payload
            if isinstance(payload, bytes | bytearray):
                payload = self._payload = _json(payload)
            if self._answer_status != 200:  # an error the engine answered: no output to check
                if self.error is None:
                    self.error = engine_error(payload)
                return
            self.outcome = from_response(path, payload)
            if self._leased and self.outcome.prompt_ms is not None:
                # Not streamed: the first token came after the wait and the prompt's time.
                per_token = (self.outcome.predicted_ms or 0) / max(
                    1, self.outcome.generated_tokens or 1
                )
                waited = self._leased - self.started
                self.first_ns = waited + int((self.outcome.prompt_ms + per_token) * 1e6)
        elif self._chunks is not None or self._events is not None:
            self.outcome = self._read_stream(path, expect)
        if self.outcome is not None:
            self.detections = sentinels.check(expect, self.outcome)

    def _read_stream(self, path: str, expect: sentinels.Expectation) -> Outcome:
        reader = StreamOutcome(path, keep_text=expect.json)
        first: int | None = None
        last = 0
        for at, data in self._stream_events():
            if reader.feed(data):
                if first is None:
                    first = at
                else:
                    self.gaps.append(at - last)
                last = at
        if first is not None:
            self.first_ns = first - self.started
        out = reader.result()
        if self._overflow:
            out.complete = False
        if out.tokens_per_second is None and out.generated_tokens and first is not None:
            seconds = (last - first) / 1e9
            if seconds > 0 and out.generated_tokens > 1:
                out.tokens_per_second = (out.generated_tokens - 1) / seconds
        return out

    def _stream_events(self) -> Iterator[tuple[int, Any]]:
        """(when the event arrived, its data), in order."""
        times = self._times
        if self._events is not None:
            yield from zip(times, self._events, strict=False)
            return
        chunks = self._chunks or []
        yield from _sse(chunks, times)
        if self._tail:  # past KEEP_BYTES: the last chunks, from their first whole event
            joined = b"".join(self._tail)
            start = joined.find(b"\n\n")
            if start >= 0:
                yield from _sse([joined[start + 2 :]], [times[-1]])

    def conversation(self) -> Mapping[str, Any] | None:
        """The body the engine got (for the cache-bust check)."""
        return self._body

    def record(self, *, scrub: bool, cache: dict[str, str] | None = None) -> dict[str, Any]:
        """The trace as kept and shown: plain JSON values, no message text when `scrub`."""
        self._read()
        out = self.outcome
        decision = self.decision
        requested_base = (self.requested or "").partition("#")[0]
        alias = None
        if self.model and requested_base not in ("", self.model, f"{self.model}:latest"):
            alias = requested_base
        return {
            "id": self.id,
            "time": self.wall,
            "protocol": self.protocol,
            "route": self.route,
            "stream": self.stream,
            "client": self.client,
            "key": self.key,
            "requested": self.requested,
            "model": self.model,
            "adapter": self.adapter,
            "alias": alias,
            "instance": self.instance,
            "replica": self.replica,
            "engine": self.engine,
            "decision": getattr(decision, "how", None),
            "evicted": list(getattr(decision, "evicted", ())),
            "in_flight": getattr(decision, "in_flight", None),
            "replicas": getattr(decision, "replicas", None),
            "queue_ms": _ms(getattr(decision, "queue_ns", None)),
            "load_ms": _ms(getattr(decision, "load_ns", None)),
            "ttft_ms": _ms(self.first_ns),
            "duration_ms": _ms(self.duration_ns),
            "prompt_tokens": out.prompt_tokens if out else None,
            "cached_tokens": out.cached_tokens if out else None,
            "generated_tokens": out.generated_tokens if out else None,
            "tokens_per_second": _round(out.tokens_per_second) if out else None,
            "spec": self.spec,
            "draft_tokens": out.draft_tokens if out else None,
            "draft_accepted": out.draft_accepted if out else None,
            "finish_reason": out.finish if out else None,
            "status": self.status,
            "error": self.error,
            "code": self.code,
            "rejected": self.rejected,
            "remote": self.remote,
            "remote_reason": self.remote_reason,
            "tool_rounds": self.tool_rounds,
            "sentinels": [d.to_dict() for d in self.detections or []],
            "cache": cache,
            "prompt": _text_facts(prompt_text(self._body), scrub),
            "output": _text_facts(out.text if out else None, scrub),
        }


def _sse(chunks: list[bytes], times: list[int]) -> Iterator[tuple[int, Any]]:
    """(when it arrived, its parsed data) for each `data:` event of a passed-through
    stream. Whole events are split off with bytes methods, not line by line: a trace
    reads every token's event once the request is done, on the request path's thread."""
    pending = b""
    at = times[0] if times else 0
    for chunk, at in zip(chunks, times, strict=False):
        pending = pending + chunk if pending else chunk
        if b"\r" in pending:
            pending = pending.replace(b"\r\n", b"\n")
        if b"\n\n" not in pending:
            continue
        *whole, pending = pending.split(b"\n\n")
        for block in whole:
            if (data := _event_data(block)) is not None:
                yield at, data
    if pending.strip() and (data := _event_data(pending)) is not None:
        yield at, data


def _event_data(block: bytes) -> Any:
    """An event's `data:` lines, parsed as JSON; None when it has none, or they are not
    JSON (`[DONE]`, a comment): nothing a trace reads."""
    if block.startswith(b"data: ") and b"\n" not in block:  # llama-server's every event
        data = block[6:]
    else:
        lines = [
            line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        ]
        if not lines:
            return None
        data = b"\n".join(lines)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _json(data)


def prompt_text(body: Mapping[str, Any] | None) -> str | None:
    """The text of a request's prompt: every message's text, in order."""
    if body is None:
        return None
    parts: list[str] = []
    for key in ("system", "instructions", "prompt", "input"):
        _texts(body.get(key), parts)
    for message in body.get("messages") or []:
        if isinstance(message, dict):  # JSON: a dict, never another Mapping (a slow check)
            _texts(message.get("content"), parts)
    return "\n".join(parts) if parts else None


def _texts(value: Any, parts: list[str]) -> None:
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, dict):
                _texts(item.get("text") if "text" in item else item.get("content"), parts)


def _text_facts(text: str | None, scrub: bool) -> dict[str, Any] | None:
    """Length and hash always; an excerpt unless serving.pii_scrub."""
    if text is None:
        return None
    facts: dict[str, Any] = {"chars": len(text), "hash": digest(text)}
    if not scrub:
        facts["excerpt"] = text[:EXCERPT]
    return facts


def engine_error(payload: Any) -> str | None:
    """The message of an error body in OpenAI's, Anthropic's or ollama's shape."""
    error = payload.get("error") if isinstance(payload, Mapping) else payload
    if isinstance(error, Mapping):
        error = error.get("message")
    return str(error)[:500] if error else None


def _json(payload: bytes | bytearray) -> Any:
    """The engine's answer, parsed (orjson: a few times faster than json on the request
    path's thread); what orjson refuses and json takes (NaN) still parses."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        import json

        try:
            return json.loads(payload)
        except ValueError:
            return None


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
