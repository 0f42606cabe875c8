"""Memory-aware scheduling where users look (issue 31): ollama's `/api/ps` sizes, the
evictions counted by reason on `/metrics`, and `blazar doctor` naming a model that can
never fit. Real serves and tiny models; the judgments are also table-tested here.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.doctor.serving import fit_findings
from blazar.serve.routes.ollama_admin import memory_sizes
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served
from tests.waiting import wait_until

NAMES = ("tiny", "other", "made", "plain")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"footprint": 900, "size": 300, "devices": ["cpu:0"]}, (900, 0)),  # host RAM
        ({"footprint": 900, "size": 300, "devices": ["gpu:0"]}, (900, 900)),
        ({"footprint": 900, "size": 300, "devices": ["gpu:0", "gpu:1"]}, (900, 900)),  # split
        ({"footprint": 0, "size": 300, "devices": []}, (300, 0)),  # no footprint: the file's
        ({"size": None}, (None, 0)),
    ],
)
def test_ps_sizes_as_ollama_reports_them(row: dict[str, object], expected: object) -> None:
    assert memory_sizes(row) == expected


def test_doctor_judges_from_coreside() -> None:
    assert fit_findings(None) == [] and fit_findings({"devices": [], "models": []}) == []
    answer = {
        "devices": [{"device": "cpu:0", "budget": 2 * 1024**3}],
        "models": [
            {"model": "ok", "footprint": 1024**3, "footprint_source": "measured"},
            {
                "model": "huge",
                "footprint": 3 * 1024**3,
                "footprint_source": "estimated",
                "never_fits": True,
            },
        ],
    }
    (finding,) = fit_findings(answer)
    assert finding.severity == "error" and finding.group == "MODELS"
    assert "'huge' needs 3.00 GiB (estimated)" in finding.what
    assert "cpu:0 2.00 GiB" in finding.what
    assert finding.fix is not None and "blazar fit huge" in finding.fix


def evictions(served: Served) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"{served.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(r'blazar_evictions_total\{model="([^"]+)",reason="([^"]+)"\} (\S+)', text)
    return {(m, r): float(n) for m, r, n in found}


def test_ps_sizes_and_evictions_by_reason_on_a_real_serve(
    tmp_path: Path, blazar_home: Path
) -> None:
    models = write_models(tmp_path / "models", *NAMES)
    text = (
        '[serving]\nmax_loaded_models = 2\nmin_residency = "0s"\n\n'
        + ENGINE
        + "".join(model_block(n, models[n], ctx=512, slots=1) for n in NAMES)
        + '[groups.swap]\nmodels = ["tiny", "other"]\nexclusive = true\n'
    )
    with Served(write_manifest(tmp_path, text), blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        for name in ("tiny", "other", "made", "plain"):
            oai.completions.create(model=name, prompt="a", max_tokens=2)
        # other drained tiny (its group); plain took the place of other or made (the count
        # of 2): which one is the cheaper to reload, by their measured bytes and recency,
        # which a loaded machine can tip either way
        wait_until(lambda: len(served.ps()) == 2, "two loaded")
        found = evictions(served)
        (gone,) = [m for (m, reason) in found if reason == "count"]
        assert gone in ("other", "made")
        assert found == {("tiny", "group"): 1.0, (gone, "count"): 1.0}
        rows = {r["model"]: r for r in served.ps()}
        kept = ({"other", "made"} - {gone}).pop()
        assert sorted(rows) == sorted([kept, "plain"])
        listed = {m["model"]: m for m in served.get("/api/ps")["models"]}
        shown = listed[f"{kept}:latest"]
        assert shown["size"] == rows[kept]["footprint"] > models[kept].stat().st_size
        assert shown["size_vram"] == 0  # this host's models live in RAM
        with urllib.request.urlopen(f"{served.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        used = float(re.findall(r'blazar_memory_used_bytes\{device="cpu:0"\} (\S+)', text)[0])
        assert used == sum(r["footprint"] for r in rows.values())  # bytes used per device
        assert re.search(r'blazar_memory_budget_bytes\{device="cpu:0"\} \S+', text)


def test_doctor_names_a_model_that_can_never_fit(tmp_path: Path, blazar: Blazar) -> None:
    models = write_models(tmp_path / "models", "tiny")
    manifest = write_manifest(
        tmp_path,
        "[serving]\nmemory_budget = 4096\n\n" + ENGINE + model_block("tiny", models["tiny"]),
    )
    blazar("apply", str(manifest))
    result = blazar("doctor", "--json", str(manifest), ok=False)
    findings = [json.loads(line) for line in result.stdout.splitlines()]
    (found,) = [f for f in findings if "can never be loaded here" in f["what"]]
    assert found["severity"] == "error" and "'tiny' needs" in found["what"]
    assert "the memory budget is cpu:0 4096 bytes" in found["what"]
    assert "serving.memory_budget" in found["fix"] and result.exit_code == 1


def test_why_names_the_wait_for_room_and_hints_warm_peg_after_a_cold_load() -> None:
    from blazar.observe import trail

    record = {
        "id": "t1",
        "time": 1_796_000_000.0,
        "protocol": "openai",
        "route": "/v1/completions",
        "requested": "big",
        "model": "big",
        "instance": "big/0",
        "engine": "b1-cpu",
        "decision": "spawned",
        "evicted": ["small", "other"],
        "waited_for_room": {"seconds": 2.5, "evicted": ["small", "other"]},
        "queue_ms": 0.0,
        "load_ms": 3200.0,
        "status": 200,
        "duration_ms": 3500.0,
    }
    text = "\n".join(trail.render(record))
    assert "waited_for_room 2.50 s" in text and "then evicted small, other" in text
    assert "! cold load: 3.20 s to start 'big'" in text
    assert "models.big.warm_peg = true" in text  # the guide's hint names the real field
    quick = "\n".join(trail.render({**record, "load_ms": 80.0, "waited_for_room": None}))
    assert "warm_peg" not in quick and "waited_for_room" not in quick
    assert "evicted small, other to make room" in quick


def test_the_models_pages_memory_bars_read_budget_models_and_pegs(tmp_path: Path) -> None:
    """The JSON the dashboard's memory bar reads (the "models" event's `memory`): a bar per
    device with its budget, each loaded model's bytes there, and on host RAM the warm
    pegs; an inference key sees the others' bytes as "other models"."""
    import asyncio

    from blazar.host.hardware import Device
    from blazar.serve.state.dashboard import memory_for_grant, memory_view
    from blazar.serve.supervisor.scheduler import Declared, Scheduler
    from tests.gateway_harness import StandIn, runtime

    weights = tmp_path / "peg.gguf"
    weights.write_bytes(b"\0" * 65536)

    async def scenario() -> list[dict[str, Any]]:
        s = Scheduler(
            {"a": runtime("a"), "b": runtime("b", path=str(weights))},
            max_loaded=3,
            max_queue=4,
            queue_timeout=1.0,
            log_dir=tmp_path,
            make_instance=StandIn,
            devices=[Device("cpu", 0, "RAM", 8 * 1024**3, 8 * 1024**3)],
            memory_budget=4 * 1024**3,
        )
        s.declared = Declared(pegs=frozenset({"b"}), peg_budget=1024**2)
        for name in ("a", "b"):
            s.release(await s.acquire(s.resolve(name)))
        await s.stop_model("b")  # pegged when it unloads (in a thread)
        for _ in range(500):  # held in a thread: real time, not loop turns
            if s.pegs.sizes():
                break
            await asyncio.sleep(0.01)
        bars = memory_view(s)
        s.declared = Declared()  # 'b' no longer warm_peg (or undeclared): released
        assert s.pegs.sizes() == {}
        await s.close()
        return bars

    (bar,) = asyncio.run(scenario())
    assert bar["device"] == "cpu:0" and bar["budget"] == 4 * 1024**3
    assert [m["name"] for m in bar["models"]] == ["a"] and bar["models"][0]["bytes"] > 0
    assert bar["pegged"] == [{"name": "b", "bytes": 65536}] and bar["peg_budget"] == 1024**2
    (seen,) = memory_for_grant([bar], False, {"b"})
    assert seen["models"] == [{"name": "other models", "bytes": bar["models"][0]["bytes"]}]
    assert seen["pegged"] == bar["pegged"]
