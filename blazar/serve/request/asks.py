"""What a route hands the pipeline: a request parsed and checked (`Ask`), how it is put to
an engine (`Plan`) and how the engine's answer comes back (`Answer`).

A route module only translates: it parses the client's body into an `Ask` subclass
that knows the request's protocol, and `blazar.serve.request.pipeline.Pipeline` does
the rest (resolve, require, keep_alive, lease, admit, trace, call, release) the same
way for every route. Once the model is resolved, the pipeline asks the `Ask` for a
`Plan` fit for the engine that will answer: `native` for a llama-server child (its own
endpoints: `/completion`, `/v1/messages`, `/apply-template`, ...), `openai` for an
upstream that speaks only OpenAI's API (a remote OpenAI-compatible server, an engine
lane whose `dialect` is "openai"). The plan's `answer` builds, for each request, the
`Answer` that turns the engine's bytes into the client's: a whole answer, or a stream
event by event (or chunk by chunk, for a pass-through).

Nothing here does I/O but the hooks an `Answer` may await (`Answering.child`: small
helper calls on the leased child, never traced as the request's exchange).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from blazar.protocols import EngineRequest, LoadOnly, ProtocolError
from blazar.serve.request.envelopes import OPENAI, Envelope
from blazar.serve.request.steps import CHAT

if TYPE_CHECKING:
    from blazar.serve.supervisor.runtime import ModelRuntime
    from blazar.serve.supervisor.scheduler import Target
    from specs.serving import Serving

NATIVE, OPENAI_DIALECT = "llama-server", "openai"  # what an engine's HTTP API speaks


class Helpers(Protocol):
    """Small native calls on the leased child that are not the request's exchange
    (`blazar.serve.request.child_calls.LeasedChild`): never traced as its answer."""

    async def apply_template(self, messages: Any) -> str: ...

    async def tokenize(self, text: str) -> list[int]: ...


@dataclass(slots=True)
class Answering:
    """What an answer is built with once the request is about to be called: the name the
    client asked for (echoed back on every protocol), the request's clock, the leased
    child's helper calls (None on a remote), and whether the answer is another request's
    (singleflight)."""

    model: str
    started: int  # time.perf_counter_ns() when the request arrived
    load_ns: int = 0  # spent loading the model for it; 0 when it was ready
    child: Helpers | None = None
    shared: bool = False  # an answer singleflight shares from another request's call

    def total(self) -> int:
        return time.perf_counter_ns() - self.started


class Answer:
    """The engine's answer, for the client: `whole`, or a stream (`start`, then `feed`
    per event or `feed_bytes` per chunk when `raw`, then `end`). `error` is the event
    that ends a stream the engine broke off (the headers are gone by then)."""

    content_type: str | None = "text/event-stream"  # None: the engine's own
    raw = False  # a pass-through: the engine's chunks go through `feed_bytes`, undecoded
    rewrites = True  # with `raw`: False when `feed_bytes` would give each chunk back as is

    def __init__(self, answering: Answering, envelope: Envelope = OPENAI) -> None:
        self.answering = answering
        self.envelope = envelope

    async def whole(self, payload: bytes) -> bytes | dict[str, Any]:
        """A whole (status 200) answer: the body to send, as bytes or a JSON object."""
        return payload

    def start(self) -> bytes:
        return b""

    def feed(self, data: Any) -> bytes:
        """One decoded event of the engine's stream (JSON, or the text `[DONE]`)."""
        raise NotImplementedError

    def feed_bytes(self, chunk: bytes) -> bytes:
        return chunk

    async def end(self) -> bytes:
        return b""

    def error(self, failed: ProtocolError) -> bytes:
        return self.envelope.stream_error(failed.status, failed.message, failed.code)

    def refusal(self, status: int, payload: Any) -> ProtocolError | None:
        """The engine's error answer in this route's words; None: the pipeline's reading."""
        return None


@dataclass(frozen=True)
class Plan:
    """A request as one engine gets it: the engine request, the `Answer` for its reply,
    and what it needs of the model beyond the route's kind (`need`, None: the Ask's)."""

    engine: EngineRequest
    answer: Callable[[Answering], Answer]
    needs: tuple[str, ...] = ()  # TOOLS, THINKING: what the chat template must render
    need: str | None = None
    # After the lease, before the preflight: the engine request made with the leased
    # child's helpers (ollama's `context` puts earlier tokens before the prompt).
    prepare: Callable[[Answering], Awaitable[EngineRequest]] | None = None


@dataclass
class Ask:
    """One client request, translated by its route; subclasses give the plans.

    `body` is the client's parsed JSON and `raw` its bytes: a plan whose engine body is
    `body` itself, unchanged, sends `raw` as it came (the pass-through's fast path).
    `path` is the route's (for traces, defaults and forwarding), `size` the body's
    length (it bounds the prompt's tokens for the preflight)."""

    model: str
    path: str
    body: dict[str, Any]
    raw: bytes | None = None
    envelope: Envelope = OPENAI
    need: str = CHAT
    hint: str = ""  # the route's way out for a model without a chat template
    shareable: bool = False  # identical concurrent requests may share one call
    deferred: bool = False  # work queued for later (an async job): checked, not leased
    images: bool = False  # it may carry images: `resolved` fetches and checks them
    started: int = field(default_factory=time.perf_counter_ns)

    @property
    def size(self) -> int:
        return len(self.raw) if self.raw is not None else 0

    async def resolved(self, runtime: ModelRuntime, serving: Serving) -> None:
        """Once the model is known, before its plan, for an Ask with `images`: fetch and
        check them (`blazar.serve.request.images`), or refuse them for a model without a
        projector. Only for this host's models: a remote checks what it gets."""

    def native(self, runtime: ModelRuntime, target: Target) -> Plan | LoadOnly:
        """The plan for a llama-server child serving `runtime`."""
        raise NotImplementedError

    def openai(self, runtime: ModelRuntime | None) -> Plan | LoadOnly:
        """The plan for an upstream that speaks only OpenAI's API: a local engine serving
        `runtime`, or (None) a remote."""
        raise ProtocolError(
            400,
            f"{self.path} cannot be carried out by model '{self.model}''s engine, which "
            "speaks only OpenAI's API; use /v1/chat/completions",
            "invalid_request_error",
        )

    def loaded(self, load: LoadOnly, *, unloaded: bool) -> dict[str, Any]:
        """The answer to a request with nothing to generate (ollama's load and unload)."""
        raise ProtocolError(400, "nothing to generate", "invalid_request_error")
