"""`Client.chat`'s machinery: the request body, the tool loop, `best_of`, and streams.

All of it goes to the gateway's `/v1/chat/completions`. The pure parts (the
body, a candidate's mean log-probability, the pick, assembling streamed tool
calls) are functions the tests check with tables; `answer` and `ChatStream`
send. The tool loop: while the model's answer calls tools and handlers were
given, run each call (`blazar_sdk.tools.run_call`), append the assistant
message and the tool results to the conversation, and ask again, for at most
`max_tool_rounds` rounds of calls.

`best_of=N` sends N requests one after another (llama-server answers only
`n: 1`; sequential requests never fill the queue a busy model refuses from) with
`logprobs: true`, and keeps the candidate whose generated tokens have the
highest mean log-probability under the engine (`logprobs.content[].logprob`).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from blazar_sdk._transport import Transport, sse_events
from blazar_sdk.errors import ToolLoopError
from blazar_sdk.tools import Handler, run_call
from blazar_sdk.types import JSON, Candidate, ChatResult, Delta, ToolCallDelta

__all__ = ["ChatStream", "answer", "chat_body", "mean_logprob", "pick", "to_messages"]

PATH = "/v1/chat/completions"


def to_messages(messages: str | Sequence[Mapping[str, Any]]) -> list[JSON]:
    """The conversation as a list of message dicts (a string is one user message)."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def chat_body(
    model: str,
    messages: list[JSON],
    tools: list[JSON] | None,
    options: Mapping[str, Any],
    *,
    stream: bool = False,
    logprobs: bool = False,
    mcp: Sequence[str] | None = None,
) -> JSON:
    """The `/v1/chat/completions` body for one request of a chat call."""
    body: JSON = {"model": model, "messages": messages, **options}
    if tools:
        body["tools"] = tools
    if mcp is not None:
        if isinstance(mcp, str) or not all(isinstance(n, str) and n for n in mcp):
            raise TypeError(f"mcp: expected a list of MCP server names, got {mcp!r}")
        body["mcp"] = list(mcp)
    if logprobs:
        body["logprobs"] = True
    if stream:
        body["stream"] = True
        body.setdefault("stream_options", {"include_usage": True})
    return body


def mean_logprob(choice: Mapping[str, Any]) -> float | None:
    """The mean of the engine's log-probabilities of a choice's tokens; None without any."""
    logprobs = choice.get("logprobs") or {}
    values = [
        t["logprob"]
        for t in logprobs.get("content") or []
        if isinstance(t, Mapping) and isinstance(t.get("logprob"), (int, float))
    ]
    return math.fsum(values) / len(values) if values else None


def pick(candidates: Sequence[Candidate]) -> int:
    """The index of the candidate with the highest mean log-probability (the first of
    equals; one without logprobs ranks below all that have them)."""
    scores = [-math.inf if c.mean_logprob is None else c.mean_logprob for c in candidates]
    return scores.index(max(scores))


def assistant(message: Mapping[str, Any]) -> JSON:
    """The answer as it goes back into the conversation."""
    out: JSON = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = list(message["tool_calls"])
    return out


def _ask(
    transport: Transport, body: JSON, best_of: int | None
) -> tuple[JSON, JSON, str | None, tuple[Candidate, ...], float | None]:
    """One round: (choice, whole answer, trace id, candidates, chosen mean logprob)."""
    if best_of is None:
        reply = transport.call("POST", PATH, body)
        return reply.body["choices"][0], reply.body, reply.trace_id, (), None
    answers, candidates = [], []
    for _ in range(best_of):
        reply = transport.call("POST", PATH, body)
        choice = reply.body["choices"][0]
        answers.append((choice, reply))
        candidates.append(
            Candidate(
                message=choice.get("message") or {},
                finish_reason=choice.get("finish_reason"),
                mean_logprob=mean_logprob(choice),
                trace_id=reply.trace_id,
            )
        )
    best = pick(candidates)
    choice, reply = answers[best]
    return choice, reply.body, reply.trace_id, tuple(candidates), candidates[best].mean_logprob


def answer(
    transport: Transport,
    model: str,
    messages: list[JSON],
    tools: list[JSON] | None,
    handlers: Mapping[str, Handler] | None,
    *,
    best_of: int | None,
    max_tool_rounds: int,
    mcp: Sequence[str] | None,
    options: Mapping[str, Any],
) -> ChatResult:
    """A whole answer, after the tool loop."""
    history = list(messages)
    traces: list[str | None] = []
    for round_ in range(max_tool_rounds + 1):
        body = chat_body(model, history, tools, options, logprobs=best_of is not None, mcp=mcp)
        choice, whole, trace, candidates, score = _ask(transport, body, best_of)
        traces.append(trace)
        message = choice.get("message") or {}
        history.append(assistant(message))
        calls = message.get("tool_calls") or []
        if calls and handlers is not None:
            if round_ == max_tool_rounds:
                raise _exhausted(max_tool_rounds, history)
            history.extend(run_call(call, handlers) for call in calls)
            continue
        return ChatResult(
            message=dict(message),
            finish_reason=choice.get("finish_reason"),
            messages=history,
            rounds=round_ + 1,
            usage=whole.get("usage"),
            trace_id=trace,
            raw=whole,
            trace_ids=tuple(traces),
            candidates=candidates,
            mean_logprob=score,
        )
    raise AssertionError("unreachable: the last round returns or raises")


def _exhausted(rounds: int, history: list[JSON]) -> ToolLoopError:
    return ToolLoopError(
        f"the model still called tools after {rounds} rounds of tool calls; raise "
        "max_tool_rounds, or tell it (in a system message) when to answer",
        messages=history,
    )


class _Calls:
    """Whole tool calls, put together from a stream's pieces (by index)."""

    def __init__(self) -> None:
        self.calls: dict[int, JSON] = {}

    def feed(self, piece: ToolCallDelta) -> None:
        call = self.calls.setdefault(
            piece.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if piece.id:
            call["id"] = piece.id
        if piece.name:
            call["function"]["name"] += piece.name
        call["function"]["arguments"] += piece.arguments

    def whole(self) -> list[JSON]:
        return [self.calls[i] for i in sorted(self.calls)]


def delta(chunk: Mapping[str, Any], round_: int) -> Delta | None:
    """A stream chunk as a `Delta`; None for one that carries nothing (the role delta)."""
    usage = chunk.get("usage")
    choices = chunk.get("choices") or []
    if not choices:
        return Delta(usage=usage, round=round_) if usage else None
    choice = choices[0]
    piece = choice.get("delta") or {}
    calls = tuple(
        ToolCallDelta(
            index=int(c.get("index", 0)),
            id=c.get("id") or None,
            name=(c.get("function") or {}).get("name") or None,
            arguments=(c.get("function") or {}).get("arguments") or "",
        )
        for c in piece.get("tool_calls") or []
    )
    out = Delta(
        content=piece.get("content") or None,
        reasoning=piece.get("reasoning_content") or None,
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        usage=usage,
        round=round_,
    )
    return out if out != Delta(round=round_) else None


class ChatStream:
    """Deltas as the model makes them, across the rounds of a tool loop; a context
    manager (leaving it closes the connection, which stops the generation). The first
    request is sent when the stream is made, so a refusal raises from `chat` itself.

    After the stream ends: `messages` is the whole conversation, `text` the final
    answer, `usage` the last round's, `trace_ids` every round's `x-request-id`.
    """

    def __init__(
        self,
        transport: Transport,
        model: str,
        messages: list[JSON],
        tools: list[JSON] | None,
        handlers: Mapping[str, Handler] | None,
        *,
        max_tool_rounds: int,
        mcp: Sequence[str] | None,
        options: Mapping[str, Any],
    ) -> None:
        self.messages = list(messages)
        self.trace_ids: list[str | None] = []
        self.usage: JSON | None = None
        self.finish_reason: str | None = None
        self._transport, self._model, self._tools = transport, model, tools
        self._handlers, self._rounds, self._mcp, self._options = (
            handlers,
            max_tool_rounds,
            mcp,
            options,
        )
        self._response: Any = self._open()  # sent now: a refusal raises here, not later
        self._deltas = self._run()

    @property
    def trace_id(self) -> str | None:
        """The latest round's `x-request-id`."""
        return self.trace_ids[-1] if self.trace_ids else None

    @property
    def text(self) -> str:
        """The final answer's content (as far as it has streamed)."""
        last = self.messages[-1] if self.messages else {}
        return str(last.get("content") or "") if last.get("role") == "assistant" else ""

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        return next(self._deltas)

    def _open(self) -> Any:
        body = chat_body(
            self._model, self.messages, self._tools, self._options, stream=True, mcp=self._mcp
        )
        response = self._transport.open("POST", PATH, body)
        self.trace_ids.append(response.headers.get("x-request-id"))
        return response

    def _run(self) -> Generator[Delta, None, None]:
        for round_ in range(self._rounds + 1):
            if round_:
                self._response = self._open()
            message: JSON = {"role": "assistant", "content": None}
            self.messages.append(message)
            calls, content = _Calls(), []
            with self._response:
                for event in sse_events(self._response):
                    step = delta(event, round_)
                    if step is None:
                        continue
                    for piece in step.tool_calls:
                        calls.feed(piece)
                    if step.content:
                        content.append(step.content)
                        message["content"] = "".join(content)
                    self.usage = step.usage or self.usage
                    self.finish_reason = step.finish_reason or self.finish_reason
                    yield step
            whole = calls.whole()
            if whole:
                message["tool_calls"] = whole
            if not whole or self._handlers is None:
                return
            if round_ == self._rounds:
                raise _exhausted(self._rounds, self.messages)
            results = [run_call(call, self._handlers) for call in whole]
            self.messages.extend(results)
            yield Delta(tool_results=tuple(results), round=round_)

    def close(self) -> None:
        """Stop reading: the connection closes, and the gateway stops the generation."""
        self._deltas.close()
        if self._response is not None:
            self._response.close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
