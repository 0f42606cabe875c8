"""Co-residency: the manifest's `[groups]` as the scheduler honours them.

Used by `capacity` (what a load asks of the groups, which idle models expire),
`memory` (a together group is evicted as one unit, never to load one of its own) and
`core` (a together group's companions loaded beside a model and unloaded with it), and
by `blazar coreside`. Everything here is pure: pools, groups and the clock come in as
values, decisions go out as values, tested with tables (tests/test_groups.py).

An exclusive group (llama-swap's `swap`): loading one of its models drains the others
that are loaded (their requests in flight and queued finish, as `blazar stop` does),
and the load waits for them to stop. A rival loaded less than `serving.min_residency`
ago, or still waiting for its own room, is not drained yet: the load waits for it (so
two clients alternating between the two models do not swap on every request). Pinned
models and warm replicas are never drained: the manifest refuses them in an exclusive
group. A together group: one unit for eviction and expiry (it goes when all its loaded
members may go), loaded as one (`core` loads the companions of a model it loads) and
unloaded as one (`core` drains the companions of a model that unloads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from blazar.serve.supervisor.scheduler.pools import Pool
from specs.manifest import Manifest
from specs.names import parse_name

Members = tuple[tuple[str, frozenset[str]], ...]  # (group name, its models' short names)


@dataclass(frozen=True)
class Groups:
    """The groups of the manifest, by the names the scheduler serves models under."""

    exclusive: Members = ()
    together: Members = ()

    @classmethod
    def of(cls, manifest: Manifest) -> Groups:
        """Pure: the manifest's groups, members named as their runtimes are (short names)."""
        exclusive: list[tuple[str, frozenset[str]]] = []
        together: list[tuple[str, frozenset[str]]] = []
        for name, group in manifest.groups.items():
            members = frozenset(parse_name(m).short for m in manifest.group_members(name))
            (exclusive if group.exclusive else together).append((name, members))
        return cls(tuple(exclusive), tuple(together))

    def rivals(self, model: str) -> frozenset[str]:
        """The models loading `model` unloads: the others of its exclusive groups."""
        return frozenset(m for _, ms in self.exclusive if model in ms for m in ms) - {model}

    def unit(self, model: str) -> frozenset[str]:
        """The models loaded and evicted as one with `model` (itself included): its
        together groups, and theirs in turn."""
        unit, grown = {model}, True
        while grown:
            grown = False
            for _, members in self.together:
                if members & unit and not members <= unit:
                    unit |= members
                    grown = True
        return frozenset(unit)

    def companions(self, model: str) -> frozenset[str]:
        """The models loaded and unloaded with `model` (not itself)."""
        return self.unit(model) - {model}

    def of_model(self, model: str) -> list[tuple[str, str]]:
        """(group, kind) of every group `model` is in."""
        return [(g, "exclusive") for g, ms in self.exclusive if model in ms] + [
            (g, "together") for g, ms in self.together if model in ms
        ]


@dataclass(frozen=True)
class Swap:
    """What loading a model asks of its exclusive groups: the rivals (with their together
    companions) to drain now, and those already being stopped to wait for."""

    leave: tuple[Pool, ...] = ()
    wait: tuple[Pool, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        """The models whose room the load takes (not those another load claimed)."""
        return frozenset(p.runtime.name for p in (*self.leave, *self.wait) if not p.claimed)


def plan_swap(
    pools: Sequence[Pool], loading: Pool, groups: Groups, now: float, min_residency: float
) -> Swap | None:
    """Pure: the rivals loading `loading` unloads, or None when one may not go yet
    (loaded less than `min_residency` ago, still waiting for its own room, pinned or
    kept warm): the load waits and plans again."""
    name = loading.runtime.name
    own = groups.unit(name)
    going = frozenset(m for r in groups.rivals(name) for m in groups.unit(r)) - own
    if not going:
        return Swap()
    leave: list[Pool] = []
    wait: list[Pool] = []
    for pool in pools:
        if pool.runtime.name not in going:
            continue
        if pool.stopping is not None:
            wait.append(pool)  # draining or unloading already: its stop is awaited
        elif pool.loaded:
            if pool.sticky or pool.loading is not None or now - pool.loaded_at < min_residency:
                return None
            leave.append(pool)
    return Swap(tuple(leave), tuple(wait))


def due(pools: Sequence[Pool], now: float, groups: Groups) -> list[Pool]:
    """Pure: the idle pools whose keep_alive ran out and may unload: a together group's
    only when every loaded member of it may (it unloads as one)."""
    expired = {
        id(p): p for p in pools if p.evictable and p.expires_at is not None and p.expires_at <= now
    }
    out = []
    for pool in expired.values():
        unit = groups.unit(pool.runtime.name)
        mates = [p for p in pools if p.loaded and p.runtime.name in unit]
        if all(id(p) in expired for p in mates):
            out.append(pool)
    return out
