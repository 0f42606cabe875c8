"""Prefix affinity: a prompt goes back to the replica that saw its prefix a moment ago.

A child keeps the prompt it last processed in its slot's KV cache, a request cancelled
mid-prefill included: llama-server appends a prompt's tokens to `slot.prompt` batch by
batch as it decodes them, and a cancel (the gateway closes the child's connection when
its client leaves; the engine notices within its 1 s poll) releases the slot between
two batches and keeps them (docs/sessions.md, "Retries after a cancel"). A retry sent to
another replica recomputes all of it; sent to the same one it starts where the cancelled
prefill stopped. With several replicas, least-in-flight routing ties go to the first
replica, so a retry would land elsewhere whenever the cancelled request had gone to
another.

`prefix_keys` hashes a prompt's text at every whole `BLOCK` of bytes (a shared system
prompt and a retried prompt share their first keys); `PrefixAffinity` remembers, per
key, the replica that last served it and when, and `choose` answers the replica of the
longest key seen within `window` seconds. Pure values: no clock (callers pass `now`),
no I/O. The request path (`blazar.serve.request.pipeline`) asks before each lease of a
model with several replicas and remembers the replica it got; the scheduler takes the
answer as a preference (`Scheduler.acquire(prefer=)`): a replica with no free slot is
passed over for the least loaded one, never waited for. A wrong answer costs only a
cache miss, so the table is small and forgets the oldest keys first.

Within an instance of several slots the same holds for the slot: llama-server gives a
request an idle slot, and a retry that arrives while its cancelled prefill still runs
would get another, idle one and a cold prefill. So for a prompt with keys the request
path also picks the slot (llama-server's `id_slot`): `pick_slot` answers the slot that
served the prefix when no lease of the gateway holds it (the child may still be
finishing the cancelled batch: the retry waits for that slot, then starts where it
stopped), else the free slot used longest ago. Shorter prompts are left to the engine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b

BLOCK = 1024  # bytes of prompt text per key: short prompts have none (nothing to reuse)
MAX_BLOCKS = 256  # keys per prompt: the first 256 KiB of text decide
WINDOW = 60.0  # seconds a prefix stays where it was seen
CAPACITY = 8192  # keys remembered, across every model


def prefix_keys(
    model: str, text: str | None, *, block: int = BLOCK, limit: int = MAX_BLOCKS
) -> tuple[bytes, ...]:
    """The keys of `text`'s prefixes for `model`, one per whole block, shortest first.
    Each key names the model and everything before its block's end; () for no text or
    one shorter than a block."""
    if not text:
        return ()
    data = text.encode("utf-8", "surrogatepass")
    count = min(len(data) // block, limit)
    if count == 0:
        return ()
    digest = blake2b(model.encode(), digest_size=16)  # model name and prompt bytes apart
    digest.update(b"\0")
    keys = []
    for i in range(count):
        digest.update(data[i * block : (i + 1) * block])
        keys.append(digest.digest())  # digest() leaves the running hash as it was
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class Seen:
    replica: int
    at: float
    slot: int | None = None  # the slot the gateway chose for it (None: the engine's choice)


@dataclass
class PrefixAffinity:
    """Which replica served a prompt prefix last, for `window` seconds; at most
    `capacity` keys, the least recently seen forgotten first."""

    window: float = WINDOW
    capacity: int = CAPACITY
    _seen: OrderedDict[bytes, Seen] = field(default_factory=OrderedDict)

    def seen(self, keys: tuple[bytes, ...], now: float) -> Seen | None:
        """Where the longest of `keys` was served within the window, or None."""
        for key in reversed(keys):
            seen = self._seen.get(key)
            if seen is not None and now - seen.at <= self.window:
                return seen
        return None

    def choose(self, keys: tuple[bytes, ...], now: float) -> int | None:
        """The replica that served the longest of `keys` within the window, or None."""
        seen = self.seen(keys, now)
        return None if seen is None else seen.replica

    def remember(
        self, keys: tuple[bytes, ...], replica: int, now: float, slot: int | None = None
    ) -> None:
        """`replica` (its `slot`, when the gateway chose it) now holds every prefix in
        `keys`."""
        seen = Seen(replica, now, slot)
        for key in keys:
            self._seen[key] = seen
            self._seen.move_to_end(key)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


def pick_slot(
    slots: int, held: Collection[int], wanted: int | None, used: Mapping[int, float]
) -> int | None:
    """The slot of an instance of `slots` for a request: `wanted` (where its prefix is)
    when no lease holds it, else the free slot used longest ago (`used`: when each was
    last given out; never used first); None when the gateway's leases hold every slot."""
    if wanted is not None and 0 <= wanted < slots and wanted not in held:
        return wanted
    free = [s for s in range(slots) if s not in held]
    return min(free, key=lambda s: (used.get(s, float("-inf")), s)) if free else None


@dataclass
class SlotBook:
    """Which slots of one instance the gateway's leases hold, and when each was last
    given out (the request path's, per child)."""

    held: set[int] = field(default_factory=set)
    used: dict[int, float] = field(default_factory=dict)

    def take(self, slots: int, wanted: int | None, now: float) -> int | None:
        slot = pick_slot(slots, self.held, wanted, self.used)
        if slot is not None:
            self.held.add(slot)
            self.used[slot] = now
        return slot
