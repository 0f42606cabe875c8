"""`blazar coreside` (issue 31): the pure answer (`scheduler.coreside`) with tables of
injected devices, and the command against a real serve and, with none running, from the
store (the footprints a first serve measured).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.serve.supervisor.scheduler import Groups, coreside
from blazar.serve.supervisor.scheduler.coreside import all_at_once, fit_set, load_now, pack
from blazar.serve.supervisor.scheduler.memory import GIB, Budget, Footprint, Memory
from blazar.serve.supervisor.scheduler.pools import Placement, Pool
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.gateway_harness import runtime
from tests.serving import Served


def ram(gib: float) -> tuple[Budget, ...]:
    return (Budget("cpu:0", "cpu", 0, 64 * GIB, int(gib * GIB)),)


def gpus(a: float, b: float) -> tuple[Budget, ...]:
    return (
        Budget("gpu:0", "gpu", 0, int(a * GIB), int(a * GIB)),
        Budget("gpu:1", "gpu", 1, int(b * GIB), int(b * GIB)),
    )


def sizes(**gib: float) -> dict[str, Footprint]:
    return {n: Footprint(int(g * GIB)) for n, g in gib.items()}


# -- the set answer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "footprints", "budgets", "placement", "over"),
    [
        # one big and several small on one device: all fit, or by how much they do not
        (["big", "s1", "s2"], sizes(big=8, s1=2, s2=2), ram(12), {"big", "s1", "s2"}, {}),
        (["big", "s1", "s2"], sizes(big=8, s1=2, s2=2), ram(10), None, {"cpu:0": 2 * GIB}),
        # two GPUs: best fit puts the small one where it leaves the least room
        (["a", "b"], sizes(a=6, b=3), gpus(8, 4), {"a": ("gpu:0",), "b": ("gpu:1",)}, {}),
        # larger than either GPU: split across both
        (["huge"], sizes(huge=10), gpus(8, 4), {"huge": ("gpu:0", "gpu:1")}, {}),
        # the second is split across what both have left
        (["a", "b"], sizes(a=6, b=5), gpus(8, 4), {"a": ("gpu:0",), "b": ("gpu:0", "gpu:1")}, {}),
        # b (largest first) takes gpu:0; what a lacks is counted where the most room is left
        (
            ["a", "b"],
            sizes(a=6, b=7),
            gpus(8, 4),
            {"a": ("gpu:1",), "b": ("gpu:0",)},
            {"gpu:1": 2 * GIB},
        ),
        ([], {}, ram(1), {}, {}),
    ],
)
def test_a_set_fits_or_says_by_how_much_per_device(
    names: list[str],
    footprints: dict[str, Footprint],
    budgets: tuple[Budget, ...],
    placement: Any,
    over: dict[str, int],
) -> None:
    fit = pack(names, footprints, budgets)
    assert dict(fit.over) == over and fit.fits == (not over)
    if isinstance(placement, set):
        assert set(fit.placement) == placement
    elif placement is not None:
        assert dict(fit.placement) == placement


def test_exclusive_groups_never_fit_together_and_together_groups_come_whole() -> None:
    groups = Groups(
        exclusive=(("swap", frozenset({"a", "b"})),),
        together=(("rag", frozenset({"chat", "emb"})),),
    )
    footprints = sizes(a=1, b=1, chat=2, emb=1)
    fit = fit_set(["a", "b"], footprints, ram(100), groups)
    assert not fit.fits and fit.conflicts == (
        "'a', 'b' are in exclusive group 'swap': one of them at a time",
    )
    fit = fit_set(["chat"], footprints, ram(2.5), groups)  # emb comes with it: 3 GiB
    assert fit.models == ("chat", "emb") and dict(fit.over) == {"cpu:0": GIB // 2}
    # all at once: of an exclusive group, only its largest counts
    footprints["b"] = Footprint(3 * GIB)
    assert all_at_once(["a", "b", "chat", "emb"], footprints, groups) == ["b", "chat", "emb"]


# -- what loading one now does ----------------------------------------------------------


def pool(name: str, gib: float, **state: Any) -> Pool:
    fields = {k: state.pop(k) for k in ("pin",) if k in state}
    each = Pool(runtime(name, **fields), [], loaded=True)
    each.placement = Placement((("cpu:0", int(gib * GIB)),))
    for key, value in state.items():
        setattr(each, key, value)
    return each


def test_load_now_says_what_goes_what_waits_and_what_never_fits() -> None:
    groups = Groups(exclusive=(("swap", frozenset({"new", "rival"})),))
    idle, pinned = pool("idle", 4), pool("pinned", 4, pin=True)
    rival = pool("rival", 1)
    footprints = {**sizes(idle=4, pinned=4, rival=1, new=4, huge=20)}
    memory = Memory(ram(10), footprints, now=1000.0, groups=groups)
    pools = [idle, pinned, rival]
    got = load_now(runtime("new"), pools, memory, None)
    assert (got.evicts, got.drains, got.devices, got.waits) == (
        ("idle",),
        ("rival",),
        ("cpu:0",),
        False,
    )
    idle.waiters = deque([object()])  # busy: not evictable now
    assert load_now(runtime("new"), pools, memory, None).waits
    got = load_now(runtime("huge"), pools, memory, None)
    assert got.refused is not None and "can never be loaded here" in got.refused
    assert load_now(runtime("idle"), pools, memory, None).loaded


def test_the_whole_answer_as_json() -> None:
    async def scenario() -> dict[str, Any]:
        groups = Groups(together=(("rag", frozenset({"chat", "emb"})),))
        loaded = pool("chat", 2)
        memory = Memory(ram(4), sizes(chat=2, emb=1, big=3), now=10.0, groups=groups)
        runtimes = [runtime("big"), runtime("chat"), runtime("emb")]
        return coreside(runtimes, [loaded], memory, ["big"]).to_json()

    answer = asyncio.run(scenario())
    assert answer["devices"] == [
        {"device": "cpu:0", "budget": 4 * GIB, "total": 64 * GIB, "used": 2 * GIB}
    ]
    rows = {m["model"]: m for m in answer["models"]}
    assert rows["chat"]["loaded"] and not rows["big"]["loaded"]
    assert rows["emb"]["groups"] == [{"name": "rag", "kind": "together"}]
    assert answer["groups"] == [{"name": "rag", "kind": "together", "models": ["chat", "emb"]}]
    assert answer["all"]["fits"] is False and answer["all"]["over"] == {"cpu:0": 2 * GIB}
    assert answer["set"]["fits"] is True
    (load,) = answer["loads"]
    assert load["model"] == "big" and load["evicts"] == ["chat"]  # the group goes whole


# -- the command ------------------------------------------------------------------------

NAMES = ("tiny", "other", "made")
GROUP = '[groups.swap]\nmodels = ["tiny", "other"]\nexclusive = true\n'


def answer(blazar: Blazar, *args: str) -> dict[str, Any]:
    return json.loads(blazar("coreside", "--json", *args).stdout)


def test_coreside_asks_the_serve_then_answers_from_measured_footprints(
    tmp_path: Path, blazar_home: Path, blazar: Blazar
) -> None:
    models = write_models(tmp_path / "models", *NAMES)
    blocks = "".join(model_block(n, models[n], ctx=512, slots=1) for n in NAMES)
    (tmp_path / "first").mkdir()
    serving = '[serving]\nmin_residency = "0s"\n\n'  # tiny may go at once
    manifest = write_manifest(tmp_path / "first", serving + ENGINE + blocks + GROUP)
    with Served(manifest, blazar_home) as served:
        first = answer(blazar)
        assert first["source"] == "serve"
        assert {m["footprint_source"] for m in first["models"]} == {"estimated"}
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        oai.completions.create(model="tiny", prompt="a", max_tokens=2)
        now = answer(blazar, "other")
        rows = {m["model"]: m for m in now["models"]}
        assert rows["tiny"]["loaded"] and rows["tiny"]["footprint_source"] == "measured"
        assert rows["tiny"]["groups"] == [{"name": "swap", "kind": "exclusive"}]
        (load,) = now["loads"]
        assert load["drains"] == ["tiny"] and not load["waits"]  # the exclusive group's
        text = blazar("coreside", "other", "tiny").stdout
        assert "measured" in text and "'other', 'tiny' are in exclusive group 'swap'" in text
        assert "loading 'other' now evicts tiny" in text
        refused = blazar("coreside", "nope", ok=False)
        assert refused.exit_code == 1 and "nope" in refused.output
    tiny = rows["tiny"]["footprint"]

    # no serve: the store's measured footprint, and a budget that holds one model only
    budget = tiny + rows["made"]["footprint"] // 2
    (tmp_path / "second").mkdir()
    second = write_manifest(
        tmp_path / "second", f"[serving]\nmemory_budget = {budget}\n\n" + ENGINE + blocks + GROUP
    )
    offline = answer(blazar, "--manifest", str(second), "tiny", "made")
    assert offline["source"] == "store"
    rows = {m["model"]: m for m in offline["models"]}
    assert rows["tiny"]["footprint_source"] == "measured" and rows["tiny"]["footprint"] == tiny
    assert not any(m["loaded"] for m in offline["models"])
    assert offline["set"]["fits"] is False
    assert offline["set"]["over"] == {"cpu:0": tiny + rows["made"]["footprint"] - budget}
    text = blazar("coreside", "--manifest", str(second), "tiny", "made").stdout
    assert "from the store (no serve runs)" in text and "over the budget on cpu:0" in text
