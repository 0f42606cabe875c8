"""Cache-bust detection: a client whose system prompt changes while its conversation goes on.

llama.cpp reuses the prompt prefix a slot (or its host-memory cache) already holds.
A client that puts a counter or a timestamp in its system message changes the very
first tokens every turn, so the whole conversation is prefilled again each time.

Pure parts: `turn` reads a request body (OpenAI chat, Anthropic messages, the
Responses API) into hashes of its system prompt and of each other message;
`busts` says whether a turn, following the client's previous one for the same
model, shows the pattern: both have a system prompt, it differs, the rest of the
conversation continues the previous one, and the prompt cache reused little.
`Tracker` keeps the last turn per (client, model), bounded, and counts the busts
per client for `blazar doctor`. `blazar.serve.state.tracing` calls it when a request
is done; the finding goes on the trace as `cache_bust_system` with `FIX`.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

FINDING = "cache_bust_system"
FIX = (
    "keep the system prompt byte-stable across turns and move per-turn values (counters, "
    "timestamps, dates) into the last user message"
)
LOW_CACHE_RATIO = 0.5
SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Turn:
    """One request's conversation, as hashes: never the text."""

    system: int | None
    rest: tuple[int, ...]


def digest(value: Any) -> str:
    """A short stable hash of a text or a JSON value."""
    data = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.blake2b(data.encode("utf-8", "replace"), digest_size=8).hexdigest()


def turn(body: Mapping[str, Any]) -> Turn | None:
    """The conversation a request body carries; None for a bare prompt."""
    messages = body.get("messages")
    system_parts: list[Any] = []
    if body.get("system") is not None:  # Anthropic
        system_parts.append(body["system"])
    if body.get("instructions") is not None:  # the Responses API
        system_parts.append(body["instructions"])
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body.get("input"), list) else None
    if messages is None:
        return None
    rest: list[int] = []
    for message in messages:
        if not isinstance(message, dict):  # JSON: a dict, never another Mapping
            rest.append(_hash(message))
        elif message.get("role") in SYSTEM_ROLES and not rest:
            system_parts.append(message.get("content"))
        else:
            rest.append(hash((message.get("role"), _hash(message.get("content")))))
    system = _hash(system_parts) if system_parts else None
    return Turn(system, tuple(rest))


def _hash(value: Any) -> int:
    """Python's own hash: turns are compared in memory only, within one process."""
    if isinstance(value, str):
        return hash(value)
    try:
        return hash(orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS))
    except TypeError:  # what orjson cannot write (an integer past 64 bits): json can
        return hash(json.dumps(value, sort_keys=True, default=str))


def busts(
    previous: Turn, current: Turn, prompt_tokens: int | None, cached_tokens: int | None
) -> bool:
    """Whether `current`, after `previous` from the same client and model, re-prefilled the
    conversation because only its system prompt changed."""
    if previous.system is None or current.system is None or previous.system == current.system:
        return False
    if not previous.rest or current.rest[: len(previous.rest)] != previous.rest:
        return False  # another conversation, not the same one going on
    if prompt_tokens and cached_tokens is not None:
        return cached_tokens / prompt_tokens < LOW_CACHE_RATIO
    return True  # the engine did not say what it reused: the pattern alone is enough


@dataclass
class Buster:
    """A client seen busting the cache, for `blazar doctor`."""

    client: str
    model: str
    count: int
    last: float  # time.time() of the last bust

    def to_dict(self) -> dict[str, Any]:
        return {"client": self.client, "model": self.model, "count": self.count, "last": self.last}


class Tracker:
    """The last turn of each (client, model), and the busts seen; both bounded."""

    def __init__(self, max_clients: int = 4096) -> None:
        self.max_clients = max_clients
        self._last: OrderedDict[tuple[str, str], Turn] = OrderedDict()
        self._busters: OrderedDict[tuple[str, str], Buster] = OrderedDict()

    def observe(
        self,
        client: str,
        model: str,
        current: Turn,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        now: float,
    ) -> bool:
        """Record a turn; True when it busted the cache."""
        key = (client, model)
        previous = self._last.pop(key, None)
        self._last[key] = current
        if len(self._last) > self.max_clients:
            self._last.popitem(last=False)
        if previous is None or not busts(previous, current, prompt_tokens, cached_tokens):
            return False
        buster = self._busters.pop(key, None) or Buster(client, model, 0, now)
        buster.count += 1
        buster.last = now
        self._busters[key] = buster
        if len(self._busters) > self.max_clients:
            self._busters.popitem(last=False)
        return True

    def busters(self) -> list[Buster]:
        """Clients seen busting the cache, the most recent first."""
        return sorted(self._busters.values(), key=lambda b: b.last, reverse=True)
