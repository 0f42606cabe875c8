"""A request's prompt tokens, counted with the model's own tokenizer, and the preflight.

`blazar.serve.request.admission.admitted` (step 6 of the request path, `Pipeline.admit`)
calls this after the lease, before the body goes to the child, for all three protocols.
The preflight refuses (400) a prompt that cannot fit the slot's context with its
requested output, naming the sizes and the fixes, instead of letting the engine
truncate or fail late.

Counting asks the child (`ChildConnections.json`): `/apply-template` then
`/tokenize` for a chat body, `/tokenize` for a completion prompt, and
`/v1/messages/count_tokens` for Anthropic's body; a chat whose rendered prompt
is short enough in bytes to fit is not tokenized (tokenizing is the dearer
half: measured 54 of 58 ms for 1,450 Gemma tokens). To keep the pass-through
lean most requests are not counted at all: a token covers at least one byte
of the rendered prompt, so `bound` gives an upper limit from the body's size,
its message count and the template's overhead (measured once per instance by
rendering an empty conversation, `Probe`), and only a request whose bound does
not fit is counted. Tools and batch prompts are always counted or skipped (a
template renders tools in ways the bound cannot see). A count that fails (the
template refuses the body, the child is gone) skips the preflight: the engine
then answers in its own words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.protocols import ProtocolError
from blazar.serve.request.steps import OUTPUT_LIMITS
from blazar.serve.supervisor.child_http import ChildConnections, UpstreamError
from blazar.serve.supervisor.instance import Instance, InstanceId, instance_id

CHAT, COMPLETION, MESSAGES = "chat", "completion", "messages"
KINDS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/completion": COMPLETION,
    "/v1/messages": MESSAGES,
}
# The empty conversation whose rendering measures a template's overhead.
PROBE = [{"role": r, "content": ""} for r in ("system", "user", "assistant", "user")]
SLACK_PER_MESSAGE = 18  # bytes a role name may add over the probe's, and fragment prefixes
SPECIALS = 2  # BOS and EOS a tokenizer may add without text


@dataclass(frozen=True)
class Probe:
    """What one instance's template adds to a conversation (bytes)."""

    overhead: int | None  # bytes of the empty probe conversation; None: its template refused it


def requested_output(body: Mapping[str, Any]) -> int:
    """Tokens the request asks to generate (0 when it sets no limit)."""
    for key in OUTPUT_LIMITS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def messages_of(kind: str, body: Mapping[str, Any]) -> int | None:
    """How many messages the bound must allow for; None where no bound applies (tools, a
    batch or token prompt), so the request is counted."""
    if body.get("tools"):
        return None
    if kind == COMPLETION:
        return 0 if isinstance(body.get("prompt"), str) else None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    return len(messages) + (1 if kind == MESSAGES and body.get("system") else 0)


def bound(size: int, messages: int, overhead: int) -> int:
    """Pure: at most how many tokens a body of `size` bytes renders to."""
    if messages == 0:
        return size + SPECIALS
    return size + overhead + messages * (overhead // len(PROBE) + SLACK_PER_MESSAGE) + SPECIALS


def fits(prompt: int, output: int, ctx: int) -> bool:
    """Pure: a prompt and its requested output fit a slot (the engine needs one free
    position after the prompt even with no limit set)."""
    return prompt + max(output, 1) <= ctx


def output_cap(
    model: str, prompt: int | None, output: int, ctx: int, *, strict: bool = False
) -> int | None:
    """Pure: the output limit a request is served with when its prompt fits the slot but
    its requested output does not (None: it fits as asked, or its size is unknown); a
    prompt that leaves no room to answer is `too_long`, and so is any overflow when
    `strict`."""
    if prompt is None or fits(prompt, output, ctx):
        return None
    if strict or not fits(prompt, 1, ctx):
        raise too_long(model, prompt, output, ctx)
    return ctx - prompt


def too_long(model: str, prompt: int, output: int, ctx: int) -> ProtocolError:
    """The 400 a prompt that cannot fit gets: the sizes and the ways out."""
    total = prompt + output
    asked = f"{prompt} prompt tokens" + (f" and {output} output tokens ({total})" if output else "")
    return ProtocolError(
        400,
        f"this request needs {asked}, more than the {ctx} tokens of context model '{model}' "
        "has per slot: shorten the prompt or lower the output limit, or give the model more "
        f"context: raise models.{model}.ctx and apply (ollama's num_ctx asks for up to it), "
        f'quantize the KV cache to fit a larger ctx in the same memory (cache_type = "q8_0"), '
        f"or pick a smaller quant; `blazar fit {model} --ctx {max(total, prompt + 1)}` says "
        "what fits",
        "context_length_exceeded",
    )


def anthropic_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic body as the chat messages the template renders (text blocks only):
    what the session bank matches prefixes with; the count itself is the engine's."""

    def text(content: Any) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                b.get("text", "")
                for b in content
                if isinstance(b, dict) and b.get("type") == "text"
            )
        return ""

    messages = [{"role": "system", "content": text(body["system"])}] if body.get("system") else []
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            role = str(message.get("role"))
            messages.append({"role": role, "content": text(message.get("content"))})
    return {"messages": messages}


class Prompts:
    """Counts tokens through the children; one per gateway (`Services.prompts`)."""

    def __init__(self, children: ChildConnections) -> None:
        self.children = children
        self._probes: dict[InstanceId, Probe] = {}

    async def probe(self, instance: Instance, url: str) -> Probe:
        """The instance's template overhead, measured on first use."""
        key = instance_id(instance)
        found = self._probes.get(key)
        if found is None:
            status, data = await self.children.json(url, "/apply-template", {"messages": PROBE})
            prompt = data.get("prompt") if status == 200 and isinstance(data, dict) else None
            overhead = len(prompt.encode()) if isinstance(prompt, str) else None
            found = self._probes[key] = Probe(overhead)
            for stale in [k for k in self._probes if k[0] == key[0] and k != key]:
                del self._probes[stale]  # an earlier child of this instance
        return found

    async def token_ids(self, url: str, kind: str, body: Mapping[str, Any]) -> list[int] | None:
        """The prompt's token ids as the engine sees them (None when it cannot tell)."""
        if kind == COMPLETION:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
        else:
            prompt = await self.render(url, kind, body)
        return await self.tokenize(url, prompt) if isinstance(prompt, str) else None

    async def render(self, url: str, kind: str, body: Mapping[str, Any]) -> str | None:
        """A chat body as the prompt text its template makes (None if the template refused)."""
        chat = anthropic_chat(body) if kind == MESSAGES else dict(body)
        chat.pop("stream", None)
        status, data = await self.children.json(url, "/apply-template", chat)
        prompt = data.get("prompt") if status == 200 and isinstance(data, dict) else None
        return prompt if isinstance(prompt, str) else None

    async def tokenize(self, url: str, prompt: str) -> list[int] | None:
        request = {"content": prompt, "add_special": True, "parse_special": True}
        status, data = await self.children.json(url, "/tokenize", request)
        tokens = data.get("tokens") if status == 200 and isinstance(data, dict) else None
        return tokens if isinstance(tokens, list) else None

    async def count(
        self, url: str, kind: str, body: Mapping[str, Any], *, output: int = 0, ctx: int = 0
    ) -> int | None:
        """How many prompt tokens the engine will see; None when it cannot tell. For a chat,
        0 when the rendered prompt's bytes alone prove it fits `ctx` with `output`: the
        tokenizer, the dearer half of a count, is then skipped."""
        if kind == MESSAGES:
            status, data = await self.children.json(url, "/v1/messages/count_tokens", dict(body))
            n = data.get("input_tokens") if status == 200 and isinstance(data, dict) else None
            return n if isinstance(n, int) else None
        if kind == COMPLETION:
            tokens = await self.token_ids(url, kind, body)
            return None if tokens is None else len(tokens)
        prompt = await self.render(url, kind, body)
        if prompt is None:
            return None
        messages = len(body.get("messages") or ())
        if ctx and fits(len(prompt.encode()) + SPECIALS + 2 * (messages + 1), output, ctx):
            return 0  # a fragment's dummy prefix may add a token around each special token
        tokens = await self.tokenize(url, prompt)
        return None if tokens is None else len(tokens)

    async def preflight(
        self,
        instance: Instance,
        url: str,
        *,
        model: str,
        ctx: int,
        kind: str,
        body: Mapping[str, Any],
        size: int,
        tokens: list[int] | None = None,
        strict: bool = False,
    ) -> int | None:
        """Raise `too_long` for a prompt that cannot fit; count only when the bound says
        it might not. `ctx`: the context one request can use (`ModelRuntime.slot_ctx`, the
        figure `blazar ps` shows); `tokens`: the prompt's ids when the caller has them.

        A prompt that fits with room to spare but not with the output the request asks
        for is served with the output capped: the limit to send is returned (None: the
        request fits as it is). `strict` refuses it instead (serving.prompt_preflight =
        "strict"): agent clients ask for tens of thousands of output tokens by default."""
        output = requested_output(body)
        try:
            probe = self._probes.get(instance_id(instance)) or await self.probe(instance, url)
            n = messages_of(kind, body)
            bounded = tokens is None and n is not None and (n == 0 or probe.overhead is not None)
            if bounded and fits(bound(size, n or 0, probe.overhead or 0), output, ctx):
                return None
            exact = tokens is not None and kind != MESSAGES  # Anthropic's ids are approximate
            if exact and tokens is not None:
                prompt: int | None = len(tokens)
            else:
                prompt = await self.count(url, kind, body, output=output, ctx=ctx)
        except UpstreamError:
            return None  # the call will meet the same failure and answer it
        return output_cap(model, prompt, output, ctx, strict=strict)
