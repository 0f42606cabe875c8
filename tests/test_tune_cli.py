"""`blazar tune`, `drafts`, `bench --history` and `run --no-draft` as a user types them, on
the tiny models and the real engine: the runs a tune would make, a real (short) tune that
records a profile, and the next spawn serving with what the profile says."""

from __future__ import annotations

import json
from pathlib import Path

from blazar.store.db import Store
from blazar.store.profiles import ProfileStore
from blazar.testing.tiny import is_tiny_text
from tests.conftest import Blazar
from tests.fixtures import ENGINE
from tests.serving import Served


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_tune_records_a_profile_and_the_next_spawn_serves_with_it(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, files: dict[str, Path]
) -> None:
    tiny, other = files["tiny"], files["other"]  # the same vocabulary, other weights
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(
        ENGINE
        + f'[models.tiny]\nsource = "{tiny.as_uri()}"\ndraft = "other"\n\n'
        + f'[models.other]\nsource = "{other.as_uri()}"\nspec = "draft"\ndraft = "tiny"\n'
    )
    blazar("apply", str(manifest), "--yes")
    at = ("--manifest", str(manifest))

    planned = json.loads(blazar("tune", "tiny", *at, "--dry-run", "--json").output)
    [race] = planned["stages"]
    argv = {c["label"]: c["argv"] for c in race["candidates"]}
    assert list(argv) == ["dense", "ngram", "draft:other"] and not planned["recorded"]
    assert "--spec-type" not in argv["dense"]
    assert argv["ngram"][argv["ngram"].index("--spec-type") + 1] == "ngram-simple"
    assert "--spec-draft-model" in argv["draft:other"]
    searched = blazar("tune", "tiny", *at, "--search", "--dry-run").output
    assert "slots=2: --model" in searched and "--parallel 2" in searched
    assert "Dry run: nothing was started." in searched
    with Store(blazar_home / "data" / "blazar.db") as store:
        assert ProfileStore(store).current("tiny") is None  # a dry run records nothing

    shown = blazar("tune", "tiny", *at, "--requests", "1", "--tokens", "8", "--runs", "1").output
    assert "spec-race on the chat workload (1 runs each):" in shown
    assert "STREAM TOK/S" in shown and "draft:other" in shown
    assert ("kept dense:" in shown) or ("adopted " in shown)
    assert "Profile of tiny recorded: " in shown and "spec = '" in shown
    with Store(blazar_home / "data" / "blazar.db") as store:
        profile = ProfileStore(store).current("tiny")
    assert profile is not None and profile.note == "spec-race"
    spec = profile.settings["spec"]
    assert spec in ("off", "ngram", "draft")

    with Served(manifest, blazar_home) as served:
        served.post("/v1/completions", {"model": "tiny", "prompt": "the", "max_tokens": 4})
        [row] = served.ps()
        assert row["profile"] == ["spec"]  # the draft is the manifest's own
        assert row["spec"] == ("draft:other" if spec == "draft" else spec)
        flags = cmdline(row["pid"])
        engine_type = {"off": None, "ngram": "ngram-simple", "draft": "draft-simple"}[spec]
        found = flags[flags.index("--spec-type") + 1] if "--spec-type" in flags else None
        assert found == engine_type

    answer = blazar("run", "other", "--no-draft", "--max-tokens", "6", "--", "hello").output
    assert is_tiny_text(answer.strip(), allow=())
    started = (blazar_home / "state" / "logs" / "run-other.log").read_text()
    assert "--spec-type" not in started and "--model" in started  # a dense child for the run

    blazar("bench", "tiny")
    blazar("bench", "tiny", "--spec", "ngram")
    undeclared = blazar("bench", "tiny", "--spec", "draft", ok=False)  # yours declares none
    assert undeclared.exit_code == 1 and "model 'tiny' declares no draft" in undeclared.output
    (blazar_home / "config").mkdir(parents=True, exist_ok=True)
    (blazar_home / "config" / "blazar.toml").write_text(manifest.read_text())
    blazar("bench", "tiny", "--spec", "draft")  # tiny's declared draft, `other`
    history = [
        json.loads(line)
        for line in blazar("bench", "--history", "tiny", "--json").output.splitlines()
    ]
    assert [h["spec"] for h in history] == ["off", "ngram", "draft"]
    assert all(h["decode_tps"] > 0 and h["prompt_tps"] > 0 for h in history)
    assert "ngram" in blazar("bench", "--history", "tiny").output

    blazar("tune", "tiny", "--forget")
    with Store(blazar_home / "data" / "blazar.db") as store:
        assert ProfileStore(store).current("tiny") is None


def test_tune_refuses_what_it_cannot_measure(blazar: Blazar, tmp_path: Path) -> None:
    missing = blazar("tune", "ghost", "--dry-run", ok=False)
    assert missing.exit_code == 1 and "model 'ghost' is not held" in missing.output
    bad = blazar("tune", "ghost", "--workload", "nope", "--slots", "0", ok=False)
    assert bad.exit_code == 2 and "--slots" in bad.output
