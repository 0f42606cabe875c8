"""Which runs `blazar tune` makes: its stages and each stage's candidates. Pure.

A stage compares candidates on one workload against a baseline and adopts the best only
when it beats the baseline by more than the threshold (`blazar.tune.race`). Stages run
in this order, each from what the ones before adopted:

- search (`--search`): the current settings, then one setting changed at a time: slots,
  batch and micro-batch sizes, threads, the KV cache type; a candidate `blazar fit` says
  does not fit is skipped, with why;
- spec-race (`--spec-race`; the stage run when none is asked): dense (the baseline),
  n-gram lookup, and a draft model for each draft declared or given (`--draft NAME`);
- ngram (`--ngram`): n-gram lookup with the engine's sizes (the baseline), then one knob
  changed at a time: tokens matched, tokens drafted, hits before drafting;
- cache-reuse (`--cache-reuse`): the prompt cache without KV shifting (the baseline), then
  `cache_reuse` of 64 and 256 tokens, on the long-prompt workload.

A candidate is the profile settings it stands for; `blazar.tune.session` turns each into
the child's argv the way serve would (`ModelRuntime.args`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

STAGES = ("search", "spec-race", "ngram", "cache-reuse")
DEFAULT_WORKLOAD = {
    "search": "chat",
    "spec-race": "chat",
    "ngram": "repetitive",
    "cache-reuse": "long-prompt",
}
# What each stage's runs count (`blazar.tune.measure`): the streaming speed for decoding
# modes, tokens over the whole run for what changes the prompt's time too.
FIGURE = {"search": "e2e", "spec-race": "stream", "ngram": "stream", "cache-reuse": "e2e"}
THRESHOLD = 0.05
# One at a time from the engine's defaults (llama.cpp: n 12, m 48, min hits 1).
NGRAM_TRIES = {"ngram_size_n": (4, 8, 16), "ngram_size_m": (16,), "ngram_min_hits": (2,)}
CACHE_REUSE_TRIES = (64, 256)
BATCH_TRIES, UBATCH_TRIES, SLOT_TRIES = (512, 2048), (128, 512), (1, 2, 4)


@dataclass(frozen=True)
class Options:
    """What `blazar tune` was asked (its flags)."""

    search: bool = False
    spec_race: bool = False
    ngram: bool = False
    cache_reuse: bool = False
    slots: int | None = None  # every child's slots (--slots)
    replicas: int = 1  # children per candidate, clients spread over them
    load: int = 1  # concurrent clients
    runs: int = 3  # measured runs per candidate (median), after one warm-up
    workload: str | None = None  # every stage's (default: each stage's own)
    requests: int | None = None  # only the first N requests of the workload
    tokens: int | None = None  # tokens each request generates (default: the workload's)
    threshold: float = THRESHOLD
    drafts: tuple[str, ...] = ()  # more drafts to race (--draft)

    @property
    def stages(self) -> tuple[str, ...]:
        asked = dict(
            zip(STAGES, (self.search, self.spec_race, self.ngram, self.cache_reuse), strict=True)
        )
        chosen = tuple(s for s in STAGES if asked[s])
        return chosen or ("spec-race",)

    def workload_for(self, stage: str) -> str:
        return self.workload or DEFAULT_WORKLOAD[stage]


@dataclass(frozen=True)
class Candidate:
    label: str  # dense, ngram, draft:NAME, slots=2, ngram_size_n=8, cache_reuse=64
    settings: dict[str, Any]  # the profile settings it stands for, over the stage's base
    baseline: bool = False
    skip: str | None = None  # why it is not measured (it does not fit, a bad draft)


@dataclass(frozen=True)
class Stage:
    name: str
    workload: str
    candidates: tuple[Candidate, ...]
    base: dict[str, Any] = field(default_factory=dict)  # what the stages before adopted


def stage_plan(
    stage: str,
    options: Options,
    base: Mapping[str, Any],
    *,
    drafts: tuple[str, ...] = (),
    cores: int = 2,
    current: Mapping[str, Any] | None = None,
    problem: Callable[[dict[str, Any]], str | None] = lambda settings: None,
) -> Stage:
    """The candidates of one stage from `base` (the settings adopted so far). `drafts`:
    the declared and given drafts; `current`: the slots, batch sizes, threads and cache
    type the model runs with now (search varies them); `problem`: why a candidate's
    settings cannot run (it does not fit, a draft of another vocabulary), or None."""
    now = dict(current or {})
    tries: list[tuple[str, dict[str, Any]]]
    if stage == "spec-race":
        tries = [("dense", {"spec": "off"}), ("ngram", {"spec": "ngram"})]
        tries += [(f"draft:{d}", {"spec": "draft", "draft": d}) for d in drafts]
    elif stage == "ngram":
        tries = [("ngram", {"spec": "ngram"})]
        tries += [
            (f"{k}={v}", {"spec": "ngram", k: v}) for k, vs in NGRAM_TRIES.items() for v in vs
        ]
    elif stage == "cache-reuse":
        tries = [("cache_reuse=0", {"cache_reuse": 0})]
        tries += [(f"cache_reuse={v}", {"cache_reuse": v}) for v in CACHE_REUSE_TRIES]
    elif stage == "search":
        tries = [("current", {})]
        varied: dict[str, tuple[Any, ...]] = {
            "slots": () if options.slots else SLOT_TRIES,
            "batch": BATCH_TRIES,
            "ubatch": UBATCH_TRIES,
            "threads": tuple(sorted({max(1, cores // 2), cores})),
            "cache_type": ("f16", "q8_0"),
        }
        defaults = {"slots": 1, "batch": 2048, "ubatch": 512, "cache_type": "f16"}
        for key, values in varied.items():
            mine = now.get(key, defaults.get(key))
            tries += [(f"{key}={v}", {key: v}) for v in values if v != mine]
    else:
        raise ValueError(f"unknown stage {stage!r}")
    candidates = tuple(
        Candidate(label, settings, baseline=i == 0, skip=problem({**base, **settings}))
        for i, (label, settings) in enumerate(tries)
    )
    return Stage(stage, options.workload_for(stage), candidates, dict(base))
