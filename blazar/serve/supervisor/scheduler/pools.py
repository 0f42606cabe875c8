"""The scheduler's values: a model's pool of instances, its members, waiters and leases.

Made and changed only by the scheduler's parts (`queueing`, `capacity`, `reload`,
`core`); the request path reads a `Target` and a `Lease`, the session bank and the
metrics read pools. A pool's life:

- unloaded: `loaded` False, `stopping` None;
- loaded: `loaded` True (reserved as soon as a load is decided, before its child runs);
  `loading` is set while that load waits for the children it evicted to stop;
- draining: loaded, with `stopping` set (`blazar stop`, keep_alive 0 from a request):
  requests already in flight or queued finish, new ones wait for the next load;
- unloading: `loaded` False, `stopping` set until its children have stopped.

A pool can have an `elder`: the previous pool of the same model, still loaded and
serving what it can after adapters were added to the model (docs/lora.md); it is
dropped the first time it unloads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from blazar.serve.supervisor.instance import Instance, State
from blazar.serve.supervisor.runtime import ModelRuntime
from specs.names import AdapterChoice


@dataclass
class Member:
    instance: Instance
    in_flight: int = 0
    placed: tuple[str, ...] = ()  # the placement's flags at the end of its child's args


@dataclass(frozen=True)
class Waiter:
    """A queued request: handed a member (with its slot counted) when one frees up; only
    `member` when it addressed one replica (`model#N`)."""

    future: asyncio.Future[Member]
    member: Member | None = None

    def accepts(self, member: Member) -> bool:
        return self.member is None or self.member is member


@dataclass(frozen=True)
class Placement:
    """Where a model's bytes go: one device, or several (a split)."""

    shares: tuple[tuple[str, int], ...]  # (device, bytes)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.shares)

    def scaled(self, size: int) -> Placement:
        """Pure: the same devices holding `size` bytes in all, in the same proportions (a
        footprint measured after the load was placed on the estimate)."""
        total = sum(b for _, b in self.shares)
        if total <= 0 or size == total:
            return self
        shares = [(d, b * size // total) for d, b in self.shares]
        last_device, last = shares[-1]
        shares[-1] = (last_device, last + size - sum(b for _, b in shares))
        return Placement(tuple(shares))

    def on(self, device: str) -> int:
        return sum(b for d, b in self.shares if d == device)

    def flags(self, *, device_list: bool = True) -> tuple[str, ...]:
        """Pure: the engine flags that put the model where it was placed on GPUs (nothing
        on host RAM). llama-server (`device_list`): `--device` with the GPUs, and
        `--tensor-split` with each one's share when there are several. The wheel's
        launcher has no device list (xllamacpp): one GPU is `--split-mode none
        --main-gpu N`, several a `--tensor-split` indexed by device, 0 for the others."""
        gpus = sorted((int(d.split(":")[1]), b) for d, b in self.shares if d.startswith("gpu:"))
        if not gpus:
            return ()
        if device_list:
            names = ",".join(f"CUDA{i}" for i, _ in gpus)
            if len(gpus) == 1:
                return ("--device", names)
            return ("--device", names, "--tensor-split", ",".join(str(b) for _, b in gpus))
        if len(gpus) == 1:
            return ("--split-mode", "none", "--main-gpu", str(gpus[0][0]))
        share = dict(gpus)
        split = ",".join(str(share.get(i, 0)) for i in range(max(share) + 1))
        return ("--split-mode", "layer", "--tensor-split", split)


@dataclass(eq=False)
class Pool:
    """The instances of one model (one per replica) and its queue."""

    runtime: ModelRuntime
    members: list[Member]
    waiters: deque[Waiter] = field(default_factory=deque)
    loaded: bool = False
    last_used: float = 0.0
    expires_at: float | None = None  # None: no expiry while loaded
    retired: bool = False  # replaced or removed: drains, then stops for good
    stopping: asyncio.Future[None] | None = None  # draining or unloading; done once stopped
    loading: asyncio.Future[None] | None = None  # waiting for the room its load freed
    claimed: bool = False  # being stopped to make room for a load that counts instead
    elder: Pool | None = None  # the model's previous pool, serving on (docs/lora.md)
    superseded: bool = False  # this pool is an elder: once unloaded, it is dropped
    placement: Placement | None = None  # where its room was taken (memory.plan_memory)
    loaded_at: float = 0.0  # when its load was decided: serving.min_residency counts from it

    @property
    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.members)

    @property
    def capacity(self) -> int:
        return self.runtime.slots * len(self.members)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and not self.waiters and self.loading is None

    @property
    def sticky(self) -> bool:
        """Never evicted nor expired: pinned, or warm replicas kept up."""
        return self.runtime.pin or self.runtime.replicas > 0

    @property
    def draining(self) -> bool:
        return self.loaded and self.stopping is not None

    @property
    def evictable(self) -> bool:
        return self.loaded and self.idle and not self.sticky and self.stopping is None

    def has_adapters(self, adapters: tuple[AdapterChoice, ...] | None) -> bool:
        """Whether this pool's children loaded every adapter a request chose (None: the
        always-on ones, the same in a pool and its elder)."""
        return all(self.runtime.adapter_index(c.name) is not None for c in adapters or ())

    def serving(self, adapters: tuple[AdapterChoice, ...] | None) -> Pool:
        """The pool a request for these adapters goes to now: the elder while it is loaded
        and has them (its children keep their caches), else this one."""
        elder = self.elder
        if elder is None or not elder.loaded or elder.draining:
            return self
        return elder if elder.has_adapters(adapters) else self


@dataclass(frozen=True)
class Target:
    """What a requested name resolved to: a model's pool, the adapters asked for (None:
    the model's always-on ones) and the replica, when one was addressed (`model#N`)."""

    pool: Pool
    adapters: tuple[AdapterChoice, ...] | None = None
    replica: int | None = None

    @property
    def runtime(self) -> ModelRuntime:
        return self.pool.runtime

    @property
    def ready(self) -> bool:
        """Loaded with every instance ready: a lease now starts nothing."""
        pool = self.pool.serving(self.adapters)
        return pool.loaded and all(m.instance.state == State.READY for m in pool.members)


@dataclass(frozen=True)
class Decision:
    """How `acquire` chose the instance, for the request's trace (`blazar why`)."""

    how: str = "warm"  # warm | least_loaded | affinity | spawned | queued
    evicted: tuple[str, ...] = ()  # models unloaded to make room
    queue_ns: int = 0  # waiting in the model's queue for a slot
    load_ns: int = 0  # loading the model and starting the instance
    in_flight: int = 0  # requests already on the chosen instance
    replicas: int = 1
    room_ns: int = 0  # waiting for room: busy or just-loaded models holding the memory


@dataclass(frozen=True)
class Lease:
    pool: Pool
    member: Member
    adapters: tuple[AdapterChoice, ...] | None = None  # as in Target
    decision: Decision = Decision()

    @property
    def lora(self) -> list[dict[str, Any]] | None:
        """The engine's per-request `lora` list for this request (None: the body needs none),
        numbered as the leased child loaded its adapters."""
        return self.pool.runtime.lora_field(self.adapters)

    @property
    def url(self) -> str:
        url = self.member.instance.url
        assert url is not None
        return url

    @property
    def runtime(self) -> ModelRuntime:
        return self.pool.runtime
