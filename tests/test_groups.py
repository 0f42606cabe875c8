"""Co-residency (issue 31): `[groups.NAME]` as the manifest declares and validates it, and
the scheduler's pure decisions over it (`scheduler.groups`, `memory.units`): which
rivals a load of an exclusive group drains, when it must wait, a together group
evicted and expired as one, never evicted to load one of its own.

The pools are stand-ins with no process; what the daemon does with real children is
in test_groups_served.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.serve.supervisor.scheduler import plan_room
from blazar.serve.supervisor.scheduler.groups import Groups, due, plan_swap
from blazar.serve.supervisor.scheduler.memory import (
    GIB,
    Budget,
    Footprint,
    Memory,
    plan_memory,
    units,
)
from blazar.serve.supervisor.scheduler.pools import Placement, Pool
from specs.loader import ManifestError, load_manifest_text
from tests.gateway_harness import runtime

# 12 lines: a group declared after them starts at line 13
MODELS = (
    "".join(f'[models.{n}]\nsource = "file:///m/{n}.gguf"\n' for n in ("a", "b", "c", "d"))
    + '[models.e]\nsource = "file:///m/e.gguf"\npin = true\naliases = ["eve"]\n'
)


def load(text: str) -> Any:
    return load_manifest_text(MODELS + text, "blazar.toml")


# -- the manifest -----------------------------------------------------------------------


def test_groups_load_with_their_members_resolved() -> None:
    manifest = load(
        '[groups.swap]\nmodels = ["a", "b"]\nexclusive = true\n'
        '[groups.rag]\nmodels = ["c", "d", "eve"]\ntogether = true\n'
    )
    assert manifest.group_members("rag") == ["c", "d", "e"]  # an alias names its model
    assert manifest.groups_of("a") == ["swap"] and manifest.groups_of("e") == ["rag"]
    groups = Groups.of(manifest)
    assert groups.rivals("a") == {"b"} and groups.rivals("c") == frozenset()
    assert groups.companions("d") == {"c", "e"} and groups.unit("a") == {"a"}


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ('[groups.g]\nmodels = ["a", "zz"]\nexclusive = true\n', 14, "names model 'zz', which"),
        ('[groups.g]\nmodels = ["a"]\n', 13, "needs exclusive = true"),
        (
            '[groups.g]\nmodels = ["a"]\nexclusive = true\ntogether = true\n',
            16,
            "either exclusive",
        ),
        ("[groups.g]\nmodels = []\ntogether = true\n", 14, "at least 1"),
        ('[groups.g]\nmodels = ["a", "a"]\ntogether = true\n', 14, "names model 'a' twice"),
        (
            '[groups.g]\nmodels = ["a"]\nexclusive = true\n'
            '[groups.h]\nmodels = ["b", "a"]\nexclusive = true\n',
            17,
            "model 'a' is in exclusive groups 'g' and 'h'",
        ),
        ('[groups.g]\nmodels = ["a", "e"]\nexclusive = true\n', 14, "'e' is pinned"),
        ('[groups.G]\nmodels = ["a"]\ntogether = true\n', 13, "invalid group name"),
    ],
)
def test_a_bad_group_is_a_problem_at_its_line(text: str, line: int, expected: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load(text)
    problems = [p for p in caught.value.problems if expected in str(p)]
    assert problems, str(caught.value)
    assert problems[0].file == "blazar.toml" and problems[0].line == line, str(problems[0])


def test_a_model_may_be_in_an_exclusive_and_a_together_group() -> None:
    manifest = load(
        '[groups.swap]\nmodels = ["a", "b"]\nexclusive = true\n'
        '[groups.pair]\nmodels = ["a", "c"]\ntogether = true\n'
        '[groups.more]\nmodels = ["c", "d"]\ntogether = true\n'
    )
    groups = Groups.of(manifest)
    assert groups.unit("a") == {"a", "c", "d"}  # together groups chain
    assert groups.of_model("a") == [("swap", "exclusive"), ("pair", "together")]


# -- exclusive: what a load drains ------------------------------------------------------

SWAP = Groups(exclusive=(("swap", frozenset({"a", "b", "c"})),))


def pool(name: str, *, loaded: bool = True, loaded_at: float = 0.0, **state: Any) -> Pool:
    fields = {k: state.pop(k) for k in ("pin", "replicas") if k in state}
    each = Pool(runtime(name, **fields), [], loaded=loaded, loaded_at=loaded_at)
    for key, value in state.items():
        setattr(each, key, value)
    return each


def names(pools: tuple[Pool, ...]) -> list[str]:
    return sorted(p.runtime.name for p in pools)


def test_loading_one_of_an_exclusive_group_drains_the_others_loaded() -> None:
    async def scenario() -> None:
        stopping = asyncio.get_running_loop().create_future()
        a = pool("a", loaded=False)
        b = pool("b")
        busy = pool("c", waiters=deque([object()]))  # busy: drained, its requests finish
        other = pool("d")  # in no group: stays
        swap = plan_swap([a, b, busy, other], a, SWAP, now=100.0, min_residency=5.0)
        assert swap is not None and names(swap.leave) == ["b", "c"] and swap.wait == ()
        assert swap.names == {"b", "c"}
        # one already being stopped is waited for, not drained again
        b.stopping = stopping
        swap = plan_swap([a, b, busy], a, SWAP, now=100.0, min_residency=5.0)
        assert swap is not None and names(swap.leave) == ["c"] and names(swap.wait) == ["b"]
        b.claimed = True  # another load took its room: not this one's
        assert swap.names == {"c"}

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("rival", "why"),
    [
        ({"loaded_at": 98.0}, "loaded 2 s ago, min_residency 5 s"),
        ({"pin": True}, "pinned (the manifest refuses it; never drained anyway)"),
        ({"replicas": 1}, "kept warm"),
    ],
)
def test_a_rival_that_may_not_go_yet_makes_the_load_wait(rival: dict[str, Any], why: str) -> None:
    a = pool("a", loaded=False)
    b = pool("b", **rival)
    assert plan_swap([a, b], a, SWAP, now=100.0, min_residency=5.0) is None, why


def test_a_rival_waiting_for_its_own_room_is_not_drained() -> None:
    async def scenario() -> None:
        a = pool("a", loaded=False)
        b = pool("b", loading=asyncio.get_running_loop().create_future())
        assert plan_swap([a, b], a, SWAP, now=100.0, min_residency=0.0) is None

    asyncio.run(scenario())


def test_no_group_no_swap_and_a_rivals_together_companions_leave_with_it() -> None:
    a = pool("a", loaded=False)
    assert plan_swap([a, pool("d")], a, Groups(), 100.0, 0.0) == plan_swap([], a, SWAP, 0, 0)
    groups = Groups(
        exclusive=(("swap", frozenset({"a", "b"})),),
        together=(("rag", frozenset({"b", "emb"})),),
    )
    swap = plan_swap([a, pool("b"), pool("emb")], a, groups, 100.0, 0.0)
    assert swap is not None and names(swap.leave) == ["b", "emb"]


def test_the_room_a_load_takes_counts_the_rivals_it_drains_as_free() -> None:
    a = pool("a", loaded=False)
    b = pool("b")
    b.placement = Placement((("cpu:0", 6 * GIB),))
    busy = pool("c", waiters=deque([object()]))
    busy.placement = Placement((("cpu:0", 3 * GIB),))
    ram = (Budget("cpu:0", "cpu", 0, 16 * GIB, 10 * GIB),)
    sizes = {"a": Footprint(8 * GIB), "b": Footprint(6 * GIB), "c": Footprint(3 * GIB)}
    memory = Memory(ram, sizes, now=100.0, groups=SWAP)
    # 9 of 10 GiB used: evicting b gives 7, not 8, and c is busy
    assert plan_memory([a, b, busy], a, None, memory) is None
    room = plan_memory([a, b, busy], a, None, memory, leaving={"b", "c"})
    assert room is not None and room.evict == ()  # b and c drain: their room is a's
    # counted too: two loaded, max 2, both leaving
    assert plan_room([a, b, busy], a, 2, leaving={"b", "c"}) is not None
    assert plan_room([a, b, busy], a, 2) is not None and plan_room([a, busy], a, 1) is None


# -- together: one unit -----------------------------------------------------------------

RAG = Groups(together=(("rag", frozenset({"chat", "emb", "rerank"})),))


def placed(name: str, gib: float, used: float = 0.0, **state: Any) -> Pool:
    each = pool(name, last_used=used, **state)
    each.placement = Placement((("cpu:0", int(gib * GIB)),))
    return each


def rag_memory(pools: list[Pool], budget: float, new: float, **extra: Any) -> Memory:
    sizes = {p.runtime.name: Footprint(p.placement.on("cpu:0")) for p in pools if p.placement}
    sizes["new"] = Footprint(int(new * GIB))
    ram = (Budget("cpu:0", "cpu", 0, 64 * GIB, int(budget * GIB)),)
    return Memory(ram, sizes, now=1000.0, groups=RAG, **extra)


def test_a_together_group_is_evicted_as_one_unit() -> None:
    rag = [placed("chat", 4, used=990), placed("emb", 1, used=0), placed("rerank", 1, used=0)]
    lone = placed("lone", 3, used=999)
    pools = [*rag, lone]
    new = Pool(runtime("new"), [])
    # 10 GiB, 9 used, 2 needed: 'emb' alone (1 GiB, long idle) would not do, and the
    # group goes whole or not at all: 6 GiB for 'lone''s 3, lone is cheaper
    room = plan_memory(pools, new, None, rag_memory(pools, 10, 2))
    assert room is not None and names(room.evict) == ["lone"]
    options = units(pools, "new", rag_memory(pools, 10, 2))
    assert sorted(len(u.pools) for u in options) == [1, 3]
    rag_unit = next(u for u in options if len(u.pools) == 3)
    assert rag_unit.freed == (("cpu:0", 6 * GIB),)
    # one of them busy: the group holds
    rag[2].waiters = deque([object()])
    room = plan_memory(pools, new, None, rag_memory(pools, 10, 5))
    assert room is None


def test_a_together_group_is_never_evicted_to_load_one_of_its_own() -> None:
    chat, emb = placed("chat", 4), placed("emb", 4)
    rerank = Pool(runtime("rerank"), [])
    memory = rag_memory([chat, emb], 9, 0)
    sizes = {**memory.footprints, "rerank": Footprint(2 * GIB)}
    memory = Memory(memory.budgets, sizes, now=1000.0, groups=RAG)
    assert units([chat, emb], "rerank", memory) == []
    assert plan_memory([chat, emb], rerank, None, memory) is None


def test_a_together_group_expires_when_all_its_loaded_members_may() -> None:
    chat = pool("chat", expires_at=50.0)
    emb = pool("emb", expires_at=150.0)  # used later: keeps the group
    lone = pool("lone", expires_at=50.0)
    assert names(tuple(due([chat, emb, lone], 100.0, RAG))) == ["lone"]
    assert names(tuple(due([chat, emb, lone], 200.0, RAG))) == ["chat", "emb", "lone"]
    emb.loaded = False  # not loaded: does not hold the others
    assert names(tuple(due([chat, emb, lone], 100.0, RAG))) == ["chat", "lone"]
    pinned = pool("rerank", pin=True)  # a pin holds its group
    assert names(tuple(due([chat, pinned], 100.0, RAG))) == []


# -- over hostile groups ----------------------------------------------------------------

member_names = st.sampled_from(["a", "b", "c", "d", "e", "f"])
group_sets = st.lists(st.frozensets(member_names, min_size=1, max_size=4), max_size=4)


@settings(max_examples=100, deadline=None)
@given(exclusive=group_sets, together=group_sets, name=member_names)
def test_units_and_rivals_are_consistent_whatever_the_groups(
    exclusive: list[frozenset[str]], together: list[frozenset[str]], name: str
) -> None:
    groups = Groups(
        tuple((f"x{i}", g) for i, g in enumerate(exclusive)),
        tuple((f"t{i}", g) for i, g in enumerate(together)),
    )
    unit = groups.unit(name)
    assert name in unit and name not in groups.companions(name)
    for other in unit:  # a unit is the same seen from any of its models
        assert groups.unit(other) == unit
    for members in (g for g in together if g & unit):
        assert members <= unit
    assert name not in groups.rivals(name)
    assert groups.rivals(name) == {m for g in exclusive if name in g for m in g} - {name}
