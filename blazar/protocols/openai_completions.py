"""OpenAI pass-through replies reshaped where llama-server's differ from OpenAI's.

`blazar.serve.routes.openai_api` copies a child's answer to the client; when
`openai_requests.shape_request` returned a `Reply`, it passes the answer through
here first: a whole JSON body through `reshape_body`, a stream event by event
through `ReplyStream` (or, when only the id changes, through `IdRenamer`, which
rewrites the bytes as they pass without decoding them).

What changes (observed with xllamacpp 2026.10.11549):

- Legacy `/v1/completions` ids start with `chatcmpl-`; OpenAI's with `cmpl-`.
- Legacy `logprobs` come back in the chat shape (`content: [{token, logprob,
  top_logprobs: [...]}]`); evaluation harnesses read the legacy one: `tokens`,
  `token_logprobs`, `top_logprobs` (one `{token: logprob}` per position) and
  `text_offset` (each token's character offset in the choice's `text`).
- `echo` is ignored; the prompt is put in front of each choice's text (a stream's
  first chunk of each choice).
- Chat `top_logprobs` the client did not ask for are dropped (`[]` per token).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from blazar.protocols.openai_requests import Reply
from blazar.protocols.sse import DONE, SSEDecoder, encode

__all__ = [
    "IdRenamer",
    "Renamer",
    "ReplyStream",
    "legacy_logprobs",
    "model_renamer",
    "reshape",
    "reshape_body",
]

OLD_ID, NEW_ID = b'"id":"chatcmpl-', b'"id":"cmpl-'


def legacy_logprobs(content: Any, top: int, offset: int = 0) -> tuple[dict[str, Any], int]:
    """Chat-shaped logprobs -> the legacy shape; returns it and the offset after the last
    token (where the next chunk's tokens start)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []
    for entry in content if isinstance(content, list) else []:
        if not isinstance(entry, Mapping):
            continue
        token = str(entry.get("token", ""))
        tokens.append(token)
        token_logprobs.append(entry.get("logprob"))
        alternatives = entry.get("top_logprobs") or []
        top_logprobs.append({str(a.get("token", "")): a.get("logprob") for a in alternatives[:top]})
        text_offset.append(offset)
        offset += len(token)
    shape = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
    return shape, offset


def _drop_top(logprobs: Any) -> Any:
    if not isinstance(logprobs, Mapping) or not isinstance(logprobs.get("content"), list):
        return logprobs
    content = [
        {**entry, "top_logprobs": []} if isinstance(entry, Mapping) else entry
        for entry in logprobs["content"]
    ]
    return {**logprobs, "content": content}


class _Choices:
    """Per-choice state across a stream: the echo already sent, the text offset so far."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.echoed: set[int] = set()
        self.offsets: dict[int, int] = {}

    def choice(self, choice: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(choice)
        index = int(out.get("index") or 0)
        reply = self.reply
        if reply.echo and index not in self.echoed and index < len(reply.echo):
            self.echoed.add(index)
            out["text"] = reply.echo[index] + str(out.get("text") or "")
        if reply.top is not None:
            logprobs = out.get("logprobs")
            content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
            if content is None:
                out["logprobs"] = None
            else:
                shape, self.offsets[index] = legacy_logprobs(
                    content, reply.top, self.offsets.get(index, 0)
                )
                out["logprobs"] = shape
        if reply.drop_top:
            out["logprobs"] = _drop_top(out.get("logprobs"))
        return out


def reshape(data: Any, reply: Reply, state: _Choices | None = None) -> Any:
    """One engine JSON object (a whole answer or a stream chunk) reshaped for the client."""
    if not isinstance(data, Mapping):
        return data
    state = state or _Choices(reply)
    out = dict(data)
    if reply.legacy and isinstance(out.get("id"), str):
        out["id"] = "cmpl-" + out["id"].removeprefix("chatcmpl-")
    if isinstance(out.get("choices"), list):
        out["choices"] = [state.choice(c) if isinstance(c, Mapping) else c for c in out["choices"]]
    return out


def reshape_body(payload: bytes, reply: Reply) -> bytes:
    """A whole engine answer reshaped; an answer that is not JSON passes as it is."""
    if not reply.rewrites_events:
        return payload.replace(OLD_ID, NEW_ID, 1)
    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    return json.dumps(reshape(data, reply), separators=(",", ":")).encode()


class ReplyStream:
    """A stream reshaped event by event: feed the engine's bytes, write what comes out."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.decoder = SSEDecoder()
        self.state = _Choices(reply)

    def _events(self, events: list[Any]) -> bytes:
        out = []
        for event in events:
            data = event.data
            out.append(encode(data if data == DONE else reshape(data, self.reply, self.state)))
        return b"".join(out)

    def feed(self, chunk: bytes) -> bytes:
        return self._events(self.decoder.feed(chunk))

    def close(self) -> bytes:
        return self._events(self.decoder.close())


class Renamer:
    """One JSON key's value renamed in a stream's bytes, without decoding it: `old` and
    `new` are the key and value as the engine writes them (`"id":"chatcmpl-`).

    A chunk may end inside the pattern; that tail is held until the next chunk (never
    more than the pattern's length, and only then). Inside a JSON string a quote is
    escaped, so the generated text can never hold the pattern."""

    def __init__(self, old: bytes, new: bytes) -> None:
        self.old, self.new = old, new
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk if self.held else chunk
        data = data.replace(self.old, self.new)
        self.held = b""
        if data.endswith(b"\n"):  # events end with a blank line: the usual case
            return data
        start = max(0, len(data) - len(self.old) + 1)
        quote = data.find(b'"', start)
        while quote >= 0:
            if self.old.startswith(data[quote:]):
                self.held = data[quote:]
                return data[:quote]
            quote = data.find(b'"', quote + 1)
        return data

    def close(self) -> bytes:
        held, self.held = self.held, b""
        return held


class IdRenamer(Renamer):
    """`chatcmpl-` ids -> `cmpl-`: a legacy completion's stream."""

    def __init__(self) -> None:
        super().__init__(OLD_ID, NEW_ID)


def model_renamer(served: str, requested: str) -> Renamer:
    """The `model` the engine names (its alias, the model's name) -> the name the client
    asked for (`tiny+fox`, an alias, `tiny:latest`), which every protocol echoes."""
    return Renamer(
        b'"model":' + json.dumps(served).encode(), b'"model":' + json.dumps(requested).encode()
    )
