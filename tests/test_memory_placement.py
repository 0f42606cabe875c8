"""Memory-aware placement, the pure core (issue 31): budgets per device, footprints, the
placements a model may take, and the cheapest set of idle models evicted to make room.

Devices are injected (the tests have no GPU); the pools are stand-ins with no process.
What the scheduler does with real children is in test_memory_served.py.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.host.hardware import Device, resident_bytes
from blazar.models.gguf import inspect_gguf
from blazar.serve.supervisor.scheduler.memory import (
    GIB,
    Budget,
    Footprint,
    Memory,
    MemoryRoom,
    budget_bytes,
    budgets,
    candidates,
    cheapest,
    estimate_footprint,
    footprint_of,
    plan_memory,
    too_big,
    units,
    victim_cost,
)
from blazar.serve.supervisor.scheduler.pools import Placement, Pool
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from specs.serving import Serving
from tests.gateway_harness import runtime

MIB = 1024**2


def gpu(index: int, total_gib: float, free_gib: float | None = None) -> Device:
    total = int(total_gib * GIB)
    free = total if free_gib is None else int(free_gib * GIB)
    return Device("gpu", index, f"GPU {index}", total, free)


RAM = Device("cpu", 0, "system RAM", 32 * GIB, 20 * GIB)


# -- budgets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [
        (None, RAM, 20 * GIB - 2 * GIB),  # free less 10% of total, at most 2 GiB
        (None, gpu(0, 8, 6), 6 * GIB - int(0.8 * GIB)),  # 10% of 8 GiB is under 2 GiB
        (None, gpu(0, 8, 0.5), 0),  # never negative
        ("80%", RAM, int(32 * GIB * 0.8)),  # a share of the total, not of the free
        ("12.5%", gpu(0, 8), GIB),
        (12 * GIB, RAM, 12 * GIB),  # bytes as given
    ],
)
def test_budget_bytes(setting: int | str | None, device: Device, expected: int) -> None:
    assert budget_bytes(setting, device) == expected


def test_memory_budget_setting_parses_sizes_and_shares() -> None:
    assert Serving(memory_budget="12GiB").memory_budget == 12 * GIB
    assert Serving(memory_budget="80 %").memory_budget == "80%"
    assert Serving(memory_budget=1024).memory_budget == 1024
    assert Serving().memory_budget is None and Serving().min_residency == 5.0
    for bad in ("0%", "101%", "lots", "-5%", True):
        with pytest.raises(ValueError, match="memory_budget"):
            Serving(memory_budget=bad)


def test_budgets_name_each_device() -> None:
    got = budgets([gpu(0, 24), gpu(1, 8)], "50%")
    assert [(b.device, b.kind, b.index, b.bytes) for b in got] == [
        ("gpu:0", "gpu", 0, 12 * GIB),
        ("gpu:1", "gpu", 1, 4 * GIB),
    ]


# -- placement: filter ------------------------------------------------------------------


def two_gpus(a: int = 24, b: int = 8) -> tuple[Budget, ...]:
    return budgets([gpu(0, a), gpu(1, b)], "100%")


@pytest.mark.parametrize(
    ("need", "pinned", "expected"),
    [
        (4 * GIB, None, [(("gpu:0", 4 * GIB),), (("gpu:1", 4 * GIB),)]),  # either holds it
        (10 * GIB, None, [(("gpu:0", 10 * GIB),)]),  # only the big one
        (4 * GIB, (1,), [(("gpu:1", 4 * GIB),)]),  # pinned to the small one
        (10 * GIB, (1,), []),  # pinned where it cannot fit
        (28 * GIB, None, [(("gpu:0", 21 * GIB), ("gpu:1", 7 * GIB))]),  # split 3:1
        (40 * GIB, None, []),  # bigger than both together
    ],
)
def test_candidates(need: int, pinned: tuple[int, ...] | None, expected: list[Any]) -> None:
    assert [p.shares for p in candidates(need, two_gpus(), pinned)] == expected


def test_a_split_takes_every_byte_and_names_its_devices() -> None:
    (split,) = candidates(28 * GIB + 1, two_gpus(), None)
    assert sum(b for _, b in split.shares) == 28 * GIB + 1
    assert split.flags()[:3] == ("--device", "CUDA0,CUDA1", "--tensor-split")
    assert Placement((("gpu:1", 5),)).flags() == ("--device", "CUDA1")
    assert Placement((("cpu:0", 5),)).flags() == ()  # host RAM: nothing to say


@pytest.mark.parametrize(
    ("shares", "device_list", "flags"),
    [
        ((("cpu:0", 5),), False, ()),
        ((("gpu:1", 5),), True, ("--device", "CUDA1")),
        ((("gpu:1", 5),), False, ("--split-mode", "none", "--main-gpu", "1")),
        (
            (("gpu:2", 1), ("gpu:0", 3)),
            True,
            ("--device", "CUDA0,CUDA2", "--tensor-split", "3,1"),
        ),
        # the wheel's launcher has no device list: shares by device index, 0 for gpu:1
        (
            (("gpu:2", 1), ("gpu:0", 3)),
            False,
            ("--split-mode", "layer", "--tensor-split", "3,0,1"),
        ),
    ],
)
def test_placement_flags_for_llama_server_and_the_wheel(
    shares: tuple[tuple[str, int], ...], device_list: bool, flags: tuple[str, ...]
) -> None:
    assert Placement(shares).flags(device_list=device_list) == flags


def test_too_big_names_footprint_budget_and_what_to_change() -> None:
    ram = budgets([RAM], 4 * GIB)
    assert too_big("small", Footprint(GIB), ram, None) is None
    why = too_big("huge", Footprint(6 * GIB, measured=True), ram, None)
    assert why is not None
    for part in ("'huge' needs 6.0 GiB (measured)", "cpu:0 4.0 GiB", "serving.memory_budget"):
        assert part in why
    for way in ("smaller quantization", "ctx", "cache_type", "blazar fit huge"):
        assert way in why
    assert too_big("split", Footprint(28 * GIB), two_gpus(), None) is None  # split fits


# -- room: score and choose -------------------------------------------------------------


def placed(
    name: str, size_gib: float, used: float = 0.0, device: str = "cpu:0", **state: Any
) -> Pool:
    fields = {k: state.pop(k) for k in ("pin", "replicas") if k in state}
    each = Pool(runtime(name, **fields), [], loaded=state.pop("loaded", True), last_used=used)
    each.placement = Placement(((device, int(size_gib * GIB)),))
    for key, value in state.items():
        setattr(each, key, value)
    return each


def memory(pools: list[Pool], budget_gib: float, *, new: float, **extra: Any) -> Memory:
    sizes = {p.runtime.name: Footprint(p.placement.on("cpu:0")) for p in pools if p.placement}
    sizes["new"] = Footprint(int(new * GIB))
    ram = (Budget("cpu:0", "cpu", 0, 64 * GIB, int(budget_gib * GIB)),)
    return Memory(ram, sizes, **{"now": 1000.0, **extra})


def evicted(room: MemoryRoom | None) -> list[str] | None:
    return None if room is None else sorted(p.runtime.name for p in room.evict)


def test_one_big_or_several_small_the_cheaper_goes() -> None:
    new = Pool(runtime("new"), [])
    big = placed("big", 8, used=0)  # used long ago
    smalls = [placed(f"s{i}", 2.5, used=990) for i in range(3)]  # used 10 s ago
    pools = [big, *smalls]
    # 16 GiB, 15.5 used: a 4 GiB model needs 3.5 more. The big one costs ~8 GiB; two
    # small ones cost 2 x 2.5 x ~1.86: the big one goes, though fewer bytes would do.
    assert evicted(plan_memory(pools, new, None, memory(pools, 16, new=4))) == ["big"]
    # used just now, the big one costs 16 (x2): two recent small ones cost less
    big.last_used = 1000.0
    assert evicted(plan_memory(pools, new, None, memory(pools, 16, new=4))) == ["s0", "s1"]
    # room enough: nothing goes; the count cap alone can still ask for one
    assert evicted(plan_memory(pools, new, None, memory(pools, 64, new=4))) == []
    assert evicted(plan_memory(pools, new, 4, memory(pools, 64, new=4))) == ["s0"]


def test_pins_replicas_busy_draining_and_just_loaded_models_never_go() -> None:
    async def scenario() -> None:
        never = asyncio.get_running_loop().create_future()
        new = Pool(runtime("new"), [])
        keep = [
            placed("pinned", 4, pin=True),
            placed("replica", 4, replicas=1),
            placed("busy", 4, waiters=deque([object()])),
            placed("draining", 4, stopping=never),
            placed("loading", 4, loading=never),
            placed("fresh", 4, loaded_at=999.0),  # loaded a second ago, min_residency 5 s
        ]
        idle = placed("idle", 4)
        pools = [*keep, idle]
        plan = memory(pools, 28, new=4, min_residency=5.0)
        assert evicted(plan_memory(pools, new, None, plan)) == ["idle"]
        plan = memory(pools, 28, new=8, min_residency=5.0)
        assert plan_memory(pools, new, None, plan) is None  # only one idle model to give
        later = memory(pools, 28, new=8, min_residency=5.0, now=1010.0)
        assert evicted(plan_memory(pools, new, None, later)) == ["fresh", "idle"]

    asyncio.run(scenario())


def test_a_model_being_stopped_is_claimed_before_anything_is_evicted() -> None:
    async def scenario() -> None:
        stopping = asyncio.get_running_loop().create_future()
        new = Pool(runtime("new"), [])
        going = placed("going", 4, loaded=False, stopping=stopping)
        idle = placed("idle", 4, used=0)
        room = plan_memory([going, idle], new, None, memory([going, idle], 10, new=4))
        assert room is not None and room.claim == (going,) and room.evict == ()
        going.claimed = True  # another load took its room: it no longer counts
        room = plan_memory([going, idle], new, None, memory([going, idle], 10, new=4))
        assert room is not None and room.claim == () and room.evict == ()

    asyncio.run(scenario())


def test_the_model_loaded_and_its_elder_are_the_same_model() -> None:
    new = Pool(runtime("new"), [])
    elder = placed("new", 4)
    room = plan_memory([elder], new, 1, memory([elder], 6, new=4))
    assert room is not None and room.evict == ()


def test_placement_picks_the_device_whose_room_costs_least() -> None:
    new = Pool(runtime("new"), [])
    on0 = placed("on0", 10, device="gpu:0")
    on1 = placed("on1", 6, device="gpu:1", used=0)
    sizes = {"on0": Footprint(10 * GIB), "on1": Footprint(6 * GIB), "new": Footprint(4 * GIB)}
    plan = Memory(two_gpus(), sizes, now=1000.0)
    room = plan_memory([on0, on1], new, None, plan)
    assert room is not None and room.evict == () and room.placement.devices == ("gpu:0",)
    # pinned to gpu:1 (8 GiB, 6 used): on1 must go
    pinned = Memory(two_gpus(), sizes, now=1000.0, pinned={"new": (1,)})
    room = plan_memory([on0, on1], new, None, pinned)
    assert room is not None and evicted(room) == ["on1"] and room.placement.devices == ("gpu:1",)
    # larger than either GPU: split, evicting from both
    sizes["new"] = Footprint(28 * GIB)
    room = plan_memory([on0, on1], new, None, Memory(two_gpus(), sizes, now=1000.0))
    assert room is not None and room.placement.devices == ("gpu:0", "gpu:1")
    assert evicted(room) == ["on0", "on1"]


# -- the choice, over hostile inputs ----------------------------------------------------

unit_sizes = st.lists(
    st.tuples(st.integers(0, 8 * GIB), st.floats(0, 2000), st.booleans()), max_size=6
)


@settings(max_examples=150, deadline=None)
@given(sizes=unit_sizes, budget=st.integers(0, 40 * GIB), need=st.integers(0, 12 * GIB))
def test_the_choice_frees_enough_at_the_least_cost(
    sizes: list[tuple[int, float, bool]], budget: int, need: int
) -> None:
    new = Pool(runtime("new"), [])
    pools = []
    for i, (size, used, pin) in enumerate(sizes):
        each = Pool(runtime(f"m{i}", pin=pin), [], loaded=True, last_used=used)
        each.placement = Placement((("cpu:0", size),))
        pools.append(each)
    footprints = {p.runtime.name: Footprint(p.placement.on("cpu:0")) for p in pools}  # type: ignore[union-attr]
    plan = Memory(
        (Budget("cpu:0", "cpu", 0, budget, budget),),
        {**footprints, "new": Footprint(need)},
        now=2000.0,
    )
    room = plan_memory(pools, new, None, plan)
    used = sum(s for s, _, _ in sizes)
    if need > budget:
        assert room is None  # never fits: too_big says so before any spawn
        return
    options = units(pools, "new", plan)
    feasible = [
        chosen
        for k in range(len(options) + 1)
        for chosen in itertools.combinations(options, k)
        if budget - used + sum(u.freed[0][1] if u.freed else 0 for u in chosen) >= need
    ]
    if not feasible:
        assert room is None
        return
    assert room is not None
    assert not any(p.runtime.pin for p in room.evict)
    freed = sum(p.placement.on("cpu:0") for p in room.evict)  # type: ignore[union-attr]
    assert budget - used + freed >= need
    best = min(sum(u.cost for u in c) for c in feasible)
    assert sum(
        victim_cost(p.placement.on("cpu:0"), 2000.0 - p.last_used) for p in room.evict
    ) == pytest.approx(best)  # type: ignore[union-attr]


def test_cheapest_beyond_the_exact_search_is_greedy_and_still_enough() -> None:
    pools = [placed(f"m{i}", 1 + i % 3, used=float(i)) for i in range(20)]
    plan = memory(pools, 40, new=6)
    options = units(pools, "new", plan)
    chosen = cheapest(options, {"cpu:0": 5 * GIB}, 0)
    assert chosen is not None and sum(u.freed[0][1] for u in chosen) >= 5 * GIB
    assert cheapest(options, {"cpu:0": 100 * GIB}, 0) is None
    assert cheapest(options, {"cpu:0": 0}, 0) == ()


# -- footprints -------------------------------------------------------------------------


def test_the_estimate_is_fits_as_serve_starts_the_model(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf")
    facts = inspect_gguf(path).to_dict()
    size = path.stat().st_size
    one = runtime("tiny", path=str(path), facts=facts, ctx=512, slots=1)
    base = estimate_footprint(one, weights=size, on_gpu=False)
    assert not base.measured and base.bytes > size
    # KV grows with ctx x slots; a draft's and a projector's weights add; replicas multiply
    four = runtime("tiny", path=str(path), facts=facts, ctx=512, slots=4)
    assert estimate_footprint(four, weights=size, on_gpu=False).bytes > base.bytes
    extra = estimate_footprint(one, weights=size, projector=MIB, draft=2 * MIB, on_gpu=False)
    assert extra.bytes == base.bytes + 3 * MIB
    two = runtime("tiny", path=str(path), facts=facts, ctx=512, slots=1, replicas=2)
    assert estimate_footprint(two, weights=size, on_gpu=False).bytes == 2 * base.bytes
    # the measure replaces it, per instance
    assert footprint_of(two, base, None) == base
    assert footprint_of(two, base, 10 * MIB) == Footprint(20 * MIB, measured=True)
    # a speech model (whisper, piper) has no context: its file's size, and serve starts
    # (fit refuses ctx 0: serve exited at start with a speech model declared)
    speech = runtime("voice", path=str(path), facts={}, ctx=0, slots=1)
    assert estimate_footprint(speech, weights=size, on_gpu=False) == Footprint(size)


def test_a_childs_resident_memory_is_measured_from_proc() -> None:
    code = (
        "import sys; b = bytearray(64 * 1024 * 1024); "
        "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert resident_bytes(child.pid) >= 64 * MIB
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
    assert resident_bytes(child.pid) == 0  # gone: nothing to tell


def test_measured_footprints_are_kept_in_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        assert store.footprints() == {}
        store.put_footprint("tiny", "abc", "cpu", 5 * MIB)
        store.put_footprint("tiny", "abc", "cpu", 6 * MIB)  # the latest measure wins
        store.put_footprint("tiny", "def", "gpu", 7 * MIB)
    with Store(tmp_path / "blazar.db") as store:
        assert store.footprints() == {
            ("tiny", "abc", "cpu"): 6 * MIB,
            ("tiny", "def", "gpu"): 7 * MIB,
        }


def test_the_manifests_devices_place_the_model_and_reach_its_child() -> None:
    """Injected GPUs (the tests have none): `models.NAME.devices` pins the model to gpu:1;
    its child's command line ends with the placement's flags, once, load after load; the
    wheel's launcher gets its own spelling (no --device list in xllamacpp)."""
    import asyncio
    from pathlib import Path

    from blazar.serve.supervisor.scheduler import Declared, Scheduler
    from tests.gateway_harness import StandIn, runtime

    async def scenario() -> None:
        runtimes = {
            "m": runtime("m"),
            "w": runtime("w", command=("/venv/bin/python", "/engines/launcher.py")),
        }
        s = Scheduler(
            runtimes,
            max_loaded=3,
            max_queue=4,
            queue_timeout=1.0,
            log_dir=Path("/tmp"),
            make_instance=StandIn,
            devices=[
                Device("gpu", 0, "A", 24 * GIB, 24 * GIB),
                Device("gpu", 1, "B", 8 * GIB, 8 * GIB),
            ],
        )
        s.declared = Declared(devices={"m": (1,), "w": (1,)})
        for _ in range(2):  # a second load does not add the flags again
            for name in ("m", "w"):
                s.release(await s.acquire(s.resolve(name)))
                assert await s.stop_model(name)
        for name in ("m", "w"):
            s.release(await s.acquire(s.resolve(name)))
        m, w = s.pools["m"], s.pools["w"]
        assert m.placement is not None and m.placement.devices == ("gpu:1",)
        assert m.members[0].instance.spec.args[-2:] == ("--device", "CUDA1")
        assert m.members[0].instance.spec.args.count("--device") == 1
        assert w.members[0].instance.spec.args[-4:] == ("--split-mode", "none", "--main-gpu", "1")
        await s.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("shares", "size", "expected"),
    [
        ((("cpu:0", 100),), 150, (("cpu:0", 150),)),  # measured above the estimate
        ((("gpu:0", 300), ("gpu:1", 100)), 200, (("gpu:0", 150), ("gpu:1", 50))),
        ((("gpu:0", 1), ("gpu:1", 2)), 10, (("gpu:0", 3), ("gpu:1", 7))),  # every byte placed
        ((("cpu:0", 0),), 50, (("cpu:0", 0),)),  # nothing to scale
    ],
)
def test_a_placement_scaled_to_the_measured_footprint(
    shares: tuple[tuple[str, int], ...], size: int, expected: tuple[tuple[str, int], ...]
) -> None:
    assert Placement(shares).scaled(size).shares == expected
