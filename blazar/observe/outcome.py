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

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

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
        self._closed = False  # the excerpt is closed: events were left unread after it
        self.content_events = 0  # events that carried output (text or a tool call)

    @property
    def chars(self) -> int:
        """Characters of text fed so far (kept or not)."""
        return self._chars

    def gap(self) -> None:
        """Events were left unread here (a long stream's middle: `trace`): the text is an
        excerpt, and keeps no text after the gap unless it has none before it (a long
        preamble without text, as a reasoning model's: then the end's text stands for
        it, and an answer with text is not taken for an empty one)."""
        self.out.complete = False
        if "".join(self._parts).strip():
            self._closed = True

    def token(self, text: str) -> bool:
        """Take one event that carried only this text (a chat token as llama-server
        sends it, read without parsing its JSON: `trace`); True when it carried output,
        as `feed` of the same event."""
        if not text:
            return False
        if self.keep_text or (self._chars < EXCERPT and not self._closed):
            self._parts.append(text)
        self._chars += len(text)
        self.content_events += 1
        return True

    def tokens(self, texts: list[str]) -> int:
        """`token` for each of `texts`, at once; how many carried output."""
        if self.keep_text or (self._chars < EXCERPT and not self._closed):
            for text in texts:
                if self.keep_text or (self._chars < EXCERPT and not self._closed):
                    self._parts.append(text)
                self._chars += len(text)
        else:
            self._chars += sum(map(len, texts))
        carried = len(texts) - texts.count("")
        self.content_events += carried
        return carried

    def feed(self, data: Any) -> bool:
        """Take one event; True when it carried output."""
        event = _dict(data)
        if not event:
            return False
        text, calls = self._read(event)
        if calls:
            self.out.tool_calls += calls
        if text:
            if self.keep_text or (self._chars < EXCERPT and not self._closed):
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


# -- a long whole answer, read at its two ends ---------------------------------------------

HEAD_WINDOW = 2048  # bytes of a whole answer's start read for its text's excerpt
TAIL_WINDOW = 4096  # bytes of a whole answer's end read for its usage, timings, finish
# The text's key, for the endpoints whose long answers are read at their ends; llama-server
# writes it first in the first choice (after `finish_reason` and `index` in a chat answer).
TEXT_KEYS = {"/v1/chat/completions": b'"content":"', "/v1/completions": b'"text":"'}
FINISH = re.compile(rb'"finish_reason":(?:null|"([^"\\]*)")')


def from_ends(path: str, payload: bytes | bytearray) -> Outcome | None:
    """The outcome of a long whole answer from engine endpoint `path` (chat, legacy
    completions, embeddings), read from its first HEAD_WINDOW and last TAIL_WINDOW bytes
    and never parsed whole: the text's start (its excerpt), the finish reason, `usage` and
    `timings` (llama-server writes these two last), or for embeddings `usage` alone (which
    llama-server writes before the vectors). What `from_response` reads from the whole
    answer, except that the text is only as much of it as the head held (then
    `complete` is False) and `tool_calls` is not counted (the text is not blank, so no
    check reads it). None when the ends do not hold all of that (no text in the head,
    a blank one, no usage or timings in the tail, another endpoint): then parse it whole.
    One choice only: the caller knows whether the request asked for more."""
    head, tail = bytes(payload[:HEAD_WINDOW]), bytes(payload[-TAIL_WINDOW:])
    out = Outcome()
    if "embeddings" in path:
        usage = object_in(head, "usage", last=False)
        if usage is None:
            usage = object_in(tail, "usage", last=True)
        if usage is None:
            return None
        read_usage(out, usage)
        return out
    key = TEXT_KEYS.get(path)
    if key is None or (at := head.find(key)) < 0:
        return None
    text, whole = _string_start(head, at + len(key))
    if text is None or not text.strip() or (not whole and len(text) < EXCERPT):
        return None
    usage, timings = object_in(tail, "usage", last=True), object_in(tail, "timings", last=True)
    if usage is None or timings is None:
        return None
    found = FINISH.search(head, 0, at)  # a chat answer's: before its message
    if found is None:  # a legacy completion's: after its text, the last in the tail
        *_, found = [None, *FINISH.finditer(tail)]
        if found is None:
            return None
    out.text, out.complete = text, whole
    out.finish = found.group(1).decode() if found.group(1) is not None else None
    read_usage(out, usage)
    read_timings(out, timings)
    return out


def object_in(window: bytes, key: str, *, last: bool) -> Any:
    """The JSON object under `"key":` in `window`, a slice of an answer's bytes (its
    key's last occurrence, or first), read without parsing anything else: the object
    from the key up to its first closing brace that parses (a flat object of numbers
    parses at the first). None when the window has no such object."""
    name = b'"' + key.encode() + b'":'
    at = window.rfind(name) if last else window.find(name)
    if at < 0:
        return None
    start = window.find(b"{", at)
    if start < 0 or window[at + len(name) : start].strip():
        return None
    close = start
    for _ in range(8):  # nested objects: a few more braces at most
        close = window.find(b"}", close + 1)
        if close < 0:
            return None
        with contextlib.suppress(orjson.JSONDecodeError):
            found = orjson.loads(window[start : close + 1])
            return found if isinstance(found, dict) else None
    return None


def _string_start(window: bytes, start: int) -> tuple[str | None, bool]:
    """The JSON string whose text begins at `start` (just past its opening quote), and
    whether it ended within `window`; when it did not, as much of it as decodes (an
    escape or a UTF-8 sequence cut by the window's end left out). None: not a string."""
    end = start
    while (end := window.find(b'"', end)) >= 0:
        slashes = end - len(window[start:end].rstrip(b"\\")) - start
        if slashes % 2 == 0:  # not escaped: the string's end
            with contextlib.suppress(orjson.JSONDecodeError):
                text = orjson.loads(window[start - 1 : end + 1])
                return (text, True) if isinstance(text, str) else (None, True)
            return None, True
        end += 1
    raw = window[start:]
    for cut in range(len(raw), max(-1, len(raw) - 12), -1):  # an escape is 12 bytes at most
        with contextlib.suppress(orjson.JSONDecodeError):
            text = orjson.loads(b'"' + raw[:cut] + b'"')
            return (text if isinstance(text, str) else None), False
    return None, False
