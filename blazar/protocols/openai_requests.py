"""What the OpenAI pass-through checks and changes in a request before the engine sees it.

`/v1/chat/completions` and `/v1/completions` go to llama-server as they came
(`blazar.serve.routes.openai_api`); `shape_request(path, body)` is the one look at a
request on the way, and returns a `Shaping`: the capabilities the request needs
from the model's chat template (`tools`), a replacement body where the engine
must be asked differently than the client asked, and how the reply must be
reshaped (`blazar.protocols.openai_completions`). Most requests need nothing:
they get `UNCHANGED`, and their bytes travel untouched.

Refused here, with a 400 that says why, because the engine would accept them
and do something else (checked with xllamacpp 2026.10.11549):

- image parts for a model without a vision projector (the engine answers them with a
  500), and audio, file and video parts for every model (Blazar loads vision
  projectors only); `image_refs` and `with_images` find a vision model's images and
  put them back checked, as `data:` URLs (`blazar.serve.request.images`);
- `tool_choice` "required" or a named function: it does not force a tool call
  with any template shipped here, nor with Gemma 3 270M's; `auto` and `none` pass;
- legacy `functions` / `function_call`: it ignores them (use `tools`);
- legacy completions with `echo` and `logprobs` together: it cannot score prompt
  tokens; `echo` with a prompt that is not text; `max_tokens: 0` (it generates a
  token anyway).

Changed on the way: chat `logprobs: true` without `top_logprobs` (the engine then
sends 20 alternatives per token, or with `top_logprobs: 0` no logprobs at all) asks
for one and the reply drops them, as OpenAI returns none; legacy `logprobs: N`
asks the engine for at least one alternative and the reply is put in the legacy
shape. `engine_refusal` turns an engine 500 that is really the client's mistake
(a message it could not parse) into a 400, and says why a grammar failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.protocols import ImageRef, ProtocolError

__all__ = [
    "UNCHANGED",
    "Reply",
    "Shaping",
    "engine_refusal",
    "image_refs",
    "shape_request",
    "with_images",
]

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
MEDIA_PARTS = ("image_url", "input_audio", "file", "video_url", "input_image")
# Engine 500s that are the client's mistake: it could not read what it was sent.
CLIENT_MISTAKES = ("Failed to parse messages", "Failed to parse tools", "Missing tool call")
NO_PROJECTOR = ("image input is not supported", "audio input is not supported")
NO_GRAMMAR = "Failed to initialize samplers"  # a grammar over a vocabulary it cannot use


@dataclass(frozen=True)
class Reply:
    """How the engine's answer is reshaped for the client (see `openai_completions`).

    `legacy`: a `/v1/completions` answer (the `cmpl-` id; `logprobs` in the legacy
    shape when `top` is not None, with `top` alternatives per token); `echo`: the
    prompts to put in front of each choice's text; `drop_top`: a chat answer whose
    `top_logprobs` the client did not ask for.
    """

    legacy: bool = False
    top: int | None = None
    echo: tuple[str, ...] = ()
    drop_top: bool = False

    @property
    def rewrites_events(self) -> bool:
        """Whether a stream must be decoded event by event (else only its ids change)."""
        return self.top is not None or bool(self.echo) or self.drop_top


@dataclass(frozen=True)
class Shaping:
    """What `shape_request` decided: capabilities needed, a new body, the reply's shape."""

    needs: tuple[str, ...] = ()
    body: dict[str, Any] | None = None  # None: send the client's bytes as they are
    reply: Reply | None = None  # None: copy the engine's answer as it is


UNCHANGED = Shaping()
LEGACY = Shaping(reply=Reply(legacy=True))


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


def _parts(messages: Any) -> list[tuple[int, int, Mapping[str, Any]]]:
    """(message index, part index, part) of every content part of a chat's messages."""
    if not isinstance(messages, list):
        return []  # the engine says what is wrong with it
    found = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            found += [(i, j, p) for j, p in enumerate(content) if isinstance(p, Mapping)]
    return found


def _image_url(part: Mapping[str, Any]) -> str | None:
    """An `image_url` part's URL (`image_url` a string or `{"url": ...}`); None if none."""
    if part.get("type") != "image_url":
        return None
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    return url if isinstance(url, str) and url else None


def _media(messages: Any, has_vision: bool) -> None:
    for i, j, part in _parts(messages):
        kind = part.get("type")
        if kind == "image_url" and has_vision:
            if _image_url(part) is None:
                raise _bad(f"messages[{i}].content[{j}].image_url.url must be a URL string")
        elif kind == "image_url" or (kind in MEDIA_PARTS and not has_vision):
            raise _bad(
                f"messages[{i}].content[{j}]: {kind} content is not supported: this "
                "model has no vision or audio projector. Use a model served with one, "
                "or send text only."
            )
        elif kind in MEDIA_PARTS:
            raise _bad(
                f"messages[{i}].content[{j}]: {kind} content is not supported: Blazar loads "
                "vision projectors only (images as image_url parts); send text and images"
            )


def image_refs(body: Mapping[str, Any]) -> list[ImageRef]:
    """The chat's `image_url` parts that name a URL, in order (the others are refused by
    `shape_request`)."""
    return [
        ImageRef(f"messages[{i}].content[{j}].image_url", url)
        for i, j, part in _parts(body.get("messages"))
        if (url := _image_url(part)) is not None
    ]


def with_images(body: Mapping[str, Any], urls: list[str]) -> dict[str, Any]:
    """The body with its `image_url` parts' URLs replaced by `urls`, in order (a copy:
    the messages that change are new objects)."""
    pending = iter(urls)
    messages = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list) or not any(
            isinstance(p, Mapping) and _image_url(p) is not None for p in content
        ):
            messages.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, Mapping) and _image_url(part) is not None:
                old = part["image_url"]
                kept = dict(old) if isinstance(old, Mapping) else {}  # and `detail`
                part = {**part, "image_url": {**kept, "url": next(pending)}}
            parts.append(part)
        messages.append({**message, "content": parts})
    return {**body, "messages": messages}


def _tool_choice(choice: Any) -> None:
    if choice is None or choice in ("auto", "none"):
        return
    if choice == "required" or isinstance(choice, Mapping):
        what = "'required'" if choice == "required" else "a named function"
        raise _bad(
            f"tool_choice {what}: this engine cannot force a tool call with this model's "
            "chat template; send tool_choice 'auto' (or leave it out) and check the "
            "answer for tool_calls"
        )
    raise _bad(f"tool_choice must be 'auto', 'none', 'required' or an object; got {choice!r}")


def _chat(body: Mapping[str, Any], has_vision: bool) -> Shaping:
    _media(body.get("messages"), has_vision)
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise _bad(
            "functions and function_call are not supported (deprecated by OpenAI); send tools"
        )
    _tool_choice(body.get("tool_choice"))
    needs = ("tools",) if body.get("tools") and body.get("tool_choice") != "none" else ()
    if body.get("logprobs") is True and not body.get("top_logprobs"):
        return Shaping(needs, {**body, "top_logprobs": 1}, Reply(drop_top=True))
    return Shaping(needs) if needs else UNCHANGED


def _prompts(prompt: Any) -> tuple[str, ...] | None:
    """The prompt as texts, or None when it is not text (token ids)."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    return None


def _completions(body: Mapping[str, Any]) -> Shaping:
    if body.get("max_tokens") == 0:
        raise _bad("max_tokens must be at least 1: this engine always generates a token")
    logprobs, echo = body.get("logprobs"), body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise _bad(f"echo must be true or false, got {echo!r}")
    top = None if logprobs is None or logprobs is False else logprobs
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise _bad(f"logprobs must be an integer from 0 to 20, got {logprobs!r}")
    prompts: tuple[str, ...] = ()
    if echo:
        if top is not None:
            raise _bad(
                "echo with logprobs is not supported: this engine cannot score the prompt's "
                "tokens; send echo or logprobs, not both"
            )
        found = _prompts(body.get("prompt"))
        if found is None:
            raise _bad("echo needs the prompt as text (a string or a list of strings)")
        prompts = found
    if top is None and not prompts:
        return LEGACY
    out = {k: v for k, v in body.items() if k != "echo"}
    if top is not None:
        out["logprobs"] = max(1, top)  # the engine sends none for 0
    return Shaping(body=out, reply=Reply(legacy=True, top=top, echo=prompts))


def shape_request(path: str, body: Mapping[str, Any], *, has_vision: bool = False) -> Shaping:
    """Check an OpenAI pass-through request; say what it needs and what changes.
    `has_vision`: the model has a vision projector, so image parts may pass."""
    if path == CHAT_PATH:
        return _chat(body, has_vision)
    if path == COMPLETIONS_PATH:
        return _completions(body)
    return UNCHANGED


def engine_refusal(status: int, payload: Any) -> str | None:
    """A 400's message for an engine error that is the client's to fix, else None: a 5xx
    that is really the client's mistake, or a grammar the vocabulary cannot take (said
    with what asked for it)."""
    if status < 400 or not isinstance(payload, Mapping):
        return None
    error = payload.get("error")
    message = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(message, str):
        return None
    if message.startswith(NO_GRAMMAR):
        return (
            f"{message}: the grammar engine cannot constrain this model's vocabulary, so "
            "structured output (format, response_format, json_schema, a forced tool call) "
            "is not available with it; send the request without one"
        )
    if status < 500:
        return None
    if message.startswith(CLIENT_MISTAKES):
        return f"the request is malformed: {message}"
    if message.startswith(NO_PROJECTOR):
        return f"{message.split(' - ')[0]}: this model has no vision or audio projector"
    return None
