"""What `Client.chat` returns: a whole answer (`ChatResult`), its candidates, stream deltas.

Plain frozen dataclasses over the OpenAI chat shapes the gateway answers with;
`raw` and `message` keep the JSON as it came, so nothing the gateway sends is
lost to the SDK's view of it. Built by `blazar_sdk.chat`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

__all__ = ["JSON", "Candidate", "ChatResult", "Delta", "ToolCallDelta"]


@dataclass(frozen=True)
class Candidate:
    """One of `best_of` answers: its message, why it ended, and its mean token log-probability
    (the mean of the engine's `logprobs.content[].logprob`; None when it sent none)."""

    message: JSON
    finish_reason: str | None
    mean_logprob: float | None
    trace_id: str | None

    @property
    def text(self) -> str:
        return str(self.message.get("content") or "")


@dataclass(frozen=True)
class ChatResult:
    """The model's answer after the tool loop (if any) and the `best_of` pick (if asked).

    `text`: the answer's content; `message`: the final assistant message as the
    gateway sent it (`tool_calls` in it when tools were given without handlers);
    `messages`: the whole conversation, the tool rounds and the answer included,
    ready to send back for the next turn; `rounds`: requests made one after another
    (1 without tool calls); `usage` and `raw`: the last answer's; `trace_id`: the last
    answer's `x-request-id` (`Client.explain` it), `trace_ids` every round's (the
    chosen candidate's with `best_of`); `candidates`: with `best_of`, the
    last round's candidates in the order they were asked, and `mean_logprob` the
    chosen one's.
    """

    message: JSON
    finish_reason: str | None
    messages: list[JSON]
    rounds: int
    usage: JSON | None
    trace_id: str | None
    raw: JSON
    trace_ids: tuple[str | None, ...] = ()
    candidates: tuple[Candidate, ...] = ()
    mean_logprob: float | None = None

    @property
    def text(self) -> str:
        return str(self.message.get("content") or "")

    @property
    def tool_calls(self) -> list[JSON]:
        """The tool calls of the final message (empty when the model answered)."""
        return list(self.message.get("tool_calls") or [])


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece of call `index` has its `id` and
    `name`; `arguments` pieces, joined in order, are the arguments' JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """One streamed step: a piece of `content` (or `reasoning`), tool-call pieces, the
    `finish_reason` of a round, `tool_results` (the tool messages the loop sent back, in
    a stream with handlers), or `usage` (last, once per round). `round` counts from 0."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    finish_reason: str | None = None
    usage: JSON | None = None
    tool_results: tuple[JSON, ...] = field(default=())
    round: int = 0
