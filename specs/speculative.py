"""Speculative decoding in a model's declaration: its fields, the llama-server flags they
stand for, and the rules that make a declaration one the engine can honour.

`specs.models.Model` declares the fields (`spec`, `draft`, the draft's and the n-gram
lookup's knobs) and calls `check_speculation` from its validator: a knob for a mode the
model is pinned away from, a draft mode without a draft, a speculative embedding model
are refused, never ignored. Pure: the draft's vocabulary is checked where the GGUFs are
(`blazar.models.vocab`), at diff and before a spawn.
"""

from __future__ import annotations

from typing import Any, Literal

from specs.problems import FieldError

SpecMode = Literal["off", "ngram", "draft", "auto"]
DRAFT_KNOBS = ("draft_max", "draft_min", "draft_p_min")
NGRAM_KNOBS = ("ngram_size_n", "ngram_size_m", "ngram_min_hits")
SPEC_FIELDS = ("spec", "draft", *DRAFT_KNOBS, *NGRAM_KNOBS)

_USE = {
    "spec": ("--spec-type",),
    "draft": ("-md", "--model-draft", "--spec-draft-model"),
    "draft_max": ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
    "draft_min": ("--spec-draft-n-min", "--draft-min"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "ngram_size_n": ("--spec-ngram-size-n",),
    "ngram_size_m": ("--spec-ngram-size-m",),
    "ngram_min_hits": ("--spec-ngram-min-hits",),
}
SPEC_ARGS = {flag: f"use {name}" for name, flags in _USE.items() for flag in flags}


def check_speculation(model: Any) -> None:
    """Raise a FieldError for speculative-decoding fields the model cannot honour."""
    given = model.model_fields_set
    mode = model.spec or "auto"
    knobs = given & {"draft", *DRAFT_KNOBS, *NGRAM_KNOBS}
    if model.embeddings and (mode not in ("off", "auto") or knobs):
        field = "spec" if mode not in ("off", "auto") else sorted(knobs)[0]
        raise FieldError(
            field,
            "speculative decoding speeds up generation, and this is an embedding model",
            f"remove {field}",
        )
    if mode == "draft" and model.draft is None:
        raise FieldError(
            "spec",
            "spec = 'draft' needs a draft model",
            "set draft to a declared model with the same vocabulary (`blazar drafts MODEL` "
            "lists them), or choose spec = 'ngram'",
        )
    pinned_away = {
        "off": (*DRAFT_KNOBS, "draft", *NGRAM_KNOBS),
        "ngram": (*DRAFT_KNOBS, "draft"),
        "draft": NGRAM_KNOBS,
    }.get(mode, ())
    for field in pinned_away:
        if field in given and getattr(model, field) is not None:
            kind = "the n-gram lookup" if field in NGRAM_KNOBS else "draft decoding"
            raise FieldError(
                field,
                f"{field} applies to {kind}, and spec = {mode!r} pins the model to "
                f"{'dense decoding' if mode == 'off' else mode + ' decoding'}",
                f"remove {field}, or set spec to 'auto' (or the mode it applies to)",
            )
    low, high = model.draft_min, model.draft_max
    if low is not None and high is not None and low > high:
        raise FieldError(
            "draft_min",
            f"draft_min = {low} is above draft_max = {high}",
            "lower draft_min or raise draft_max",
        )
