"""A request's trace: what was asked, where it went, what came back.

The gateway's observer (`blazar.serve.state.tracing.Observer.begin`, from the gateway's
one middleware) starts a `Trace` for each inference request and makes it `current()`
for the request's task; the one request path fills it in, stage by stage, through the
trace's methods:

- what was asked (`Asked`): the route and protocol when it arrived, the model name it
  asked for (`asking`, `Pipeline.resolve`), the client and API key when it ended;
- where it went (`Placement`): the model and adapters the name resolved to
  (`resolved`), the instance and how the scheduler chose it (`leased`, from
  `Pipeline.lease`), or the remote that carried it out and why (`forwarded`, from
  `blazar.serve.request.forward`), and the engine endpoint it was sent to (`sending`);
- what came back (`Result`): the answer's bytes or events and when each arrived
  (`answered`, `chunk`, `event`, from `blazar.serve.request.exchange`), the tool loop's
  rounds (`tool_round`), a failure (`failed`, from the middleware or a stream that
  broke off), and the status and duration (`ended`).

Those calls only store references and clock readings; reading the answer (`outcome`),
the sentinels (unless serving.sentinel is false: `checks`) and the timings happen in
`record`, which the observer calls once the
answer has gone out. `record()` is the plain dict that `blazar why` shows and the store
keeps; `timing()` the moments the span exporter needs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from blazar.observe import sentinels
from blazar.observe.cachebust import digest
from blazar.observe.outcome import EXCERPT, Outcome, StreamOutcome, from_response

KEEP_BYTES = 1 << 20  # of a passed-through stream, read when it is done
KEEP_EVENTS = 20_000
TAIL = 16  # chunks kept past KEEP_BYTES: the final events carry usage and finish reason
TAIL_BYTES = 4096  # of a stream's end always read: usage, finish reason, timings
SKIPPED = object()  # an event of a stream's middle, not parsed: a token, as llama-server's

CURRENT: ContextVar[Trace | None] = ContextVar("blazar_trace", default=None)


def current() -> Trace | None:
    """The trace of the request this task is serving, if it is traced."""
    return CURRENT.get()


class Decision(Protocol):
    """How the scheduler chose the instance (`blazar.serve.supervisor.scheduler`'s
    `Decision`, which this layer may not import: its fields, read-only)."""

    @property
    def how(self) -> str: ...  # warm | least_loaded | affinity | spawned | queued

    @property
    def evicted(self) -> tuple[str, ...]: ...

    @property
    def queue_ns(self) -> int: ...

    @property
    def load_ns(self) -> int: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def room_ns(self) -> int: ...  # waiting for room: models holding the memory it needed


@dataclass(slots=True)
class Asked:
    """What was asked: the request as the gateway received it."""

    id: str
    protocol: str
    route: str
    wall: float  # time.time() when it arrived
    started: int  # time.perf_counter_ns() when it arrived
    requested: str | None = None  # the model name it asked for
    client: str | None = None  # the peer's address, noted when it ended
    key: str | None = None  # the name of the API key it authenticated with


@dataclass(slots=True)
class Placement:
    """Where it went: this host's model and instance, or a remote."""

    model: str | None = None
    adapter: str | None = None  # as the name chose them (`fox:0.5+owl`, `none`)
    instance: str | None = None
    replica: int | None = None
    engine: str | None = None
    spec: str | None = None  # speculative decoding mode: off, ngram, draft:NAME
    decision: Decision | None = None
    lease_begin: int = 0  # perf_counter_ns when the lease was asked for
    leased_at: int = 0  # ... and when it was granted; 0: never leased
    remote: str | None = None  # "NAME (URL)": the remote that carried it out
    remote_reason: str | None = None  # why it went there (a remote's model, failover)
    engine_path: str | None = None  # the engine endpoint the request was sent to


@dataclass(slots=True)
class Result:
    """What came back: the status and failure as the client got them, and what `record`
    read of the answer (the outcome, the sentinels' findings, the timings)."""

    status: int = 0
    error: str | None = None
    code: str | None = None
    rejected: str | None = None  # busy, preflight, auth, rate: why it was refused
    stream: bool = False
    tool_rounds: list[dict[str, Any]] | None = None  # the gateway's tool loop
    duration_ns: int = 0
    outcome: Outcome | None = None
    detections: list[sentinels.Detection] | None = None
    first_ns: int | None = None  # first output, ns after it arrived
    gaps: list[int] = field(default_factory=list)  # ns between output events of a stream
    # The response cache's lookup (docs/cache.md): result, tier, similarity, the entry's
    # age and the trace that produced it.
    response_cache: dict[str, Any] | None = None


class Trace:
    """One request: `asked`, `placement` and `result`, filled in by the methods below as
    the request goes; the answer's raw bytes or events are kept here, read in `record`."""

    __slots__ = (
        "_answer_status",
        "_body",
        "_chunks",
        "_events",
        "_kept",
        "_overflow",
        "_payload",
        "_tail",
        "_times",
        "asked",
        "checks",
        "enforce",
        "placement",
        "result",
        "token",
    )

    def __init__(self, trace_id: str, protocol: str, route: str, *, enforce: bool = False):
        self.asked = Asked(trace_id, protocol, route, time.time(), time.perf_counter_ns())
        self.placement = Placement()
        self.result = Result()
        self.checks = True  # serving.sentinel: `record` runs the sentinels at all
        self.enforce = enforce  # serving.sentinel_enforce: `gate` a whole answer
        self.token: Token[Trace | None] | None = None  # while it is `current()`
        self._body: Mapping[str, Any] | None = None
        self._payload: Any = None
        self._answer_status = 0
        self._chunks: list[bytes] | None = None
        self._events: list[Any] | None = None
        self._times: list[int] = []
        self._kept = 0
        self._overflow = False
        self._tail: list[bytes] = []

    # -- what was asked, where it went -------------------------------------------------

    def asking(self, requested: str) -> None:
        """The model name the request asked for, known or not."""
        self.asked.requested = requested

    def resolved(self, model: str, adapter: str | None = None) -> None:
        """The model the name resolved to (a remote's: the name itself), and its adapters."""
        placement = self.placement
        placement.model, placement.adapter = model, adapter

    def leased(
        self,
        instance: str,
        replica: int,
        engine: str | None,
        spec: str | None,
        decision: Decision,
        begin: int,
    ) -> None:
        """`Pipeline.lease` got a slot, asked for at `begin`: the instance, its engine and
        speculative mode, and how the scheduler chose it."""
        placement = self.placement
        placement.instance, placement.replica = instance, replica
        placement.engine, placement.spec, placement.decision = engine, spec, decision
        placement.lease_begin, placement.leased_at = begin, time.perf_counter_ns()

    def forwarded(self, name: str, url: str, reason: str) -> None:
        """`blazar.serve.request.forward` carries the request out on a remote, for `reason`."""
        placement = self.placement
        placement.remote, placement.remote_reason = f"{name} ({url})", reason

    def sending(self, path: str, body: Mapping[str, Any]) -> None:
        """The engine endpoint and the body it gets (read again only in `record`)."""
        self.placement.engine_path, self._body = path, body

    # -- what came back ------------------------------------------------------------------

    def answered(self, payload: Any, status: int) -> None:
        """A whole answer: the engine's bytes (pass-through) or its decoded JSON."""
        self._payload, self._answer_status = payload, status
        self._times.append(time.perf_counter_ns())

    def chunk(self, data: bytes) -> None:
        """A passed-through stream's bytes, as they went to the client."""
        self._times.append(time.perf_counter_ns())
        if self._chunks is None:
            self._chunks, self.result.stream = [], True
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
            self._events, self.result.stream = [], True
        if len(self._events) < KEEP_EVENTS:
            self._events.append(data)
            self._times.append(time.perf_counter_ns())

    def tool_round(self, calls: list[dict[str, Any]], finish: str | None) -> None:
        """One round of the gateway's tool loop (`mcp`): the model's answer ended with
        `finish`, and the MCP tools it called (server, tool, ms, error), run before the
        next round; the last round's answer is the one `record` reads."""
        result = self.result
        if result.tool_rounds is None:
            result.tool_rounds = []
        result.tool_rounds.append({"finish": finish, "calls": calls})

    def failed(self, status: int, message: str, code: str | None) -> None:
        """The request failed with this status (what the client got, or saw mid-stream)."""
        result = self.result
        result.status, result.error, result.code = status, message, code

    def ended(self, status: int, *, client: str | None = None, key: str | None = None) -> None:
        """The request is done: `status` unless a failure said one, its duration, the
        client and the API key's name."""
        result = self.result
        result.status = result.status or status
        result.duration_ns = time.perf_counter_ns() - self.asked.started
        asked = self.asked
        asked.client, asked.key = client, key

    # -- reading it ---------------------------------------------------------------------

    def expectation(self) -> sentinels.Expectation:
        return sentinels.expectation(self._body) if self._body is not None else sentinels.NOTHING

    def gate(self) -> list[sentinels.Detection]:
        """The sentinels' detections on a whole answer, now (serving.sentinel_enforce)."""
        self._read()
        return self.result.detections or []

    def _read(self) -> None:
        result = self.result
        if result.outcome is not None:
            return
        path = self.placement.engine_path or self.asked.route
        expect = self.expectation()
        if self._payload is not None:
            payload = self._payload
            if isinstance(payload, bytes | bytearray):
                payload = self._payload = _json(payload)
            if self._answer_status != 200:  # an error the engine answered: no output to check
                if result.error is None:
                    result.error = engine_error(payload)
                return
            out = result.outcome = from_response(path, payload)
            leased_at = self.placement.leased_at
            if leased_at and out.prompt_ms is not None:
                # Not streamed: the first token came after the wait and the prompt's time.
                per_token = (out.predicted_ms or 0) / max(1, out.generated_tokens or 1)
                waited = leased_at - self.asked.started
                result.first_ns = waited + int((out.prompt_ms + per_token) * 1e6)
        elif self._chunks is not None or self._events is not None:
            result.outcome = self._read_stream(path, expect)
        if result.outcome is not None and self.checks:
            result.detections = sentinels.check(expect, result.outcome)

    def _read_stream(self, path: str, expect: sentinels.Expectation) -> Outcome:
        reader = StreamOutcome(path, keep_text=expect.json)
        first: int | None = None
        last = 0
        gaps = self.result.gaps
        events = self._stream_events() if expect.json else self._lean_events(reader)
        for at, data in events:
            if data is SKIPPED or reader.feed(data):
                if first is None:
                    first = at
                else:
                    gaps.append(at - last)
                last = at
        if first is not None:
            self.result.first_ns = first - self.asked.started
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

    def _lean_events(self, reader: StreamOutcome) -> Iterator[tuple[int, Any]]:
        """A passed-through stream's events as `_stream_events`, but its middle not parsed:
        the head until the text has its excerpt (EXCERPT characters: `blazar why`, the
        emptiness check), the last TAIL_BYTES (the usage chunk, the finish reason, the
        speculative counters), and for each event between them only when it arrived
        (SKIPPED: a token, for the time to first token and the gaps; `reader` counts it,
        and the text is marked an excerpt). Whatever is not plainly one event per line of
        llama-server's (a chunk cut mid-event, CRLF, a tool call in the middle) is parsed
        whole, as before. A JSON check needs the whole text: `_stream_events` then."""
        chunks, times = self._chunks or [], self._times
        if self._events is not None or self._overflow or len(times) < len(chunks):
            yield from self._stream_events()
            return
        tail, size = len(chunks), 0
        while tail > 0 and size < TAIL_BYTES:
            tail -= 1
            size += len(chunks[tail])
        head = 0
        while head < tail and reader.chars < EXCERPT:
            chunk = chunks[head]
            if not chunk.endswith(b"\n\n") or b"\r" in chunk:  # not whole events: all of it
                yield from _sse(chunks[head:], times[head:])
                return
            yield from _sse([chunk], [times[head]])
            head += 1
        middle = chunks[head:tail]
        if any(
            not c.endswith(b"\n\n") or b"\r" in c or b'"tool_calls"' in c or b"[DONE]" in c
            for c in middle
        ):
            yield from _sse(chunks[head:], times[head:])
            return
        if middle:
            for chunk, at in zip(middle, times[head:tail], strict=True):
                for _ in range(chunk.count(b"\n\n")):
                    reader.content_events += 1
                    yield at, SKIPPED
            reader.out.complete = False  # the text is an excerpt
        yield from _sse(chunks[tail:], times[tail:])

    def conversation(self) -> Mapping[str, Any] | None:
        """The body the engine got (for the cache-bust check)."""
        return self._body

    def timing(self) -> dict[str, int]:
        """Wall-clock nanoseconds of the request's moments, for its spans: start and end,
        and once it was leased lease_begin, leased, queue and load."""
        asked, placement = self.asked, self.placement
        wall = int(asked.wall * 1e9)
        timing = {"start": wall, "end": wall + self.result.duration_ns}
        decision = placement.decision
        if decision is not None and placement.leased_at:
            timing["lease_begin"] = wall + placement.lease_begin - asked.started
            timing["leased"] = wall + placement.leased_at - asked.started
            timing["queue"] = decision.queue_ns
            timing["load"] = decision.load_ns
        return timing

    def record(self, *, scrub: bool, cache: dict[str, str] | None = None) -> dict[str, Any]:
        """The trace as kept and shown: plain JSON values, no message text when `scrub`."""
        self._read()
        asked, placement, result = self.asked, self.placement, self.result
        out = result.outcome
        decision = placement.decision
        model = placement.model
        requested_base = (asked.requested or "").partition("#")[0]
        alias = None
        if model and requested_base not in ("", model, f"{model}:latest"):
            alias = requested_base
        return {
            "id": asked.id,
            "time": asked.wall,
            "protocol": asked.protocol,
            "route": asked.route,
            "stream": result.stream,
            "client": asked.client,
            "key": asked.key,
            "requested": asked.requested,
            "model": model,
            "adapter": placement.adapter,
            "alias": alias,
            "instance": placement.instance,
            "replica": placement.replica,
            "engine": placement.engine,
            "decision": decision.how if decision else None,
            "evicted": list(decision.evicted) if decision else [],
            "in_flight": decision.in_flight if decision else None,
            "replicas": decision.replicas if decision else None,
            "queue_ms": _ms(decision.queue_ns) if decision else None,
            "load_ms": _ms(decision.load_ns) if decision else None,
            "waited_for_room": _room(decision),
            "ttft_ms": _ms(result.first_ns),
            "duration_ms": _ms(result.duration_ns),
            "prompt_tokens": out.prompt_tokens if out else None,
            "cached_tokens": out.cached_tokens if out else None,
            "generated_tokens": out.generated_tokens if out else None,
            "tokens_per_second": _round(out.tokens_per_second) if out else None,
            "spec": placement.spec,
            "draft_tokens": out.draft_tokens if out else None,
            "draft_accepted": out.draft_accepted if out else None,
            "finish_reason": out.finish if out else None,
            "image": out.image if out else None,
            "status": result.status,
            "error": result.error,
            "code": result.code,
            "rejected": result.rejected,
            "remote": placement.remote,
            "remote_reason": placement.remote_reason,
            "tool_rounds": result.tool_rounds,
            "response_cache": result.response_cache,
            "sentinels": [d.to_dict() for d in result.detections or []],
            "cache": cache,
            "prompt": _text_facts(prompt_text(self._body), scrub),
            "output": _text_facts(out.text if out else None, scrub),
        }


def _room(decision: Decision | None) -> dict[str, Any] | None:
    """The wait for room, when the load had one: the seconds, and the models unloaded
    to make it (`blazar why` names them)."""
    if decision is None or decision.room_ns <= 0:
        return None
    return {"seconds": round(decision.room_ns / 1e9, 3), "evicted": list(decision.evicted)}


def _sse(chunks: list[bytes], times: list[int]) -> Iterator[tuple[int, Any]]:
    """(when it arrived, its parsed data) for each `data:` event of a passed-through
    stream. Whole events are split off with bytes methods, not line by line: a trace
    reads every token's event once the request is done, on the request path's thread."""
    pending = b""
    at = times[0] if times else 0
    for chunk, at in zip(chunks, times, strict=False):
        last = len(chunk) - 2  # one whole event: its only blank line ends it
        if not pending and last >= 0 and chunk.find(b"\n\n") == last and b"\r" not in chunk:
            # One whole event, as llama-server sends each token: nothing to join or split.
            if (data := _event_data(chunk[:-2])) is not None:
                yield at, data
            continue
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
        if data == b"[DONE]":  # not JSON: said before the parsers fail on it (measured 68k
            return None  # instructions for their three exceptions, once per stream)
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
        if (value := body.get(key)) is not None:
            _texts(value, parts)
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


TAIL_WINDOW = 4096  # bytes of a whole answer's end that `tail_object` looks at


def tail_object(payload: bytes | bytearray, key: str, window: int = TAIL_WINDOW) -> Any:
    """The JSON object under `"key":` in the last `window` bytes of a JSON answer (the
    engine's `timings`, which llama-server writes last), read without parsing the rest
    of the answer (its text): the object from the key's last occurrence up to its first
    closing brace that parses (a flat object of numbers parses at the first). None when
    the window has no such object."""
    end = bytes(payload[-window:])
    at = end.rfind(b'"' + key.encode() + b'":')
    if at < 0:
        return None
    start = end.find(b"{", at)
    if start < 0 or end[at + len(key) + 3 : start].strip():
        return None
    close = start
    for _ in range(8):  # nested objects: a few more braces at most
        close = end.find(b"}", close + 1)
        if close < 0:
            return None
        with contextlib.suppress(orjson.JSONDecodeError):
            found = orjson.loads(end[start : close + 1])
            return found if isinstance(found, dict) else None
    return None


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
