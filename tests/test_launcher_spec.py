"""The launcher's speculative-decoding flags: each lands on xllamacpp's CommonParams, and
takes effect in a real child (the draft model drafts, the engine reports it in `timings`).

The children are the launcher run as `tests/test_launcher.py` runs it (the `launch`
fixture: a free loopback port, stopped by PID, exit code 0 checked).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from blazar.engines.launchers import launcher_common
from blazar.engines.launchers import llama_launcher as launcher
from tests.test_launcher import Launched, launch, run_launcher

__all__ = ["launch"]  # the fixture, shared with tests/test_launcher.py

REPEATED = "the cat sat on the mat. the cat sat on the mat. the cat"


def test_spec_flags_map_onto_common_params(tiny_model: Path, tmp_path: Path) -> None:
    import xllamacpp

    kinds = xllamacpp.common_speculative_type
    params = launcher.parse_args(
        [
            "-m",
            str(tiny_model),
            "-t",
            "3",
            "--spec-type",
            "ngram-simple,draft-simple",
            "--spec-draft-model",
            str(tiny_model),
            "--spec-draft-n-max",
            "7",
            "--draft-min",
            "2",
            "--draft-p-min",
            "0.6",
            "--spec-ngram-size-n",
            "5",
            "--spec-ngram-size-m",
            "20",
            "--spec-ngram-min-hits",
            "2",
            "-lcs",
            "static.bin",
            "-lcd",
            "dynamic.bin",
            "--cache-reuse",
            "64",
        ]
    )
    spec = params.speculative
    assert spec.types == [
        kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE,
        kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE,
    ]
    assert spec.draft.mparams.path == str(tiny_model)
    assert (spec.draft.n_max, spec.draft.n_min) == (7, 2)
    assert spec.draft.p_min == pytest.approx(0.6)
    for lookup in (spec.ngram_simple, spec.ngram_map_k, spec.ngram_map_k4v):
        assert (lookup.size_n, lookup.size_m, lookup.min_hits) == (5, 20, 2)
    assert spec.ngram_cache.lookup_cache_static == "static.bin"
    assert spec.ngram_cache.lookup_cache_dynamic == "dynamic.bin"
    assert params.n_cache_reuse == 64
    # the draft runs on the main model's threads unless told otherwise
    assert (spec.draft.cpuparams.n_threads, spec.draft.cpuparams_batch.n_threads) == (3, 3)
    assert launcher.parse_args(["-m", "m.gguf"]).speculative.types == [
        kinds.COMMON_SPECULATIVE_TYPE_NONE
    ]


def test_a_draft_model_alone_means_draft_decoding(tiny_model: Path) -> None:
    import xllamacpp

    params = launcher.parse_args(["-m", str(tiny_model), "-md", str(tiny_model), "-td", "1"])
    simple = xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE
    assert params.speculative.types == [simple]
    assert params.speculative.draft.cpuparams.n_threads == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--spec-type", "turbo"], 2, "bad value for --spec-type: expected one of none, draft"),
        (["--spec-type", "draft-simple"], 2, "needs a draft model: pass --spec-draft-model"),
        (["--spec-draft-n-max", "many"], 2, "bad value for --spec-draft-n-max: expected an int"),
        (["--spec-draft-model", "{tmp}/nodraft.gguf"], 1, "draft model not found"),
    ],
)
def test_bad_spec_flags_give_one_clear_line(
    tiny_model: Path, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    filled = [a.format(tmp=tmp_path) for a in args]
    result = run_launcher("--port", "0", "-m", tiny_model, *filled)
    assert result.returncode == code, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message.format(tmp=tmp_path) in result.stderr


def test_a_flag_this_build_lacks_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older xllamacpp without speculative decoding: the flag is an error, not a no-op."""
    import xllamacpp

    monkeypatch.delattr(xllamacpp, "common_speculative_type")
    with pytest.raises(launcher_common.UsageError, match="has no speculative decoding"):
        launcher.parse_args(["-m", "m.gguf", "--spec-type", "ngram-simple"])
    apply = launcher.FLAG_BY_NAME["--spec-draft-n-max"].apply
    with pytest.raises(launcher_common.UsageError, match=r"has no speculative\.nothing"):
        launcher._set("speculative.nothing", launcher._int)(xllamacpp.CommonParams(), "3")
    apply(xllamacpp.CommonParams(), "3")  # a knob this build has still works


def test_a_draft_model_drafts_and_the_answer_is_the_dense_one(
    launch: Callable[..., Launched], tiny_model: Path
) -> None:
    """The same model as its own draft: every drafted token is accepted, the text is the
    text greedy decoding gives without a draft, and the engine's timings say so."""
    body = {"prompt": REPEATED, "n_predict": 16, "temperature": 0}
    dense = launch("--model", tiny_model).json("/completion", body=body)
    assert "draft_n" not in dense["timings"]
    drafted = launch("--model", tiny_model, "--spec-draft-model", tiny_model, "--draft-max", "2")
    answer = drafted.json("/completion", body=body)
    assert answer["content"] == dense["content"]
    timings = answer["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]
    assert answer["generation_settings"]["speculative.types"] == "draft-simple"


def test_help_lists_the_spec_flags() -> None:
    result = run_launcher("--help")
    for name in (
        "--spec-type TYPE[,TYPE]",
        "--spec-draft-model, --model-draft, -md FNAME",
        "--spec-ngram-size-n N",
        "--lookup-cache-static, -lcs FNAME",
    ):
        assert name in result.stdout
