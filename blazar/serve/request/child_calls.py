"""The engines a request's call goes to, as the pipeline sees them: `Upstream`s.

An `Upstream` posts an engine request's bytes and hands back the reply as it arrives
(`status`, `content_type`, `read` chunk by chunk, `read_all`); `failed` turns what
went wrong into the `ProtocolError` the client gets. `LeasedChild` is a leased
llama-server (or other engine) child on the one child client (`ChildConnections`,
kept for this hot path: keep-alive connections, a response parsed as it arrives);
the remotes' upstream is in `blazar.serve.request.forward`. A child that fails is a
502 when it refused, closed or garbled the connection, a 504 when it stayed silent
past `serving.upstream_timeout` (a limit between chunks).

The same `LeasedChild` makes the small native calls an answer may need
(`/apply-template`, `/tokenize`; `asks.Helpers`). They are not the request's
exchange, so they never touch its trace: the trace shows what the client's request
got, not a helper's answer.

`refused` reads an engine's error answer, `decode` a body that may not be JSON, and
`gate` applies serving.sentinel_enforce to a whole answer.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from blazar.observe import sentinels
from blazar.observe.trace import current
from blazar.protocols import ProtocolError
from blazar.protocols.openai_requests import engine_refusal
from blazar.serve.supervisor.child_http import ChildConnections, UpstreamError, UpstreamTimeout


class Reply(Protocol):
    """An engine's answer as it arrives."""

    status: int

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...

    async def read_all(self) -> bytes: ...


class Upstream(Protocol):
    """Where an engine request goes: `errors` are what its calls raise when it fails."""

    errors: tuple[type[BaseException], ...]

    async def post(self, path: str, body: bytes) -> Reply: ...

    def release(self, reply: Reply) -> None: ...

    def failed(self, exc: BaseException) -> ProtocolError: ...


def child_failed(model: str, exc: BaseException) -> ProtocolError:
    """The error a client gets when its model's child failed while answering."""
    if isinstance(exc, UpstreamTimeout):
        return ProtocolError(
            504,
            f"model '{model}' timed out: {exc} (serving.upstream_timeout); retry, or raise "
            "the timeout in the manifest",
            "upstream_timeout",
        )
    detail = str(exc) or type(exc).__name__
    return ProtocolError(502, f"model '{model}' failed while answering: {detail}", "upstream_error")


def refused(status: int, payload: Any) -> ProtocolError:
    """An engine's error answer (llama-server's OpenAI shape, or text) as a ProtocolError,
    which each route's envelope answers: the engine's status and message, or a 400 that
    says what the client can fix (`openai_requests.engine_refusal`)."""
    status = status if status >= 400 else 502
    explained = engine_refusal(status, payload)
    if explained is not None:
        return ProtocolError(400, explained)
    message = payload
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        message = inner.get("message", inner) if isinstance(inner, dict) else inner
    return ProtocolError(status, str(message))


def decode(payload: bytes) -> Any:
    """A body as JSON, or as text when it is not JSON."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode(errors="replace")


def gate(status: int) -> None:
    """With serving.sentinel_enforce, a whole answer that fails the sentinels is a 422 that
    names what they found (in the route's protocol shape, by the errors middleware)."""
    trace = current()
    if status == 200 and trace is not None and trace.enforce and (found := trace.gate()):
        raise ProtocolError(422, sentinels.gate_message(found), "sentinel_failed")


class LeasedChild:
    """A leased child of `model` at `url`, on the gateway's one child client: the
    upstream of the request's call, and the helper calls its answer makes, which are
    never traced as the request's exchange (the bug they had: a templated
    /api/generate's trace showed /tokenize)."""

    __slots__ = ("children", "model", "url")
    errors: tuple[type[BaseException], ...] = (UpstreamError, ConnectionError)

    def __init__(self, children: ChildConnections, url: str, model: str) -> None:
        self.children, self.url, self.model = children, url, model

    # -- the request's call (`Upstream`) ---------------------------------------------------

    async def post(self, path: str, body: bytes) -> Reply:
        return await self.children.post(self.url, path, body)

    def release(self, reply: Reply) -> None:
        """Keep a finished reply's connection; close one left unfinished (the child then
        stops generating for a client that went away)."""
        self.children.release(self.url, reply)  # type: ignore[arg-type]

    def failed(self, exc: BaseException) -> ProtocolError:
        return child_failed(self.model, exc)

    # -- helper calls (`asks.Helpers`) -----------------------------------------------------

    async def _call(self, path: str, body: Any) -> dict[str, Any]:
        try:
            status, payload = await self.children.json(self.url, path, body)
        except (UpstreamError, ConnectionError) as exc:
            raise child_failed(self.model, exc) from None
        if status != 200 or not isinstance(payload, dict):
            raise refused(status, payload)
        return payload

    async def apply_template(self, messages: Any) -> str:
        """The prompt the model's chat template renders for `messages` (`/apply-template`)."""
        payload = await self._call("/apply-template", {"messages": messages})
        return str(payload.get("prompt", ""))

    async def tokenize(self, text: str) -> list[int]:
        """The model's token ids for `text` as a prompt: special tokens parsed, and the
        beginning-of-sequence token first where the model adds one (`/tokenize`)."""
        payload = await self._call("/tokenize", {"content": text, "add_special": True})
        return [int(t) for t in payload.get("tokens", []) if isinstance(t, int)]
