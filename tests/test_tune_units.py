"""`blazar tune`'s decisions and settings, without children: the race with an injected
timer, the manifest over the profile, the draft's vocabulary, the stored profiles, the
shipped workloads, the stage plans, and what traces read of speculative decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blazar.errors import InvalidInput, NotGGUF
from blazar.launch.tuning import Tuning, tuning_for
from blazar.models.vocab import draft_problem, vocabulary
from blazar.observe import trail
from blazar.observe.outcome import from_response
from blazar.observe.speculation import acceptance, spec_header
from blazar.store.db import Store
from blazar.store.profiles import Profile, ProfileStore
from blazar.testing.tiny import write_tiny_model
from blazar.tune.measure import Sample, figures, run_once
from blazar.tune.plan import Options, stage_plan
from blazar.tune.race import Figures, decide
from blazar.tune.workloads import NAMES, load_workload
from specs.loader import load_manifest_text

# --- the decision, with an injected timer -------------------------------------------------


class FakeClock:
    """A clock that only moves when a fake request says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_send(clock: FakeClock, seconds: dict[str, list[float]], tokens: int = 32) -> Any:
    """A request function whose answers take, per child URL, the next of its durations:
    0.2 s to the first token, the rest streaming."""

    def send(url: str, prompt: str) -> Sample:
        took = seconds[url].pop(0)
        clock.now += took
        return Sample(ttft_s=0.2, wall_s=took, predicted_n=tokens)

    return send


def race(durations: dict[str, list[float]], figure: str = "stream") -> Any:
    clock = FakeClock()
    send = timed_send(clock, {k: list(v) for k, v in durations.items()})
    found = []
    for label, runs in durations.items():
        measured = [run_once([label], ["prompt"], 1, send, clock) for _ in runs]
        found.append(figures(label, measured, (), None, {}, figure))
    return decide(found, "dense", 0.05), {f.label: f for f in found}


def test_a_mode_is_adopted_only_above_the_threshold_on_the_median() -> None:
    # ngram 20% faster to stream in every run: adopted
    decision, found = race({"dense": [1.2, 1.2, 1.2], "ngram": [1.0, 1.0, 1.0]})
    assert decision.adopted and decision.winner == "ngram"
    assert found["ngram"].median / found["dense"].median == pytest.approx(1.25)
    assert "above the 5% threshold" in decision.reason
    # 3% faster: within the threshold, dense is kept and the figures still said
    decision, _ = race({"dense": [1.03, 1.03, 1.03], "ngram": [1.0, 1.0, 1.0]})
    assert not decision.adopted and decision.winner == "dense"
    assert decision.best == "ngram" and 0 < decision.gain < 0.05
    assert decision.reason.startswith("kept dense: ngram") and "not above" in decision.reason
    # slower (a draft model as big as the model): dense is kept
    decision, _ = race({"dense": [1.0, 1.0, 1.0], "draft:self": [2.0, 2.1, 1.9]})
    assert decision.winner == "dense" and decision.gain < 0


def test_the_median_not_one_lucky_run_decides() -> None:
    # one very fast ngram run among two slow ones: the median is slow, dense stays
    decision, found = race({"dense": [1.0, 1.0, 1.0], "ngram": [0.3, 1.02, 1.01]})
    assert max(found["ngram"].runs) > 2 * found["dense"].median
    assert decision.winner == "dense"
    # one slow dense run among fast ones: the median ignores it, ngram still wins
    decision, _ = race({"dense": [9.0, 1.2, 1.2], "ngram": [1.0, 1.0, 1.0]})
    assert decision.winner == "ngram"


def test_end_to_end_counts_the_prompt_and_stream_leaves_it_out() -> None:
    clock = FakeClock()
    send = timed_send(clock, {"a": [2.0]}, tokens=33)
    run = run_once(["a"], ["p"], 1, send, clock)
    assert run.tps == pytest.approx(33 / 2.0)  # 2 s in all
    assert run.stream_tps == pytest.approx(32 / 1.8)  # the 1.8 s after the first token


def test_nothing_measured_keeps_the_baseline() -> None:
    dense = Figures("dense", ())
    decision = decide([dense, Figures("ngram", (30.0,))], "dense", 0.05)
    assert decision.winner == "dense" and "could not be measured" in decision.reason


# --- the manifest over the profile ---------------------------------------------------------


def model(**fields: Any) -> Any:
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in fields.items())
    text = f'[models.m]\nsource = "file:///m.gguf"\n{body}'
    return load_manifest_text(text, "m.toml").models["m"]


@pytest.mark.parametrize(
    ("fields", "profile", "spec", "knobs", "used"),
    [
        ({}, None, "off", (), ()),
        (
            {},
            {"spec": "ngram", "ngram_size_n": 8},
            "ngram",
            (("ngram_size_n", 8),),
            ("spec", "ngram_size_n"),
        ),
        ({"spec": "auto"}, {"spec": "ngram"}, "ngram", (), ("spec",)),
        ({"spec": "off"}, {"spec": "ngram", "ngram_size_n": 8}, "off", (), ()),
        (
            {"ngram_size_n": 4},
            {"spec": "ngram", "ngram_size_n": 8},
            "ngram",
            (("ngram_size_n", 4),),
            ("spec",),
        ),
        (
            {"spec": "draft", "draft": "m", "draft_max": 2},
            {"spec": "ngram", "draft_max": 8},
            "draft",
            (("draft_max", 2),),
            (),
        ),
    ],
)
def test_the_manifest_pins_what_it_sets_and_the_profile_fills_the_rest(
    fields: dict[str, Any],
    profile: dict[str, Any] | None,
    spec: str,
    knobs: tuple[Any, ...],
    used: tuple[str, ...],
) -> None:
    tuning = tuning_for(model(**fields), profile)
    assert (tuning.spec, tuning.knobs, tuning.from_profile) == (spec, knobs, used)


def test_profile_sizes_apply_unless_args_or_slots_pin_them() -> None:
    profile = {"spec": "off", "threads": 2, "batch": 512, "slots": 3}
    free = tuning_for(model(), profile)
    assert (free.threads, free.batch, free.slots) == (2, 512, 3)
    assert free.flags() == ["--batch-size", "512"]
    pinned = tuning_for(model(args=["--threads", "1"], slots=1), profile)
    assert (pinned.threads, pinned.slots) == (None, 1)
    assert "threads" not in pinned.from_profile and "slots" not in pinned.from_profile


def test_flags_of_each_mode() -> None:
    ngram = Tuning(spec="ngram", knobs=(("ngram_size_n", 8), ("ngram_min_hits", 2)))
    assert ngram.flags() == [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-size-n",
        "8",
        "--spec-ngram-min-hits",
        "2",
    ]
    draft = Tuning(
        spec="draft", draft="small", draft_path="/m/small.gguf", knobs=(("draft_p_min", 0.5),)
    )
    assert draft.flags() == [
        "--spec-draft-model",
        "/m/small.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-p-min",
        "0.5",
    ]
    assert draft.describe() == "draft:small" and Tuning().flags() == []
    assert Tuning().view() == {"spec": "off", "profile": []}


# --- vocabularies --------------------------------------------------------------------------


def test_the_draft_vocabulary_is_read_from_both_ggufs(tmp_path: Path, gemma_gguf: Path) -> None:
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    other = write_tiny_model(tmp_path / "other.gguf", seed=7)  # other weights, same tokens
    assert vocabulary(gemma_gguf).size == 262144 and vocabulary(tiny).size < 1000
    assert draft_problem(gemma_gguf, gemma_gguf) is None  # a model as its own draft
    assert draft_problem(tiny, other) is None
    reason = draft_problem(gemma_gguf, tiny)
    assert reason is not None and "differ in size (262144 and" in reason
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 4)
    assert "cannot be read" in (draft_problem(tiny, junk) or "")
    with pytest.raises(NotGGUF):
        vocabulary(junk)


# --- profiles in the store -----------------------------------------------------------------


def test_profiles_are_appended_and_the_newest_counts(tmp_path: Path) -> None:
    with Store(tmp_path / "blazar.db") as store:
        profiles = ProfileStore(store)
        assert profiles.current("m") is None
        profiles.record(Profile("m", "a" * 64, {"spec": "off"}, note="spec-race"))
        profiles.record(Profile("m", "a" * 64, {"spec": "ngram"}, note="spec-race"))
        profiles.record(Profile("n", "b" * 64, {"slots": 2}, note="search"))
        assert profiles.current("m").settings == {"spec": "ngram"}  # type: ignore[union-attr]
        assert profiles.current("m", sha256="c" * 64) is None  # another file: none
        assert set(profiles.all_current()) == {"m", "n"}
        profiles.forget("m")
        assert profiles.current("m") is None and set(profiles.all_current()) == {"n"}
        assert [p.note for p in profiles.history("m")] == ["spec-race", "spec-race", "forget"]
        with pytest.raises(ValueError, match="not a profile setting: speed"):
            profiles.record(Profile("m", "", {"speed": 11}))


# --- workloads and plans -------------------------------------------------------------------


def test_the_shipped_workloads_load(tmp_path: Path) -> None:
    loaded = {name: load_workload(name) for name in NAMES}
    assert all(len(w.prompts) >= 3 for w in loaded.values())
    assert loaded["long-prompt"].cache_prompt and not loaded["repetitive"].cache_prompt
    long = loaded["long-prompt"].prompts
    assert long[0].startswith("Notes written on Monday.") and long[0][30:200] == long[1][31:201]
    assert loaded["chat"].limited(1, 8).prompts == loaded["chat"].prompts[:1]
    with pytest.raises(InvalidInput, match="no workload 'nope'"):
        load_workload("nope")
    bad = tmp_path / "w.toml"
    bad.write_text("predict = 4\n")
    with pytest.raises(InvalidInput, match="has no requests"):
        load_workload(str(bad))


def test_stage_plans() -> None:
    options = Options()
    assert options.stages == ("spec-race",)  # the stage run when none is asked
    race = stage_plan("spec-race", options, {}, drafts=("small",))
    assert [c.label for c in race.candidates] == ["dense", "ngram", "draft:small"]
    assert race.candidates[0].baseline and race.workload == "chat"
    ngram = stage_plan("ngram", Options(ngram=True, workload="repetitive"), {})
    assert [c.label for c in ngram.candidates][:2] == ["ngram", "ngram_size_n=4"]
    assert all(c.settings["spec"] == "ngram" for c in ngram.candidates)
    reuse = stage_plan("cache-reuse", Options(cache_reuse=True), {})
    assert [c.label for c in reuse.candidates] == [
        "cache_reuse=0",
        "cache_reuse=64",
        "cache_reuse=256",
    ]
    assert reuse.workload == "long-prompt"

    def too_big(settings: dict[str, Any]) -> str | None:
        return "does not fit" if settings.get("slots", 1) > 2 else None

    search = stage_plan(
        "search", Options(search=True), {}, cores=4, current={"slots": 1}, problem=too_big
    )
    labels = {c.label: c.skip for c in search.candidates}
    assert labels["slots=4"] == "does not fit" and labels["slots=2"] is None
    assert "slots=1" not in labels and {"threads=2", "threads=4", "cache_type=q8_0"} <= set(labels)
    both = Options(search=True, spec_race=True, cache_reuse=True)
    assert both.stages == ("search", "spec-race", "cache-reuse")


# --- what traces read ----------------------------------------------------------------------


def test_traces_read_the_mode_and_the_acceptance_rate() -> None:
    timings = {
        "predicted_n": 32,
        "predicted_per_second": 50.0,
        "draft_n": 40,
        "draft_n_accepted": 25,
    }
    body = {
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "timings": timings,
    }
    outcome = from_response("/v1/chat/completions", body)
    assert (outcome.draft_tokens, outcome.draft_accepted) == (40, 25)
    assert acceptance(timings) == (40, 25, 0.625)
    assert spec_header("ngram", timings) == "ngram; accepted=0.62"
    assert spec_header("off", {"predicted_n": 3}) == "off" and acceptance(None) is None
    record = {
        "id": "t",
        "time": 0,
        "protocol": "openai",
        "route": "/v1/chat/completions",
        "status": 200,
        "spec": "ngram",
        "draft_tokens": 40,
        "draft_accepted": 25,
    }
    assert "  2. decoding: speculative (ngram), 25 of 40 drafted tokens accepted (62%)" in (
        trail.render(record)
    )
    dense = trail.render({**record, "spec": "off", "draft_tokens": None})
    assert any("decoding: dense" in line for line in dense)


def test_a_candidate_whose_child_does_not_start_is_reported_not_fatal(tmp_path: Path) -> None:
    import asyncio
    import sys

    from blazar.tune.measure import Job, measure

    broken = Job("broken", (sys.executable, "-c", "import sys; sys.exit(3)"), (), {})
    [found] = asyncio.run(
        measure(
            [broken],
            ["p"],
            timed_send(FakeClock(), {}),
            runs=1,
            replicas=1,
            load=1,
            log_dir=tmp_path,
        )
    )
    assert found.runs == () and "exited with code 3" in (found.error or "")
    assert decide([Figures("dense", (10.0,)), found], "dense", 0.05).winner == "dense"


def test_the_progress_bar_shows_runs_done_the_candidate_and_the_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from blazar.cli.tune import _Bar

    bar = _Bar(4, enabled=True)
    bar.step("spec-race", "ngram")
    bar.step("spec-race", "draft:small")
    bar.close()
    drawn = capsys.readouterr().err
    assert "\r[#####...............] 1/4 runs  spec-race: ngram  0:00" in drawn
    assert "\r[##########..........] 2/4 runs  spec-race: draft:small  0:00" in drawn
    quiet = _Bar(4, enabled=False)  # not a terminal: nothing drawn
    quiet.step("search", "slots=2")
    assert capsys.readouterr().err == ""
