"""Engine lanes end to end: real xllamacpp wheels side by side, the gate, use, rollback, rm."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from blazar.engines.ledger import EngineStore
from blazar.engines.process import EngineServer
from blazar.engines.wheel import tag_for_version
from blazar.errors import InvalidInput
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.tiny import is_tiny_text
from tests.conftest import Blazar
from tests.feeds import ReleaseFeed, launcher_script, server_archive
from tests.fixtures import ENGINE_VERSION, OLD_ENGINE_VERSION

OLD, NEW = OLD_ENGINE_VERSION, ENGINE_VERSION
OLD_TAG, NEW_TAG = "b11063-cpu", "b11549-cpu"


def engine_list(blazar: Blazar) -> dict[str, dict]:  # type: ignore[type-arg]
    rows = [json.loads(line) for line in blazar("engine", "list", "--json").output.splitlines()]
    return {row["tag"]: row for row in rows}


def complete(url: str, prompt: str = "the quick brown") -> str:
    body = json.dumps({"prompt": prompt, "max_tokens": 12, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.load(resp)["choices"][0]["text"])


@pytest.mark.parametrize(
    ("version", "tag"),
    [
        ("2026.10.11549", "b11549-cpu"),
        ("2026.9.11063", "b11063-cpu"),
        ("2026.4.8672.1", "b8672-cpu-post1"),
    ],
)
def test_wheel_tags_name_the_llama_cpp_build(version: str, tag: str) -> None:
    assert tag_for_version(version) == tag


@pytest.mark.parametrize("version", ["0.2.14", "latest", "2026.10"])
def test_versions_without_a_build_number_are_refused(version: str) -> None:
    with pytest.raises(InvalidInput, match=r"does not name a llama\.cpp build"):
        tag_for_version(version)


def test_two_wheels_side_by_side_update_use_rollback_rm(
    blazar: Blazar, paths: Paths, tiny_model: Path, tmp_path: Path
) -> None:
    # First install: nothing to compare against, so it becomes active.
    out = blazar("engine", "update", "--version", OLD).output
    assert f"{OLD_TAG} is now active" in out
    # The update benchmarks old and new in one run; a loose gate absorbs a busy machine's noise.
    blazar("import", str(tiny_model), "--name", "tiny")
    out = blazar("engine", "update", "--version", NEW, "--gate", "0.5").output
    assert "passed the regression gate" in out and f"{OLD_TAG}: decode" in out
    engines = engine_list(blazar)
    assert set(engines) == {OLD_TAG, NEW_TAG}
    assert engines[NEW_TAG]["active"] and not engines[OLD_TAG]["active"]
    assert engines[NEW_TAG]["version"] == NEW and engines[NEW_TAG]["method"] == "wheel"
    for tag in (OLD_TAG, NEW_TAG):
        bench = engines[tag]["bench"]
        assert bench["model"] == "tiny" and bench["decode_tps"] > 0 and bench["note"] == "gate"

    # Both engines serve the tiny model at the same time, each from its own environment.
    async def both_running() -> None:
        servers = [
            EngineServer(engines[t]["command"], ["--model", str(tiny_model)], tmp_path / f"{t}.log")
            for t in (OLD_TAG, NEW_TAG)
        ]
        async with servers[0], servers[1]:
            for server in servers:
                assert is_tiny_text(await asyncio.to_thread(complete, server.url), allow=())
            # rm refuses the active engine, and an engine a running instance uses, naming the
            # pid. The CLI runs in a thread: the loop keeps draining the children's output.
            r = await asyncio.to_thread(blazar, "engine", "rm", NEW_TAG, ok=False)
            assert r.exit_code == 1 and "active" in r.output and "engine use" in r.output
            r = await asyncio.to_thread(blazar, "engine", "rm", OLD_TAG, ok=False)
            assert r.exit_code == 1 and f"pid {servers[0].pid}" in r.output

    asyncio.run(both_running())
    assert Path(engines[OLD_TAG]["path"]).is_dir()

    # A second update finds the newest installed: nothing to do.
    assert f"{NEW_TAG} is current" in blazar("engine", "update", "--version", NEW).output

    assert f"{OLD_TAG} is now active (was {NEW_TAG})" in blazar("engine", "use", OLD_TAG).output
    assert f"rolled back to {NEW_TAG} (was {OLD_TAG})" in blazar("engine", "rollback").output
    assert f"rolled back to {OLD_TAG} (was {NEW_TAG})" in blazar("engine", "rollback").output

    # Every switch is in the store: a fresh process sees the same active engine and history.
    with Store(paths.db) as store:
        records = EngineStore(store)
        active = records.active("llamacpp")
        assert active is not None and active.tag == OLD_TAG
        reasons = [s["reason"] for s in records.switches("llamacpp")]
        assert reasons == ["first install", "update", "use", "rollback", "rollback"]

    blazar("engine", "use", NEW_TAG)
    assert f"removed llamacpp {OLD_TAG}" in blazar("engine", "rm", OLD_TAG).output
    assert not Path(engines[OLD_TAG]["path"]).exists()
    assert set(engine_list(blazar)) == {NEW_TAG}
    r = blazar("engine", "rollback", ok=False)
    assert "was removed" in r.output


def test_bench_records_history(blazar: Blazar, paths: Paths, tiny_model: Path) -> None:
    blazar("engine", "update", "--version", NEW)
    blazar("import", str(tiny_model), "--name", "tiny")
    data = json.loads(blazar("bench", "tiny", "--json").output)
    assert data["tag"] == NEW_TAG and data["model"] == "tiny"
    assert data["decode_tps"] > 0 and data["prompt_tps"] > 0
    assert data["predicted_n"] == 64 and data["runs"] == 5
    human = blazar("bench", "tiny", "--engine", NEW_TAG).output
    assert "generation" in human and "tokens/s" in human
    with Store(paths.db) as store:
        assert len(EngineStore(store).bench_history()) == 2
    assert "not in the store" in blazar("bench", "nope", ok=False).output
    assert "no engine tagged" in blazar("bench", "tiny", "--engine", "b1-cpu", ok=False).output


def test_engine_commands_explain_an_empty_lane(blazar: Blazar) -> None:
    assert "No engines yet" in blazar("engine", "list").output
    assert "no active llamacpp engine" in blazar("bench", "x", ok=False).output
    assert "no earlier llamacpp engine" in blazar("engine", "rollback", ok=False).output
    assert "no engine tagged" in blazar("engine", "use", "b1-cpu", ok=False).output
    r = blazar("engine", "update", "--gate", "1.5", ok=False)
    assert "--gate must be a fraction" in r.output
    out = blazar("engine", "update", "--all").output
    assert "llamacpp: skipped (not installed)" in out


def slow_server() -> bytes:
    """A llama-server that really is slower: the real launcher with eight threads pinned to
    one core, so they contend for it (a genuine oversubscription regression, measured, not
    faked). Eight, not the bench's own count: llama.cpp's threads spin at each barrier, so
    the drop is large enough to hold when other work loads the machine too."""
    script = launcher_script().decode()
    script = script.replace("exec ", "exec taskset -c 0 ", 1)
    return script.replace('"$@"', '"$@" --threads 8 --threads-batch 8', 1).encode()


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_gate_refuses_a_really_slower_candidate_and_keeps_it_installed(
    blazar: Blazar, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("pinning to one core slows nothing on a one-core machine")
    blazar("engine", "update", "--version", NEW)
    blazar("import", str(tiny_model), "--name", "tiny")
    with ReleaseFeed() as feed:
        name = "llama-b99999-bin-ubuntu-x64.zip"
        feed.add_release("b99999", {name: server_archive(name, slow_server())})
        monkeypatch.setenv("BLAZAR_RELEASE_FEED", feed.url)
        out = blazar("engine", "update", "--install", "release").output
        engines = engine_list(blazar)
        # Refused, not lost: it stays installed, and the next update does not re-run the gate.
        again = blazar("engine", "update", "--install", "release").output
    assert f"b99999-cpu is slower than {NEW_TAG}" in out
    assert f"kept {NEW_TAG} active" in out and "engine use b99999-cpu" in out
    assert engines[NEW_TAG]["active"] and not engines["b99999-cpu"]["active"]
    old, new = engines[NEW_TAG]["bench"], engines["b99999-cpu"]["bench"]
    assert new["decode_tps"] < old["decode_tps"] * 0.9  # the figures behind the refusal
    assert engines["b99999-cpu"]["method"] == "release"
    assert "b99999-cpu is already installed but inactive" in again
    assert "b99999-cpu is now active" in blazar("engine", "use", "b99999-cpu").output


def test_update_takes_feed_method_and_gate_from_the_manifest(
    blazar: Blazar, paths: Paths, tiny_model: Path
) -> None:
    blazar("engine", "update", "--version", NEW)
    blazar("import", str(tiny_model), "--name", "tiny")
    with ReleaseFeed() as feed:
        name = "llama-b99999-bin-ubuntu-x64.zip"
        feed.add_release("b99999", {name: server_archive(name, slow_server())})
        paths.manifest.write_text(
            "[engines.llamacpp]\n"
            'install = "release"\n'
            f'feed = "{feed.url}"\n'
            "rollback_on_drop = 0.99\n"  # a gate this loose lets even the pinned-core build in
        )
        out = blazar("engine", "update").output
    assert "b99999-cpu passed the regression gate" in out and "gate 99%" in out
    assert engine_list(blazar)["b99999-cpu"]["active"]
