"""A model's tuned settings: its manifest fields over its profile, as llama-server flags.

What `blazar tune` measured best is the model's profile (`blazar.store.profiles`); what the
manifest declares wins over it, field by field: `spec` other than auto pins the
decoding mode, a knob set in the manifest pins that knob, `slots` pins the slots,
`--batch-size`, `--ubatch-size` and `--threads` in `args` pin those. `tuning_for` makes
the effective `Tuning` of one model and names the fields its profile supplied (`blazar
ps` shows them); `Tuning.flags` gives the child's flags. The modes:

- off: dense decoding, no flag;
- ngram: `--spec-type ngram-simple`, the n-gram lookup in the request's own context
  (the fastest of llama.cpp's lookups on the repetitive workload here: 88-90 tokens/s
  against 80-87 for ngram-map-k and 74-76 for ngram-mod, Gemma 3 270M on one thread);
- draft: `--spec-draft-model PATH --spec-type draft-simple`, a model of the same
  vocabulary proposing tokens the served model checks.

`tuning_for` is pure; `tuned` adds what needs the host: the draft's file and its
vocabulary (`blazar.models.vocab`), and whether the engine takes the flags
(`blazar.engines.probe`). `blazar.serve.supervisor.runtime` calls `with_tuning` for every
model it builds; a problem (a draft of another vocabulary, a flag the engine does not
take) refuses the model before any spawn, as a cache setting the GGUF cannot take does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from blazar.engines.probe import engine_flags
from blazar.models.vocab import draft_problem
from blazar.store.db import ModelRecord, Store
from blazar.store.profiles import Profile
from specs.manifest import Manifest
from specs.models import Model
from specs.names import parse_name
from specs.speculative import DRAFT_KNOBS, NGRAM_KNOBS

MODES = ("off", "ngram", "draft")
_FLAGS = {
    "draft_max": "--spec-draft-n-max",
    "draft_min": "--spec-draft-n-min",
    "draft_p_min": "--spec-draft-p-min",
    "ngram_size_n": "--spec-ngram-size-n",
    "ngram_size_m": "--spec-ngram-size-m",
    "ngram_min_hits": "--spec-ngram-min-hits",
}
_PINNED_BY_ARGS = {
    "batch": ("--batch-size", "-b"),
    "ubatch": ("--ubatch-size", "-ub"),
    "threads": ("--threads", "-t"),
}


@dataclass(frozen=True)
class Tuning:
    """The effective speculative decoding and engine sizes of one model."""

    spec: str = "off"  # off | ngram | draft
    draft: str | None = None  # the draft model's name (spec = draft)
    draft_path: str | None = None  # its GGUF, once resolved
    knobs: tuple[tuple[str, float | int], ...] = ()  # (field, value) of the mode's knobs
    batch: int | None = None
    ubatch: int | None = None
    threads: int | None = None
    slots: int | None = None  # the profile's, where the manifest sets none
    cache: tuple[tuple[str, Any], ...] = ()  # the profile's cache_type / cache_reuse
    from_profile: tuple[str, ...] = ()  # the fields the profile supplied

    @property
    def engine_type(self) -> str | None:
        """llama-server's --spec-type for the mode; None for dense decoding."""
        return {"ngram": "ngram-simple", "draft": "draft-simple"}.get(self.spec)

    def flags(self) -> list[str]:
        """The child's flags for these settings (threads are the runtime's to place)."""
        out: list[str] = []
        if self.spec == "draft" and self.draft_path:
            out += ["--spec-draft-model", self.draft_path]
        if self.engine_type is not None:
            out += ["--spec-type", self.engine_type]
        for name, value in self.knobs:
            out += [_FLAGS[name], f"{value:g}" if isinstance(value, float) else str(value)]
        if self.batch is not None:
            out += ["--batch-size", str(self.batch)]
        if self.ubatch is not None:
            out += ["--ubatch-size", str(self.ubatch)]
        return out

    def flag_names(self) -> list[str]:
        """The flags `flags` uses: what the engine must take (`blazar.engines.probe`)."""
        return [f for f in self.flags() if f.startswith("--")]

    def describe(self) -> str:
        """One word or two for `ps`: off, ngram, draft:NAME."""
        return f"draft:{self.draft}" if self.spec == "draft" else self.spec

    def view(self) -> dict[str, Any]:
        """What `blazar ps` shows of it: the mode and the fields the profile supplied."""
        return {"spec": self.describe(), "profile": list(self.from_profile)}


def tuning_for(model: Model | None, profile: Mapping[str, Any] | None) -> Tuning:
    """The model's declaration over its profile (None: it has none)."""
    had = dict(profile or {})
    used: list[str] = []

    def pick(name: str) -> Any:
        own = getattr(model, name, None) if model is not None else None
        if own is not None:
            return own
        if had.get(name) is not None:
            used.append(name)
        return had.get(name)

    declared = model.spec if model is not None else None
    mode: str = declared or "auto"
    if mode == "auto":
        mode = str(had["spec"]) if had.get("spec") in MODES else "off"
        if "spec" in had:
            used.append("spec")
    draft = pick("draft") if mode == "draft" else None
    names = {"ngram": NGRAM_KNOBS, "draft": DRAFT_KNOBS}.get(mode, ())
    knobs = tuple((n, v) for n in names if (v := pick(n)) is not None)
    cache = tuple((n, v) for n in ("cache_type", "cache_reuse") if (v := pick(n)) is not None)
    given = {a.split("=")[0] for a in (model.args if model is not None else [])}
    sizes = {n: had.get(n) for n, flags in _PINNED_BY_ARGS.items() if not given & set(flags)}
    used += [n for n, v in sizes.items() if v is not None]
    return Tuning(
        spec=mode,
        draft=draft,
        knobs=knobs,
        batch=sizes.get("batch"),
        ubatch=sizes.get("ubatch"),
        threads=sizes.get("threads"),
        slots=pick("slots"),
        cache=cache,
        from_profile=tuple(used),
    )


class Target(Protocol):
    """What `tuned` reads of a model's runtime (`ModelRuntime`)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def engine_lane(self) -> str: ...
    @property
    def engine_tag(self) -> str: ...


def tuned(
    target: Target,
    model: Model | None,
    profile: Profile | None,
    manifest: Manifest,
    held: Mapping[str, ModelRecord],
    store: Store,
) -> tuple[Tuning, str | None]:
    """(the model's tuning, why it cannot be served so) from its declaration, its profile
    (ignored when measured on another file), its draft's file and vocabulary, and the flags
    its engine takes."""
    settings = profile.settings if profile and profile.sha256 in ("", target.sha256) else None
    tuning = tuning_for(model, settings)
    problems = []
    if tuning.spec == "draft" and tuning.draft:
        key = manifest.resolve_model(tuning.draft) or tuning.draft
        record = held.get(parse_name(key).short)
        fix = f"choose another (`blazar drafts {target.name}` lists those that fit)"
        if record is None:
            problems.append(
                f"its draft model '{tuning.draft}' is not pulled: `blazar apply` fetches it"
            )
        elif (found := draft_problem(Path(target.path), Path(record.path))) is not None:
            problems.append(f"model '{tuning.draft}' cannot draft for it: {found}; {fix}")
        else:
            tuning = replace(tuning, draft_path=record.path)
    known = engine_flags(store, target.engine_lane, target.engine_tag)
    missing = [f for f in tuning.flag_names() if known is not None and f not in known]
    if missing:
        problems.append(
            f"engine {target.engine_tag} does not take {', '.join(missing)} (spec = "
            f"{tuning.spec!r}): `blazar engine update` installs one that does, or set "
            f"models.{target.name}.spec = 'off'"
        )
    return tuning, "; ".join(problems) or None


def with_tuning(
    runtime: Any,
    model: Model | None,
    profile: Profile | None,
    manifest: Manifest,
    held: Mapping[str, ModelRecord],
    store: Store,
) -> Any:
    """A `ModelRuntime` with its tuning (`tuned`): the profile's slots where the manifest
    sets none (one slot stays one when deterministic), its cache fields, and its problem
    added to the runtime's (a problem refuses the model before any spawn)."""
    tuning, problem = tuned(runtime, model, profile, manifest, held, store)
    from_profile = tuning.slots and "slots" in tuning.from_profile
    slots = tuning.slots if from_profile and not runtime.cache.deterministic else runtime.slots
    problems = [p for p in (runtime.settings_problem, problem) if p]
    return replace(
        runtime,
        tuning=tuning,
        slots=slots,
        cache=replace(runtime.cache, **dict(tuning.cache)),
        settings_problem="; ".join(problems) or None,
    )
