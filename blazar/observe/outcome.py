"""What an engine answered, read from its JSON: output text, finish reason, usage, timings.

Pure: `from_response` reads one whole answer and `StreamOutcome` the events of a
stream, for each engine endpoint the gateway calls (OpenAI chat, completions and
responses, llama-server's native `/completion`, Anthropic's `/v1/messages`,
embeddings, rerank and token counting). `blazar.serve.state.tracing` calls them when a request
is done, off the answer's way to the client; the sentinels (`blazar.observe.sentinels`)
and the metrics read the `Outcome`.

Token counts follow one meaning whatever the protocol: `prompt_tokens` is the whole
prompt, cached tokens included, and `cached_tokens` the part the engine reused, so
cached / prompt is the prefix-cache hit ratio. (llama-server's `timings.prompt_n`
and Anthropic's `input_tokens` exclude the cached part; they are added back here.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXCERPT = 200  # characters of output a trace keeps (when serving.pii_scrub is off)
LENGTH_REASONS = frozenset({"length", "max_tokens", "max_output_tokens", "limit"})


@dataclass
class Outcome:
    """One answer. `text` is None for answers that are not text (embeddings, counts)."""

    text: str | None = None
    tool_calls: int = 0
    finish: str | None = None  # as the engine said it: stop, length, end_turn, max_tokens, ...
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    generated_tokens: int | None = None
    prompt_ms: float | None = None
    predicted_ms: float | None = None
    tokens_per_second: float | None = None
    draft_tokens: int | None = None  # speculative decoding: tokens drafted (timings.draft_n)
    draft_accepted: int | None = None  # and of those, accepted (timings.draft_n_accepted)
    complete: bool = True  # False when the text was not kept whole (a very long stream)
    images: int | None = None  # pictures drawn (/v1/images/*: not text)
    image: dict[str, Any] | None = None  # and how: images, seconds, steps, seconds_per_step

    @property
    def truncated(self) -> bool:
        """The engine stopped at the token limit."""
        return self.finish in LENGTH_REASONS


_NUMBERS = (int, float)


def _int(value: Any) -> int | None:
    if type(value) is int:  # the usual case, and never a bool
        return value
    return int(value) if isinstance(value, _NUMBERS) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if type(value) is float:
        return value
    return float(value) if isinstance(value, _NUMBERS) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# `/completion`'s `tokens_cached` is not the prompt tokens reused: it is every token in
# the slot's cache once the answer is done, the generated ones included (seen with
# xllamacpp 2026.10.11549: 18 for a 14-token prompt and 5 generated, every time, while
# `timings.cache_n` was 0, then 13). Read as cached prompt tokens it made `blazar watch`
# show a cache hit of 250%; the reused prompt tokens are `timings.cache_n`.
NOT_CACHED = "tokens_cached"


def read_timings(out: Outcome, timings: Any) -> None:
    """llama-server's `timings`: prompt_n excludes the cache_n tokens it reused."""
    t = _dict(timings)
    if not t:
        return
    cache_n, prompt_n = _int(t.get("cache_n")), _int(t.get("prompt_n"))
    if prompt_n is not None and out.prompt_tokens is None:
        out.prompt_tokens = prompt_n + (cache_n or 0)
    if cache_n is not None and out.cached_tokens is None:
        out.cached_tokens = cache_n
    if (predicted := _int(t.get("predicted_n"))) is not None and out.generated_tokens is None:
        out.generated_tokens = predicted
    out.prompt_ms = _float(t.get("prompt_ms"))
    out.predicted_ms = _float(t.get("predicted_ms"))
    out.tokens_per_second = _float(t.get("predicted_per_second"))
    if (drafted := _int(t.get("draft_n"))) is not None:  # present once the engine drafted
        out.draft_tokens, out.draft_accepted = drafted, _int(t.get("draft_n_accepted"))


def read_usage(out: Outcome, usage: Any) -> None:
    """OpenAI's, the Responses API's or Anthropic's `usage`."""
    u = _dict(usage)
    if not u:
        return
    if "input_tokens" in u or "cache_read_input_tokens" in u:  # Anthropic, Responses
        details = _dict(u.get("input_tokens_details"))
        read = _int(u.get("cache_read_input_tokens"))
        inputs = _int(u.get("input_tokens"))
        if read is not None:  # Anthropic: input_tokens excludes what was read from cache
            out.prompt_tokens, out.cached_tokens = (inputs or 0) + read, read
        else:  # Responses: input_tokens includes the cached ones
            out.prompt_tokens, out.cached_tokens = inputs, _int(details.get("cached_tokens"))
        out.generated_tokens = _int(u.get("output_tokens"))
        return
    out.prompt_tokens = _int(u.get("prompt_tokens"))
    if (cached := _int(_dict(u.get("prompt_tokens_details")).get("cached_tokens"))) is not None:
        out.cached_tokens = cached
    if (completion := _int(u.get("completion_tokens"))) is not None:
        out.generated_tokens = completion


def _message_text(message: dict[str, Any]) -> tuple[str, int]:
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = message.get("tool_calls")
    return text, len(calls) if isinstance(calls, list) else 0


def from_response(path: str, payload: Any) -> Outcome:
    """The outcome of a whole (non-streamed) answer from engine endpoint `path`."""
    out = Outcome()
    body = _dict(payload)
    if not body:
        return out
    if path.startswith("/v1/messages"):
        if path.endswith("count_tokens"):
            out.prompt_tokens = _int(body.get("input_tokens"))
            return out
        blocks = [b for b in body.get("content") or [] if isinstance(b, dict)]
        out.text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        out.tool_calls = sum(1 for b in blocks if b.get("type") == "tool_use")
        out.finish = body.get("stop_reason")
    elif path == "/v1/responses":
        _read_response_object(out, body)
        return out
    elif path in ("/completion", "/infill"):
        out.text = str(body.get("content") or "")
        out.finish = "limit" if body.get("stop_type") == "limit" else body.get("stop_type")
        out.prompt_tokens = _int(body.get("tokens_evaluated"))
        out.generated_tokens = _int(body.get("tokens_predicted"))  # cached: `NOT_CACHED`
    elif path.startswith("/v1/images/"):  # pictures, not text: the gateway's summary
        out.images = _int(body.get("images"))
        keys = ("images", "seconds", "steps", "seconds_per_step")
        out.image = {k: body.get(k) for k in keys}
        seconds = _float(body.get("seconds"))
        out.predicted_ms = seconds * 1000 if seconds is not None else None
        return out
    elif "embeddings" in path or path.endswith("/rerank"):  # scores, not text
        read_usage(out, body.get("usage"))
        return out
    else:  # /v1/chat/completions, /v1/completions
        choice = _dict((body.get("choices") or [{}])[0])
        if "message" in choice:
            out.text, out.tool_calls = _message_text(_dict(choice["message"]))
        else:
            out.text = str(choice.get("text") or "")
        out.finish = choice.get("finish_reason")
    read_usage(out, body.get("usage"))
    read_timings(out, body.get("timings"))
    return out


def _read_response_object(out: Outcome, body: dict[str, Any]) -> None:
    """An OpenAI Responses API object (`/v1/responses`, or a stream's final event)."""
    texts, calls = [], 0
    for item in body.get("output") or []:
        item = _dict(item)
        if item.get("type") == "function_call":
            calls += 1
        for part in item.get("content") or []:
            part = _dict(part)
            if part.get("type") == "output_text":
                texts.append(str(part.get("text") or ""))
    out.text, out.tool_calls = "".join(texts), calls
    incomplete = _dict(body.get("incomplete_details")).get("reason")
    out.finish = incomplete or ("stop" if body.get("status") == "completed" else body.get("status"))
    read_usage(out, body.get("usage"))


class StreamOutcome:
    """The outcome of a stream, fed its events' data (parsed JSON) in order.

    `keep_text` False keeps only an excerpt of the text (enough for the trace and
    the emptiness check); True keeps it whole, for the JSON checks.
    """

    def __init__(self, path: str, *, keep_text: bool) -> None:
        self.path = path
        self.keep_text = keep_text
        self.out = Outcome(text="")
        self._parts: list[str] = []
        self._chars = 0
        self.content_events = 0  # events that carried output (text or a tool call)

    @property
    def chars(self) -> int:
        """Characters of text fed so far (kept or not)."""
        return self._chars

    def feed(self, data: Any) -> bool:
        """Take one event; True when it carried output."""
        event = _dict(data)
        if not event:
            return False
        text, calls = self._read(event)
        if calls:
            self.out.tool_calls += calls
        if text:
            if self.keep_text or self._chars < EXCERPT:
                self._parts.append(text)
            self._chars += len(text)
        if text or calls:
            self.content_events += 1
            return True
        return False

    def _read(self, event: dict[str, Any]) -> tuple[str, int]:
        out = self.out
        kind = event.get("type")
        if isinstance(kind, str):  # Anthropic's events, or the Responses API's
            return self._read_typed(kind, event)
        if "choices" in event:  # OpenAI chat or completions chunks
            read_usage(out, event.get("usage"))
            read_timings(out, event.get("timings"))
            choice = _dict((event.get("choices") or [{}])[0])
            if choice.get("finish_reason"):
                out.finish = choice["finish_reason"]
            delta = _dict(choice.get("delta"))
            text = delta.get("content") if delta else choice.get("text")
            calls = delta.get("tool_calls")
            return (text if isinstance(text, str) else ""), (
                len(calls) if isinstance(calls, list) else 0
            )
        if "content" in event and ("stop" in event or "tokens_predicted" in event):
            if event.get("stop"):  # llama-server's native /completion stream
                stop = event.get("stop_type")
                out.finish = "limit" if stop == "limit" else stop
                out.prompt_tokens = _int(event.get("tokens_evaluated"))
                out.generated_tokens = _int(event.get("tokens_predicted"))
                read_timings(out, event.get("timings"))
            return str(event.get("content") or ""), 0
        read_usage(out, event.get("usage"))  # a usage-only chunk
        read_timings(out, event.get("timings"))
        return "", 0

    def _read_typed(self, kind: str, event: dict[str, Any]) -> tuple[str, int]:
        out = self.out
        if kind == "content_block_delta":
            delta = _dict(event.get("delta"))
            return str(delta.get("text") or ""), 0
        if kind == "content_block_start":
            block = _dict(event.get("content_block"))
            return "", 1 if block.get("type") == "tool_use" else 0
        if kind == "message_start":
            read_usage(out, _dict(event.get("message")).get("usage"))
        elif kind == "message_delta":
            reason = _dict(event.get("delta")).get("stop_reason")
            if reason:
                out.finish = reason
            usage = _dict(event.get("usage"))
            if (generated := _int(usage.get("output_tokens"))) is not None:
                out.generated_tokens = generated
        elif kind == "response.output_text.delta":
            return str(event.get("delta") or ""), 0
        elif kind in ("response.completed", "response.incomplete"):
            final = Outcome()
            _read_response_object(final, _dict(event.get("response")))
            out.finish = final.finish
            out.prompt_tokens, out.cached_tokens = final.prompt_tokens, final.cached_tokens
            out.generated_tokens = final.generated_tokens
        return "", 0

    def result(self) -> Outcome:
        out = self.out
        out.text = "".join(self._parts)
        if not self.keep_text and self._chars > len(out.text):
            out.complete = False
        if out.generated_tokens is None and self.content_events:
            out.generated_tokens = self.content_events  # one event per token, as llama-server
        return out
