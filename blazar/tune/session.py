"""One `blazar tune MODEL`: plan its stages, measure them, decide, record the profile.

The model is served the way `blazar serve` would serve it now (`build_runtimes`: the
manifest over the model's current profile); each candidate changes only what it stands
for, and its argv is the one serve would give a child with those settings
(`ModelRuntime.args`). The manifest's pins do not hold back the measurement (racing
draft decoding when `spec = "off"` is pinned still measures it); they hold back what the
profile changes at the next spawn, and the report says so. After the last stage the
settings every stage kept or adopted become the model's profile (`blazar.store.profiles`),
unless it was a dry run or `record` is off.

`blazar.cli.tune` calls `Tuner(...).plan()` for `--dry-run` and `.run()` otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from blazar.engines.probe import ensure_flags
from blazar.errors import InvalidInput, NotFound
from blazar.host.hardware import memory_devices
from blazar.launch.tuning import tuned
from blazar.models.fit import estimate
from blazar.paths import Paths
from blazar.serve.supervisor.build import build_runtimes
from blazar.serve.supervisor.runtime import ModelRuntime, default_threads, resolve
from blazar.store.db import Store
from blazar.store.profiles import SETTINGS, Profile, ProfileStore
from blazar.tune.measure import Job, completion, measure
from blazar.tune.plan import FIGURE, Options, Stage, stage_plan
from blazar.tune.race import Decision, Figures, decide
from blazar.tune.workloads import load_workload
from specs.manifest import Manifest
from specs.models import Model
from specs.names import parse_name


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    argv: dict[str, tuple[str, ...]]  # label -> the child's arguments
    figures: tuple[Figures, ...] = ()
    decision: Decision | None = None


@dataclass(frozen=True)
class TuneReport:
    model: str
    engine: str
    stages: tuple[StageResult, ...]
    settings: dict[str, Any]  # the profile recorded (or, on a dry run, the current one)
    recorded: bool
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "engine": self.engine,
            "recorded": self.recorded,
            "profile": self.settings,
            "notes": list(self.notes),
            "stages": [
                {
                    "stage": r.stage.name,
                    "workload": r.stage.workload,
                    "candidates": [
                        {
                            "label": c.label,
                            "settings": c.settings,
                            "baseline": c.baseline,
                            "skipped": c.skip,
                            "argv": list(r.argv.get(c.label, ())),
                        }
                        for c in r.stage.candidates
                    ],
                    "figures": [{**asdict(f), "median": f.median} for f in r.figures],
                    "decision": asdict(r.decision) if r.decision else None,
                }
                for r in self.stages
            ],
        }


class Tuner:
    """Tune one model: `plan()` lists the runs, `run()` makes them."""

    def __init__(
        self, store: Store, paths: Paths, manifest: Manifest, name: str, options: Options
    ) -> None:
        self.store, self.paths, self.manifest, self.options = store, paths, manifest, options
        ensure_flags(store)  # what the engine takes: a candidate it cannot run is skipped
        try:
            self.runtime, _ = resolve(build_runtimes(store, manifest), name)
        except KeyError:
            raise NotFound(
                f"model '{name}' is not held with an engine to run it: `blazar pull` it (or "
                "declare it and `blazar apply`), then tune"
            ) from None
        if self.runtime.kind != "chat" or self.runtime.refusal:
            why = self.runtime.refusal or f"it is a {self.runtime.kind} model"
            raise InvalidInput(f"model '{name}' cannot be tuned: {why}")
        self.model: Model | None = manifest.declared_model(self.runtime.name)
        self.held = {r.ref.short: r for r in store.list_models()}
        profile = ProfileStore(store).current(self.runtime.name, self.runtime.sha256)
        self.base: dict[str, Any] = dict(profile.settings) if profile else {}
        declared = self.model.draft if self.model else None
        named = [declared, *options.drafts] if declared else list(options.drafts)
        self.drafts = tuple(dict.fromkeys(self._short(d) for d in named))

    def _short(self, name: str) -> str:
        return parse_name(self.manifest.resolve_model(name) or name).short

    @property
    def engine(self) -> str:
        return f"{self.runtime.engine_lane} {self.runtime.engine_tag}"

    def runtime_for(self, settings: dict[str, Any]) -> tuple[ModelRuntime, str | None]:
        """The runtime serve would build with these settings over the base ones (the
        manifest's pins lifted for them), and why it cannot run, if it cannot."""
        merged = {**self.base, **settings}
        model = self.model
        if model is not None:
            lifted = {k: None for k in merged if k in Model.model_fields}
            model = model.model_copy(update=lifted)
        profile = Profile(self.runtime.name, self.runtime.sha256, merged)
        tuning, problem = tuned(self.runtime, model, profile, self.manifest, self.held, self.store)
        slots = self.options.slots or (
            tuning.slots if "slots" in tuning.from_profile else self.runtime.slots
        )
        runtime = replace(
            self.runtime,
            tuning=tuning,
            slots=slots or 1,
            cache=replace(self.runtime.cache, **dict(tuning.cache)),
        )
        return runtime, problem or self._fit_problem(runtime)

    def _fit_problem(self, runtime: ModelRuntime) -> str | None:
        facts = {**runtime.facts, "size": runtime.facts.get("size") or 0}
        report = estimate(
            runtime.name,
            facts,
            memory_devices(),
            ctx=runtime.ctx * runtime.slots,
            cache_type=runtime.cache.kv_type,
        )
        if report.fits:
            return None
        gib = 1024**3
        return (
            f"does not fit: needs {report.needed / gib:.1f} GiB, {report.available / gib:.1f} free"
        )

    def _stage(self, name: str, base: dict[str, Any]) -> StageResult:
        threads = self.runtime.tuning.threads or default_threads()
        current = {"slots": self.runtime.slots, "threads": threads, **base}
        stage = stage_plan(
            name,
            self.options,
            base,
            drafts=self.drafts,
            cores=max(1, default_threads() * 2),
            current=current,
            problem=lambda s: self.runtime_for(s)[1],
        )
        argv = {
            c.label: self.runtime_for(c.settings)[0].args()
            for c in stage.candidates
            if c.skip is None
        }
        return StageResult(stage, argv)

    def plan(self) -> TuneReport:
        """The stages and the runs each would make, from the current settings; nothing runs."""
        stages = tuple(self._stage(s, dict(self.base)) for s in self.options.stages)
        return TuneReport(
            self.runtime.name,
            self.engine,
            stages,
            dict(self.base),
            False,
            self._pin_notes(self.base),
        )

    def run(
        self,
        progress: Callable[[str, str], None] = lambda stage, label: None,
        *,
        record: bool = True,
    ) -> TuneReport:
        """Measure every stage, each from what the ones before adopted; record the result."""
        base, results = dict(self.base), []
        for name in self.options.stages:
            result = self._stage(name, base)
            stage = result.stage
            workload = load_workload(stage.workload).limited(
                self.options.requests, self.options.tokens
            )
            jobs = [
                Job(c.label, self.runtime.command, result.argv[c.label], c.settings)
                for c in stage.candidates
                if c.skip is None
            ]
            if len(jobs) < 2 or stage.candidates[0].skip is not None:  # nothing to race
                results.append(result)
                continue
            send = completion(workload.predict, workload.cache_prompt, time.perf_counter)
            step = functools.partial(progress, name)
            found = asyncio.run(
                measure(
                    jobs,
                    workload.prompts,
                    send,
                    runs=self.options.runs,
                    replicas=self.options.replicas,
                    load=self.options.load,
                    log_dir=self.paths.logs,
                    progress=step,
                    figure=FIGURE[name],
                )
            )
            decision = decide(found, stage.candidates[0].label, self.options.threshold)
            kept = next(c for c in stage.candidates if c.label == decision.winner)
            base.update(kept.settings)
            results.append(replace(result, figures=tuple(found), decision=decision))
        settings = {k: v for k, v in base.items() if k in SETTINGS}
        if record:
            last = results[-1]
            label = last.decision.winner if last.decision else last.stage.candidates[0].label
            ProfileStore(self.store).record(
                Profile(
                    self.runtime.name,
                    self.runtime.sha256,
                    settings,
                    engine=self.engine,
                    figures=TuneReport(
                        self.runtime.name, self.engine, tuple(results), settings, True
                    ).to_json()["stages"],
                    argv=list(last.argv.get(label, ())),
                    workload=last.stage.workload,
                    note=",".join(self.options.stages),
                )
            )
        return TuneReport(
            self.runtime.name,
            self.engine,
            tuple(results),
            settings,
            record,
            self._pin_notes(settings),
        )

    def _pin_notes(self, settings: dict[str, Any]) -> tuple[str, ...]:
        """For each profile setting the manifest pins: that the pin wins at the next spawn."""
        if self.model is None:
            return ()
        where = f"models.{self.runtime.name}"
        notes = []
        for key, value in settings.items():
            pinned = getattr(self.model, key, None)
            if pinned is not None and pinned != "auto" and pinned != value:
                notes.append(
                    f"{where}.{key} = {pinned!r} pins it: the profile's {value!r} is used once "
                    f"you remove it{' (or set it to auto)' if key == 'spec' else ''}"
                )
        return tuple(notes)
