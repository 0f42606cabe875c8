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

Those calls only store references and clock readings (and of a passed-through stream
past its head, a count per piece instead of the piece: `chunk`); reading the answer
(`outcome`: a stream's head and tail, a long whole answer's two ends), the sentinels
(unless serving.sentinel is false: `checks`) and the timings happen in `record`, which
the observer calls once the answer has gone out. `record()` is the plain dict that
`blazar why` shows and the store keeps; `timing()` the moments the span exporter needs.
"""

from __future__ import annotations

import re
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from itertools import pairwise, repeat
from typing import Any, Protocol

import orjson

from blazar.observe import sentinels
from blazar.observe.cachebust import digest
from blazar.observe.outcome import (
    EXCERPT,
    TAIL_WINDOW,
    Outcome,
    StreamOutcome,
    from_ends,
    from_response,
    object_in,
)

# A passed-through stream's pieces kept for reading once it is done (`Trace.chunk`): its
# head, until it holds HEAD_BYTES, for the text's excerpt (EXCERPT characters: at least
# one character a token, and llama-server's chat token event is about 230 bytes with a
# short model name, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":
# "…"}}],"created":…,"id":"chatcmpl-<32>","model":"…","system_fingerprint":"…","object":
# "chat.completion.chunk"}` and a blank line: 200 tokens of up to 320 bytes), and its last
# TAIL_BYTES (the finish, the usage chunk and its timings, about 1 KiB, and [DONE]). Of
# the pieces between them only when each arrived and how many events it ended.
HEAD_BYTES = 64 * 1024
TAIL_BYTES = 4096
KEEP_BYTES = 1 << 20  # the head of a stream whose whole text a JSON check reads
KEEP_EVENTS = 20_000
WHOLE_BYTES = 8192  # a whole answer up to this is parsed whole; a longer one at its ends

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
        "_calls",
        "_counts",
        "_events",
        "_expect",
        "_head",
        "_kept",
        "_limit",
        "_partial",
        "_payload",
        "_state",
        "_tail",
        "_tail_size",
        "_taking",
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
        self._expect: sentinels.Expectation | None = None
        # A passed-through stream (`chunk`): when each piece arrived; the head's pieces
        # (None: no piece yet), their bytes, and whether it still takes pieces (up to
        # `_limit` bytes); the last pieces (at least TAIL_BYTES of them: `_tail_size`);
        # for each piece between them, the events it ended (`_counts`), and the events
        # with a tool call (`_calls`); `_state`: where the bytes between stopped (`_scan`),
        # and `_partial` the start of an event they began (None: too long, not kept).
        self._times = array("q")
        self._head: list[bytes] | None = None
        self._kept = 0
        self._limit = HEAD_BYTES
        self._taking = False
        self._tail: list[bytes] = []
        self._tail_size = 0
        self._counts = array("I")
        self._calls = 0
        self._state = 0
        self._partial: bytes | None = b""
        self._events: list[Any] | None = None

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
        self.placement.engine_path, self._body, self._expect = path, body, None

    # -- what came back ------------------------------------------------------------------

    def answered(self, payload: Any, status: int) -> None:
        """A whole answer: the engine's bytes (pass-through) or its decoded JSON. Kept by
        reference until `record` reads it (a long one at its two ends: `from_ends`)."""
        self._payload, self._answer_status = payload, status

    def chunk(self, data: bytes) -> None:
        """A passed-through stream's bytes, as they went to the client: when they came,
        and the piece itself while the head takes pieces (HEAD_BYTES; KEEP_BYTES when a
        JSON check reads the whole text) or while it is among the last TAIL_BYTES (up to
        twice that before the oldest are shed: `_shed`); a piece that leaves the tail
        leaves only the count of the events it ended and of its tool calls (`_scan`:
        no parsing, no reference kept)."""
        self._times.append(time.perf_counter_ns())
        if self._taking:
            self._head.append(data)  # type: ignore[union-attr]
            self._kept += len(data)
            if self._kept >= self._limit:
                self._taking = False
                self._state, self._partial = _head_end(self._head)  # type: ignore[arg-type]
            return
        if self._head is None:  # the first piece
            self.result.stream = True
            if self.expectation().json:
                self._limit = KEEP_BYTES
            self._head, self._kept, self._taking = [data], len(data), True
            if self._kept >= self._limit:
                self._taking = False
                self._state, self._partial = _head_end(self._head)
            return
        self._tail.append(data)
        self._tail_size += len(data)
        if self._tail_size >= 2 * TAIL_BYTES:
            self._shed()

    def _shed(self) -> None:
        """The tail's oldest pieces, all but its last TAIL_BYTES, left for their counts
        (done when the tail reaches twice that: one pass for a dozen pieces, not one a
        piece). Pieces of one whole event each, as llama-server sends its tokens, are
        checked together; any other, one by one (`_drop`)."""
        tail, size, cut = self._tail, 0, len(self._tail)
        while cut > 0 and size < TAIL_BYTES:
            cut -= 1
            size += len(tail[cut])
        gone = tail[:cut]
        del tail[:cut]
        self._tail_size = size
        if not self._state and _one_event_each(gone):
            self._counts.extend(array("I", [1]) * cut)
            return
        for piece in gone:
            ends, self._state, self._partial, calls = _drop(piece, self._state, self._partial)
            self._counts.append(ends)
            self._calls += calls

    def kept(self) -> tuple[int, int]:
        """The pieces of a passed-through stream this trace holds, and their bytes."""
        pieces = (self._head or []) + self._tail + [self._partial or b""]
        return len(pieces) - 1, sum(map(len, pieces))

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
        """What the request asked of its answer (read once, from the body sent)."""
        if self._expect is None:
            body = self._body
            if body is None:
                return sentinels.NOTHING
            self._expect = sentinels.expectation(body)
        return self._expect

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
            out = None
            if isinstance(payload, bytes | bytearray):
                long = len(payload) > WHOLE_BYTES
                if long and self._answer_status == 200 and self._at_ends(expect):
                    out = from_ends(path, payload)
                if out is None:
                    payload = self._payload = _json(payload)
            if self._answer_status != 200:  # an error the engine answered: no output to check
                if result.error is None:
                    result.error = engine_error(payload)
                return
            out = result.outcome = out or from_response(path, payload)
            leased_at = self.placement.leased_at
            if leased_at and out.prompt_ms is not None:
                # Not streamed: the first token came after the wait and the prompt's time.
                per_token = (out.predicted_ms or 0) / max(1, out.generated_tokens or 1)
                waited = leased_at - self.asked.started
                result.first_ns = waited + int((out.prompt_ms + per_token) * 1e6)
        elif self._head is not None or self._events is not None:
            result.outcome = self._read_stream(path, expect)
        if result.outcome is not None and self.checks:
            result.detections = sentinels.check(expect, result.outcome)

    def _at_ends(self, expect: sentinels.Expectation) -> bool:
        """Whether a long whole answer is read at its ends (`from_ends`): one of one
        choice, whose whole text no check needs (a JSON check, serving.sentinel_enforce)."""
        if expect.json or self.enforce:
            return False
        body = self._body
        return body is None or body.get("n") in (None, 1)

    def _read_stream(self, path: str, expect: sentinels.Expectation) -> Outcome:
        reader = StreamOutcome(path, keep_text=expect.json)
        arrived = array("q")  # when each event that carried output arrived
        if self._events is not None:
            feed, note = reader.feed, arrived.append
            for at, data in zip(self._times, self._events, strict=False):
                if feed(data):
                    note(at)
        else:
            self._read_pieces(reader, arrived)
        result = self.result
        if arrived:
            first, last = arrived[0], arrived[-1]
            result.first_ns = first - self.asked.started
            result.gaps = [b - a for a, b in pairwise(arrived)]
        out = reader.result()
        if out.tokens_per_second is None and out.generated_tokens and arrived:
            seconds = (last - first) / 1e9
            if seconds > 0 and out.generated_tokens > 1:
                out.tokens_per_second = (out.generated_tokens - 1) / seconds
        return out

    def _read_pieces(self, reader: StreamOutcome, arrived: array[int]) -> None:
        """A passed-through stream's events, fed to `reader` (each that carried output
        noted in `arrived`): the head's parsed until the text has its excerpt (all of it
        for a JSON check), the tail's parsed, and each event between them only counted as
        one that carried output (a token, as llama-server sends one an event), at the
        time its piece arrived: the time to first token and the gaps stay exact, the text
        is then an excerpt (`complete` False). Any framing: the pieces are split into
        events wherever they were cut, LF or CRLF (`_Splitter`, `_scan`)."""
        head, times, counts = self._head or [], self._times, self._counts
        tail, size = self._tail, self._tail_size
        if size < TAIL_BYTES:  # a short stream: the head's last pieces are its tail
            cut = len(head)
            while cut > 0 and size < TAIL_BYTES:
                cut -= 1
                size += len(head[cut])
            head, tail = head[:cut], head[cut:] + tail
        events = _Events(reader, arrived)
        taken = events.read(head, times, 0, excerpt=not reader.keep_text)
        skipped, calls = 0, self._calls
        state: int | None = None  # the tail follows on from what was parsed
        if taken < len(head) or counts:
            reader.gap()
        partial: bytes | None = b""
        if taken < len(head) and _one_event_each(head[taken:]):  # as the middle's
            skipped += len(head) - taken
            arrived.extend(times[taken : len(head)])
            state = 0
        elif taken < len(head):  # the rest of the head, counted as the middle was
            state = 0
            for i in range(taken, len(head)):
                piece = head[i]
                ends, state, partial, called = _drop(piece, state, partial)
                skipped += _note(arrived, times[i], ends)
                calls += called
        if counts:
            if taken == len(head):  # an event begun in the head and ended in the middle
                calls += events.pending.count(TOOL_CALLS)
            start = len(head)
            if counts.count(1) == len(counts):  # one event a piece: llama-server's tokens
                arrived.extend(times[start : start + len(counts)])
                skipped += len(counts)
            else:
                for i, ends in enumerate(counts, start):
                    skipped += _note(arrived, times[i], ends)
            state, partial = self._state, self._partial
        at = len(head) + len(counts)
        if state is None:
            state = 0
        elif state & CONTENT and partial is not None:  # the event begun: read whole
            events.pending, state = partial, 0
        else:  # the tail starts where the counted bytes stopped
            events.pending = b"\n" if state == OPEN else b""
        for k, piece in enumerate(tail):
            when = times[at]
            at += 1
            if not state and not events.pending:  # whole events from here: read at once
                events.read(tail, times, k, excerpt=False, offset=at - 1 - k)
                break
            if state & CONTENT:  # an event begun before the tail, not kept: counted
                piece = piece.replace(b"\r", b"") if b"\r" in piece else piece
                if state & OPEN and piece.startswith(b"\n"):  # its blank line, split
                    piece = piece[1:]
                elif (end := piece.find(b"\n\n")) >= 0:
                    piece = piece[end + 2 :]
                else:  # all of the piece is of that event
                    state = _scan(piece, state)[1]
                    continue
                skipped += _note(arrived, when, 1)
                state = 0
            events.piece(piece, when)
        events.end(times[-1] if times else 0)
        reader.content_events += skipped
        reader.out.tool_calls += calls

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


OPEN, CONTENT = 1, 2  # `_scan`'s states: a newline not yet paired; an event begun


def _scan(piece: bytes, state: int) -> tuple[int, int]:
    """The blank lines (events' ends) in `piece`, which follows bytes that stopped in
    `state` (0: at an event's end; OPEN: after a newline that the next may pair; CONTENT:
    inside an event), and the state after it; `\\r` is left out, so CRLF counts as LF.
    One whole event per piece (llama-server's every token) is one bytes count."""
    if not state and piece.endswith(b"\n\n") and piece[-3:-2] != b"\n" and b"\r" not in piece:
        return piece.count(b"\n\n"), 0
    if b"\r" in piece:
        piece = piece.replace(b"\r", b"")
    if not piece:
        return 0, state
    ends = 0
    if state & OPEN and piece[0] == 10:  # a newline, after one: a blank line
        ends, piece, state = 1, piece[1:], 0
        if not piece:
            return 1, 0
    ends += piece.count(b"\n\n")
    text = piece.rstrip(b"\n")
    newlines = len(piece) - len(text)
    begun = newlines < 2 and (bool(text) or bool(state & CONTENT))
    return ends, (CONTENT if begun else 0) | (newlines & 1)


PARTIAL_BYTES = 4096  # of an event begun before the tail, kept to read it whole


TOOL_CALLS = b'"tool_calls"'


def _drop(piece: bytes, state: int, partial: bytes | None) -> tuple[int, int, bytes | None, int]:
    """`_scan` of a piece left unread; the start of the event it leaves begun (what
    follows its last blank line; None when longer than PARTIAL_BYTES, or when it began
    in a piece whose start was not kept), so that the tail reads that event whole; and
    the tool calls it holds (the key, also when cut between this piece and the last)."""
    calls = piece.count(TOOL_CALLS) if TOOL_CALLS in piece else 0
    if state & CONTENT and partial and TOOL_CALLS in partial[-11:] + piece[:11]:
        calls += 1
    ends, after = _scan(piece, state)
    if not after & CONTENT:
        return ends, after, b"", calls
    if b"\r" in piece:
        piece = piece.replace(b"\r", b"")
    if ends:
        at = piece.rfind(b"\n\n")
        rest: bytes | None = piece[at + 2 :] if at >= 0 else piece[1:]  # [1:]: after "\n|\n"
    else:
        rest = partial + piece if partial is not None else None
    return ends, after, rest if rest is None or len(rest) <= PARTIAL_BYTES else None, calls


def _head_end(head: list[bytes]) -> tuple[int, bytes | None]:
    """`_scan`'s state at the end of a stream's head, and the event it leaves begun."""
    last = head[-1]
    if last.strip(b"\r\n"):  # the last piece alone says it
        state = _scan(last, 0)[1]
    else:
        state = 0
        for piece in head:
            state = _scan(piece, state)[1]
    if not state & CONTENT:
        return state, b""
    joined = b"".join(head).replace(b"\r", b"")
    at = joined.rfind(b"\n\n")
    rest = joined[at + 2 :] if at >= 0 else joined
    return state, rest if len(rest) <= PARTIAL_BYTES else None


def _one_event_each(pieces: list[bytes]) -> bool:
    """Whether each piece is one whole event with no tool call (llama-server's tokens):
    each ends with its only two newlines (so no CRLF either). One pass over them all."""
    return all(map(bytes.endswith, pieces, repeat(b"\n\n"))) and (
        (joined := b"".join(pieces)).count(b"\n") == 2 * len(pieces) and TOOL_CALLS not in joined
    )


def _note(arrived: array[int], at: int, events: int) -> int:
    """`events` events that carried output, all arrived at `at`."""
    if events == 1:
        arrived.append(at)
    elif events:
        arrived.extend([at] * events)
    return events


class _Splitter:
    """A passed-through stream's bytes split into its events' blocks (the bytes between
    blank lines), wherever the pieces were cut, LF or CRLF: each handed to `take` with
    when its last piece arrived. A piece that is one whole event (llama-server's every
    token) is handed on as it is, nothing joined or split."""

    __slots__ = ("pending", "take")

    def __init__(self, take: Callable[[int, bytes], None]) -> None:
        self.take = take
        self.pending = b""

    def piece(self, chunk: bytes, at: int) -> None:
        pending = self.pending
        last = len(chunk) - 2  # one whole event: its only blank line ends it
        if not pending and last >= 0 and chunk.find(b"\n\n") == last and b"\r" not in chunk:
            self.take(at, chunk[:-2])
            return
        pending = pending + chunk if pending else chunk
        if b"\r" in pending:
            pending = pending.replace(b"\r\n", b"\n")
        if b"\n\n" in pending:
            *whole, pending = pending.split(b"\n\n")
            for block in whole:
                self.take(at, block)
        self.pending = pending

    def end(self, at: int) -> None:
        """The stream ended: a last event without its blank line still counts."""
        pending, self.pending = self.pending, b""
        if pending.strip():
            self.take(at, pending)


# llama-server's chat token event, from its start to its text, and what follows the text
# when the event's one choice carries nothing else (no tool call, no finish).
TOKEN_START = b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"'
TOKEN_END = b'"}}],"'
TOKEN_TEXTS = re.compile(re.escape(TOKEN_START) + rb'((?:[^"\\]|\\.)*)' + re.escape(TOKEN_END))
TOKEN_BATCH = 16  # pieces read together, at most (the excerpt is checked between batches)


class _Events(_Splitter):
    """A stream's events read into a `StreamOutcome`, and when each that carried output
    arrived (`arrived`). llama-server's chat token event is read without parsing its
    JSON (its text, between TOKEN_START and TOKEN_END: about a fifth of the time that
    parsing and reading the event took); anything else is parsed (`_event_data`)."""

    __slots__ = ("arrived", "reader")

    def __init__(self, reader: StreamOutcome, arrived: array[int]) -> None:
        super().__init__(self.block)
        self.reader, self.arrived = reader, arrived

    def read(
        self, pieces: list[bytes], times: array[int], start: int, *, excerpt: bool, offset: int = 0
    ) -> int:
        """Read `pieces` from `start` (piece i arrived at `times[offset + i]`); with
        `excerpt`, stop at the first event's end past the excerpt's EXCERPT characters.
        The index of the first piece not read. Runs of pieces that are each one chat
        token event are read together (`_tokens`), the others one by one."""
        reader, stop, i = self.reader, len(pieces), start
        while i < stop:
            if excerpt and reader.chars >= EXCERPT and not self.pending:
                return i
            if not self.pending:
                batch = pieces[i : i + TOKEN_BATCH]
                run = list(map(bytes.startswith, batch, repeat(TOKEN_START)))
                n = run.index(False) if False in run else len(run)
                if n > 1:
                    if not self._tokens(batch[:n], times[offset + i : offset + i + n]):
                        for j in range(i, i + n):  # not only token events: one by one
                            self.piece(pieces[j], times[offset + j])
                    i += n
                    continue
            self.piece(pieces[i], times[offset + i])
            i += 1
        return i

    def _tokens(self, pieces: list[bytes], times: array[int]) -> bool:
        """Pieces of whole chat token events (one a piece, as llama-server sends them,
        or several), read together: their texts found by one regular expression over
        them joined, decoded, handed to the reader at once. False (nothing read) when
        they are not only that."""
        joined = b"".join(pieces)
        n = joined.count(b"\n\n")
        if (
            joined.count(b"\n") != 2 * n
            or not all(map(bytes.endswith, pieces, repeat(b"\n\n")))
            or b'"usage"' in joined
        ):
            return False
        found = TOKEN_TEXTS.findall(joined)
        if len(found) != n:
            return False
        if n != len(pieces):  # several events a piece: each at its piece's time
            ends = [p.count(b"\n\n") for p in pieces]
            times = array("q", [at for at, k in zip(times, ends, strict=True) for _ in range(k)])
        try:
            if b"\\" in joined:
                texts = [orjson.loads(b'"' + t + b'"') if b"\\" in t else t.decode() for t in found]
            else:
                texts = [t.decode() for t in found]
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            return False
        if self.reader.tokens(texts) == n:
            self.arrived.extend(times)
        else:
            self.arrived.extend([at for at, text in zip(times, texts, strict=True) if text])
        return True

    def block(self, at: int, block: bytes) -> None:
        if block.startswith(TOKEN_START):
            start = len(TOKEN_START)
            end = block.find(TOKEN_END, start)
            if end > 0 and block.find(b'"usage"', end) < 0 and b"\n" not in block:
                raw = block[start:end]
                text = _unescaped(block, start, end) if b"\\" in raw else raw.decode()
                if text is not None:
                    if self.reader.token(text):
                        self.arrived.append(at)
                    return
        data = _event_data(block)
        if data is not None and self.reader.feed(data):
            self.arrived.append(at)


def _unescaped(chunk: bytes, start: int, end: int) -> str | None:
    """The JSON string from `start` to `end` of `chunk` (its quotes just outside), or
    None when the quote at `end` is itself escaped (then it is not the string's end)."""
    raw = chunk[start:end]
    if (len(raw) - len(raw.rstrip(b"\\"))) % 2:
        return None
    try:
        text = orjson.loads(chunk[start - 1 : end + 1])
    except orjson.JSONDecodeError:
        return None
    return text if isinstance(text, str) else None


def _sse(chunks: list[bytes], times: list[int]) -> Iterator[tuple[int, Any]]:
    """(when it arrived, its parsed data) for each `data:` event of a passed-through
    stream's pieces, as the trace splits them (`_Splitter`)."""
    found: list[tuple[int, Any]] = []

    def take(at: int, block: bytes) -> None:
        if (data := _event_data(block)) is not None:
            found.append((at, data))

    events = _Splitter(take)
    for chunk, at in zip(chunks, times, strict=False):
        events.piece(chunk, at)
    events.end(times[len(chunks) - 1] if chunks and times else 0)
    yield from found


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


def tail_object(payload: bytes | bytearray, key: str, window: int = TAIL_WINDOW) -> Any:
    """The JSON object under `"key":` in the last `window` bytes of a JSON answer (the
    engine's `timings`, which llama-server writes last), read without parsing the rest
    of the answer (its text): `outcome.object_in` at the key's last occurrence."""
    return object_in(bytes(payload[-window:]), key, last=True)


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
