"""`Client`: Blazar's gateway from Python, with nothing but the standard library.

One object per gateway. The URL and key come from the arguments, else from
`BLAZAR_URL` and `BLAZAR_API_KEY`, else `http://127.0.0.1:11435` and no key.
Inference (`chat`, `respond`, `rerank`) speaks the gateway's OpenAI routes (and
`/v1/rerank`); the operator's calls (`ps`, `explain`, `failover`, `drain`, sessions)
its Blazar routes, which need an admin key once keys are declared. Every failure is a typed
`blazar_sdk.errors` exception with the gateway's body and trace id.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

from blazar_sdk import chat as _chat
from blazar_sdk import realtime as _realtime
from blazar_sdk._transport import Query, Transport
from blazar_sdk.batches import Batches
from blazar_sdk.tools import Handler, ToolSpec, prepare_tools
from blazar_sdk.types import JSON, ChatResult

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_URL", "Client"]

DEFAULT_URL = "http://127.0.0.1:11435"
DEFAULT_TIMEOUT = 600.0  # seconds; a model may have to load before it answers
SESSIONS = "/api/blazar/sessions"


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


class Client:
    """A client of one Blazar gateway.

    `url`: the gateway (default `BLAZAR_URL`, else http://127.0.0.1:11435); `key`:
    its API key (default `BLAZAR_API_KEY`; none when unset); `timeout`: seconds
    to connect and for each read (a stream may last longer while it keeps sending).
    """

    def __init__(
        self, url: str | None = None, key: str | None = None, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.url = (url or os.environ.get("BLAZAR_URL") or DEFAULT_URL).rstrip("/")
        if self.url.endswith("/v1"):  # an OpenAI base URL works too
            self.url = self.url[: -len("/v1")]
        self.key = key if key is not None else (os.environ.get("BLAZAR_API_KEY") or None)
        self.timeout = timeout
        self._transport = Transport(self.url, self.key, timeout)
        self.batches = Batches(self._transport)
        self.last_trace_id: str | None = None

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, key={'***' if self.key else None})"

    def request(
        self, method: str, path: str, body: Any = None, *, query: Query | None = None
    ) -> Any:
        """Any gateway route: its decoded JSON answer (`last_trace_id` holds its trace id)."""
        answer = self._transport.call(method, path, body, query=query)
        self.last_trace_id = answer.trace_id
        return answer.body

    # -- inference ---------------------------------------------------------------------

    @overload
    def chat(
        self,
        model: str,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec] | None = ...,
        tool_handlers: Mapping[str, Handler] | None = ...,
        best_of: int | None = ...,
        stream: Literal[False] = ...,
        max_tool_rounds: int = ...,
        mcp: Sequence[str] | None = ...,
        **options: Any,
    ) -> ChatResult: ...

    @overload
    def chat(
        self,
        model: str,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec] | None = ...,
        tool_handlers: Mapping[str, Handler] | None = ...,
        best_of: None = ...,
        stream: Literal[True],
        max_tool_rounds: int = ...,
        mcp: Sequence[str] | None = ...,
        **options: Any,
    ) -> _chat.ChatStream: ...

    def chat(
        self,
        model: str,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec] | None = None,
        tool_handlers: Mapping[str, Handler] | None = None,
        best_of: int | None = None,
        stream: bool = False,
        max_tool_rounds: int = 8,
        mcp: Sequence[str] | None = None,
        **options: Any,
    ) -> ChatResult | _chat.ChatStream:
        """Chat with `model` (`/v1/chat/completions`); `options` go into the request as
        they are (`max_tokens`, `temperature`, `seed`, `stop`, ...).

        `messages`: OpenAI chat messages, or a string (one user message).
        `tools`: OpenAI tool definitions and/or Python functions (a function's
        definition is made from its signature and docstring, and it handles its own
        calls). With handlers (`tool_handlers` by name, or functions in `tools`) the
        SDK runs the tool loop: each tool call the model makes is run, its result sent
        back as a `tool` message, and the model asked again, until it answers without
        calling tools; more than `max_tool_rounds` rounds of calls raise
        `ToolLoopError`, a missing or failing handler `ToolError`. Without handlers the
        calls come back in `ChatResult.tool_calls` for you to run.

        `best_of=N`: N candidate answers are asked (N requests, one after another, with
        `logprobs`; the engine answers only `n=1`), and the one whose generated tokens
        have the highest mean log-probability under the engine is kept; the others are
        in `ChatResult.candidates`. Candidates differ only if sampling does: leave
        `temperature` above 0 and `seed` unset.

        `stream=True`: a `ChatStream` of `Delta`s parsed from the server-sent events
        (content, tool-call pieces, a finish reason, usage at the end of each round;
        the tool loop runs between rounds). Not with `best_of`.

        `mcp`: names of MCP servers (`[mcp.NAME]` in the manifest) whose tools the
        gateway should offer the model; sent as the request's `mcp` field.
        """
        if best_of is not None and (not isinstance(best_of, int) or best_of < 1):
            raise ValueError(f"best_of: expected a whole number >= 1, got {best_of!r}")
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds: expected 0 or more")
        definitions, handlers = prepare_tools(tools, tool_handlers)
        history = _chat.to_messages(messages)
        if stream:
            if best_of is not None:
                raise ValueError("best_of needs whole answers to compare: use stream=False")
            return _chat.ChatStream(
                self._transport,
                model,
                history,
                definitions,
                handlers,
                max_tool_rounds=max_tool_rounds,
                mcp=mcp,
                options=options,
            )
        result = _chat.answer(
            self._transport,
            model,
            history,
            definitions,
            handlers,
            best_of=best_of,
            max_tool_rounds=max_tool_rounds,
            mcp=mcp,
            options=options,
        )
        self.last_trace_id = result.trace_id
        return result

    def respond(self, model: str, input: str | Sequence[Mapping[str, Any]], **options: Any) -> JSON:
        """A Response (`POST /v1/responses`, OpenAI's Responses API); the gateway keeps it
        (unless `store=False`) for `metadata_update` and `GET /v1/responses/{id}`."""
        return dict(
            self.request("POST", "/v1/responses", {"model": model, "input": input, **options})
        )

    def metadata_update(self, response_id: str, metadata: Mapping[str, str]) -> JSON:
        """Replace a stored response's `metadata` (at most 16 keys of at most 64 characters,
        values strings of at most 512); the response as it is now."""
        path = f"/v1/responses/{_quote(response_id)}"
        return dict(self.request("POST", path, {"metadata": dict(metadata)}))

    def rerank(
        self,
        model: str,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        *,
        return_documents: bool = False,
    ) -> JSON:
        """Documents ranked by relevance to `query` (`POST /v1/rerank`, for a model served
        with `pooling = "rank"`): `results` best first, each with its `index` in
        `documents` and its `relevance_score` (and `document` when `return_documents`),
        at most `top_n` of them (default: all); `usage` counts the tokens."""
        body: JSON = {"model": model, "query": query, "documents": list(documents)}
        if top_n is not None:
            body["top_n"] = top_n
        if return_documents:
            body["return_documents"] = True
        return dict(self.request("POST", "/v1/rerank", body))

    def models(self) -> list[JSON]:
        """The models this gateway serves (`/v1/models`'s `data`: ids, owners, ...)."""
        return list(self.request("GET", "/v1/models")["data"])

    def realtime(
        self,
        model: str | None = None,
        *,
        voice: str | None = None,
        instructions: str | None = None,
        auth: str = "header",
    ) -> _realtime.Realtime:
        """A realtime voice session on `/v1/realtime` (a context manager): `send_audio`,
        `commit`, `send_text`, and iteration over the server's events. `voice` and
        `instructions` are sent first as a `session.update`. `auth="subprotocol"` sends
        the key as the `openai-insecure-api-key.KEY` subprotocol instead of a header."""
        session = _realtime.connect(
            self.url, self.key, model=model, auth=auth, timeout=self.timeout
        )
        settings = {
            k: v for k, v in (("voice", voice), ("instructions", instructions)) if v is not None
        }
        if settings:
            try:
                session.update_session(**settings)
            except BaseException:
                session.close()
                raise
        return session

    # -- operations (admin scope once keys are declared) ---------------------------------

    def ps(self) -> list[JSON]:
        """The running instances (`blazar ps`): model, replica, pid, port, state, ..."""
        return list(self.request("GET", "/api/blazar/ps")["instances"])

    def explain(self, trace_id: str) -> JSON:
        """One request's routing trail (`blazar why ID`, `/api/why/ID`): what it resolved
        to, which instance and why, queue wait, load, tokens, cache reuse."""
        return dict(self.request("GET", f"/api/why/{_quote(trace_id)}"))

    def failover(self) -> JSON:
        """The remotes (health, last error, counts) and each model's failover chain."""
        return dict(self.request("GET", "/api/failover"))

    def drain(self, remote: str) -> JSON:
        """Take a remote out of service (until `undrain` or a restart of serve)."""
        return dict(self.request("POST", "/api/failover", {"member": remote, "drained": True}))

    def undrain(self, remote: str) -> JSON:
        """Put a drained remote back in service."""
        return dict(self.request("POST", "/api/failover", {"member": remote, "drained": False}))

    def session_save(
        self, model: str, name: str, *, slot: int | None = None, replica: int | None = None
    ) -> JSON:
        """Save a slot of loaded `model` (by default the one that served it last) as KV
        session `name`; its record (tokens, size, ...)."""
        body: JSON = {"model": model, "name": name}
        body.update({k: v for k, v in (("slot", slot), ("replica", replica)) if v is not None})
        return dict(self.request("POST", SESSIONS, body))

    def session_restore(self, name: str, model: str | None = None) -> JSON:
        """Restore session `name` into a free slot (loading its model if needed): the next
        request continuing it is served from the cache."""
        body = {"model": model} if model else {}
        return dict(self.request("POST", f"{SESSIONS}/{_quote(name)}/restore", body))

    def session_list(self) -> list[JSON]:
        """Every saved and banked session."""
        return list(self.request("GET", SESSIONS)["sessions"])

    def session_remove(self, name: str) -> JSON:
        """Remove a session and its file."""
        return dict(self.request("DELETE", f"{SESSIONS}/{_quote(name)}"))
