"""Speculative decoding with the real engine and the real model (Gemma 3 270M): a matching
draft serving correct answers, a mismatched one refused at diff, apply and before a spawn, a
pinned mode over the profile; and (slow) `blazar tune`'s races: n-gram lookup adopted on
the repetitive workload and used at the next spawn, a model as its own draft never adopted.

Figures on a loaded two-core machine vary run to run; what is asserted is what the race
must get right whatever the load: n-gram lookup streams the repetitive workload's answers
faster than dense decoding (it drafts whole lines the model accepts), by more than the
threshold, so it is adopted; a model as its own draft is never faster than dense.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from blazar.reconcile.apply import load
from blazar.serve.supervisor.build import build_runtimes
from blazar.store.db import Store
from blazar.store.profiles import Profile, ProfileStore
from blazar.tune.race import Figures, decide
from tests.conftest import Blazar
from tests.fixtures import ENGINE
from tests.serving import Served

QUICK = ("--requests", "1", "--tokens", "32", "--runs", "3")
FACTS = "The capital of France is Paris. The capital of Germany is"


def block(name: str, path: Path, **fields: object) -> str:
    lines = [f'[models."{name}"]', f'source = "{path.as_uri()}"', "ctx = 1024"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n\n"


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def complete(served: Served, model: str, prompt: str) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    return dict(served.post("/v1/completions", body))


def refused(served: Served, model: str) -> tuple[int, str]:
    try:
        complete(served, model, FACTS)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    raise AssertionError(f"{model} was served")


def test_a_matching_draft_serves_correct_answers_and_a_mismatched_one_is_refused(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, gemma_gguf: Path, tiny_model: Path
) -> None:
    text = ENGINE + block("gemma-pinned", gemma_gguf, spec="off")
    text += block("gemma-draft", gemma_gguf, spec="draft", draft="gemma-draft")  # its own
    text += block("gemma-bad", gemma_gguf, spec="draft", draft="tiny")
    text += f'[models.tiny]\nsource = "{tiny_model.as_uri()}"\n'
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(text)
    mismatch = "model 'tiny' cannot draft for 'gemma-bad': their vocabularies differ in size"
    assert mismatch in blazar("apply", str(manifest), "--yes").output  # a `!` note
    assert mismatch in blazar("diff", str(manifest)).output
    assert "DraftMismatch" in blazar("status").output
    listed = blazar("drafts", "gemma-draft", "--manifest", str(manifest)).output.splitlines()
    matches = {line.split()[0]: line for line in listed[2:]}
    assert "matches" in matches["gemma-draft"] and "differs" in matches["tiny"]

    with Store(blazar_home / "data" / "blazar.db") as store:  # as `blazar tune` would
        ProfileStore(store).record(Profile("gemma-pinned", "", {"spec": "ngram"}))
        runtimes = build_runtimes(store, load(manifest))
    assert "--spec-type" not in runtimes["gemma-pinned"].args()  # the manifest pins off
    problem = runtimes["gemma-bad"].settings_problem or ""
    assert "model 'tiny' cannot draft for it: their vocabularies differ in size" in problem

    with Served(manifest, blazar_home) as served:
        answer = complete(served, "gemma-draft", FACTS)
        # Greedy; the text may part from dense decoding's after a few tokens (the draft's
        # tokens are verified in one batch, whose sums round differently), not the facts.
        assert answer["choices"][0]["text"].startswith(" Berlin. The capital of the United")
        timings = answer["timings"]  # the draft drafted, and the model took its tokens
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]
        rows = {r["model"]: r for r in served.ps()}
        drafting = cmdline(rows["gemma-draft"]["pid"])
        assert drafting[drafting.index("--spec-type") + 1] == "draft-simple"
        assert drafting[drafting.index("--spec-draft-model") + 1] == runtimes["gemma-draft"].path
        assert rows["gemma-draft"]["spec"] == "draft:gemma-draft"
        trail = blazar("why", "--url", served.url).output  # the newest: gemma-draft's
        assert "decoding: speculative (draft:gemma-draft)" in trail and "accepted (100%)" in trail
        status, body = refused(served, "gemma-bad")
        assert status == 400 and "their vocabularies differ in size" in body
        assert "gemma-bad" not in rows  # refused before any spawn


@pytest.mark.slow
def test_the_race_adopts_ngram_on_the_repetitive_workload(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, gemma_gguf: Path
) -> None:
    """dense against n-gram lookup on Gemma 3 270M, the median of three runs (about a
    minute on two loaded cores; under half that on quiet ones)."""
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(ENGINE + block("gemma", gemma_gguf))
    blazar("apply", str(manifest), "--yes")
    raced = json.loads(
        blazar(
            "tune",
            "gemma",
            "--manifest",
            str(manifest),
            "--spec-race",
            "--workload",
            "repetitive",
            *QUICK,
            "--json",
        ).output
    )
    [stage] = raced["stages"]
    medians = {f["label"]: f["median"] for f in stage["figures"]}
    ratio = medians["ngram"] / medians["dense"]
    print(f"ngram / dense, streamed tokens/s on the repetitive workload: {ratio:.2f}x", medians)
    assert stage["decision"]["winner"] == "ngram" and stage["decision"]["adopted"], stage
    assert ratio > 1.05
    ngram = next(f for f in stage["figures"] if f["label"] == "ngram")
    assert ngram["acceptance"] > 0.5  # it drafted the repeated lines, and they were taken
    assert raced["profile"] == {"spec": "ngram"} and raced["recorded"]
    with Served(manifest, blazar_home) as served:  # the next spawn uses the profile
        complete(served, "gemma", FACTS)
        [row] = served.ps()
        assert (row["spec"], row["profile"]) == ("ngram", ["spec"])
        argv = cmdline(row["pid"])
        assert argv[argv.index("--spec-type") + 1] == "ngram-simple"


@pytest.mark.slow
def test_a_draft_that_loses_is_never_adopted_and_the_refinements_run(
    tmp_path: Path, blazar_home: Path, blazar: Blazar, gemma_gguf: Path
) -> None:
    """A model as its own draft does twice the work for the same tokens: dense beats it,
    and a race of the two keeps dense. (Gemma 3 270M's greedy answers repeat themselves,
    so n-gram lookup may win even on the chat workload.) Then the n-gram refinement and
    the cache_reuse stage run end to end (slow: minutes)."""
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(ENGINE + block("gemma", gemma_gguf, draft="gemma"))
    blazar("apply", str(manifest), "--yes")
    raced = json.loads(
        blazar(
            "tune",
            "gemma",
            "--manifest",
            str(manifest),
            "--spec-race",
            "--workload",
            "chat",
            *QUICK,
            "--json",
        ).output
    )
    [stage] = raced["stages"]
    medians = {f["label"]: f["median"] for f in stage["figures"]}
    print("chat workload, streamed tokens/s:", medians, stage["decision"]["reason"])
    assert medians["draft:gemma"] < medians["dense"]
    assert stage["decision"]["winner"] != "draft:gemma"
    measured = {
        f["label"]: Figures(f["label"], tuple(f["runs"]), figure=f["figure"])
        for f in stage["figures"]
    }
    kept = decide([measured["dense"], measured["draft:gemma"]], "dense", 0.05)
    assert kept.winner == "dense" and not kept.adopted and kept.gain < 0
    refined = json.loads(
        blazar(
            "tune",
            "gemma",
            "--manifest",
            str(manifest),
            "--ngram",
            "--cache-reuse",
            "--requests",
            "2",
            "--tokens",
            "16",
            "--runs",
            "2",
            "--json",
        ).output
    )
    assert [s["stage"] for s in refined["stages"]] == ["ngram", "cache-reuse"]
    for found in refined["stages"]:
        assert len(found["figures"]) == len(found["candidates"]) and found["decision"]
