"""Engine operations behind `blazar engine ...` and `blazar bench`.

Installs go through the method modules (wheel, release, source, and a fork
lane's catalog offer: `blazar.engines.forks`); adopting a new engine runs the
regression gate against its lane's active one; every switch and bench figure
is recorded in the store. Lanes are independent: `update` of a fork lane builds
the commit its catalog offer pins now, gated against the fork's active engine.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.engines import wheel
from blazar.engines.base import KIND, InstalledEngine, processes_using
from blazar.engines.bench import GateVerdict, Workload, bench_engines, gate
from blazar.engines.catalog import Catalog, Offer, load_catalog
from blazar.engines.kinds import (
    KINDS,
    OPENAI_ONLY,
    PACKAGE_KINDS,
    SOURCE_KINDS,
    canonical_kind,
    unknown_kind,
)
from blazar.engines.lanes import ACTIVE, FORK, RETIRED, LaneRecord, LaneStore
from blazar.engines.ledger import BenchResult, EngineRecord, EngineStore
from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.paths import Paths
from blazar.store.db import Store, utcnow
from specs.names import parse_name

DEFAULT_GATE = 0.10
WHY_INACTIVE = " (the gate refused it or it was switched away from)"
# The speech lanes and the kind of model each serves (blazar.engines.audio).
AUDIO_LANES = {"whisper": "transcription", "piper": "speech"}
# What each lane's gate compares, when it is not decode tokens/s.
GATE_FIGURE = {
    "whisper": ("speed", "audio s/s"),
    "piper": ("speed", "audio s/s"),
    "sdcpp": ("speed", "images/s"),
}
Runner = Callable[..., Any]
SYNTHETIC_MODEL = "tiny (synthetic)"


class EngineInUse(BlazarError):
    pass


@dataclass(frozen=True)
class BenchModel:
    name: str
    path: Path
    sha256: str


@dataclass(frozen=True)
class UpdateOutcome:
    kind: str
    tag: str
    installed: bool  # a new engine was installed
    activated: bool
    message: str
    verdict: GateVerdict | None = None
    results: tuple[BenchResult, ...] = ()


class Engines:
    """Engine lifecycle on one host: install, adopt behind the gate, use, rollback, rm."""

    def __init__(self, store: Store, paths: Paths) -> None:
        self.store = store
        self.paths = paths
        self.records = EngineStore(store)
        self.lanes = LaneStore(store)

    def catalog(self, location: str | None = None) -> Catalog:
        """The catalog of fork lanes (`location`: a path or URL; None: the shipped one)."""
        return load_catalog(location, self.paths.cache)

    # -- installing -----------------------------------------------------------

    def resolve_version(self, method: str, version: str | None, **opts: str | None) -> str:
        if method == "wheel":
            return version or wheel.latest_version()
        if method == "release":
            from blazar.engines import release

            return (
                release.normalize_tag(version)
                if version
                else release.latest_version(feed=opts.get("feed"))
            )
        raise InvalidInput(
            f"`engine update` installs with wheel or release; for source use "
            f"`blazar engine build cpu|cuda`, not {method!r}"
        )

    def expected_tag(self, method: str, version: str) -> str:
        if method == "wheel":
            return wheel.tag_for_version(version)
        return f"{version}-cpu"

    def install(self, method: str, version: str, **opts: str | None) -> EngineRecord:
        installed: InstalledEngine
        if method == "wheel":
            cache = wheel.wheel_cache(self.paths.cache / "wheels")
            installed = wheel.install_wheel(self.paths.engines, cache, version)
        elif method == "release":
            from blazar.engines import release

            installed = release.install_release(
                self.paths.engines, self.paths.downloads, version=version, feed=opts.get("feed")
            )
        else:
            raise InvalidInput(f"unknown install method {method!r}: choose wheel or release")
        return self.records.add(installed)

    def install_audio(self, kind: str, version: str | None = None) -> EngineRecord:
        """Install a package engine (whisper: faster-whisper, piper: piper-tts, mistralrs:
        mistralrs) beside the lane's others; `version` None is the newest on the index."""
        from blazar.engines.audio import install_audio

        cache = wheel.wheel_cache(self.paths.cache / "wheels")
        return self.records.add(install_audio(self.paths.engines, cache, kind, version))

    def add_built(self, installed: InstalledEngine) -> EngineRecord:
        return self.records.add(installed)

    def install_fork(
        self,
        offer: Offer,
        backend: str = "cpu",
        *,
        jobs: int | None = None,
        log: Callable[[str], None] | None = None,
        runner: Runner | None = None,
    ) -> EngineRecord:
        """Build `offer` as an engine of its own lane and record what it supports."""
        import subprocess
        import tempfile

        from blazar.engines.forks import install_offer

        work = Path(tempfile.mkdtemp(prefix=f"fork-{offer.id}-", dir=self.paths.cache))
        try:
            installed = install_offer(
                offer,
                backend,
                self.paths.engines,
                work_dir=work,
                downloads=self.paths.downloads,
                jobs=jobs,
                log=log,
                runner=runner or subprocess.run,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record = self.records.add(installed)
        lane = self.lanes.get(offer.id)
        keep = lane.origin == FORK and lane.state != RETIRED  # a retiring fork stays retiring
        self.lanes.put(
            LaneRecord(
                lane=offer.id,
                kind=offer.kind,
                origin=FORK,
                state=lane.state if keep else ACTIVE,
                since=lane.since if keep else utcnow(),
                reason=lane.reason if keep else f"installed from the catalog offer {offer.id}",
                offer=offer.to_json(),
                architectures=offer.architectures,
            )
        )
        for arch in offer.architectures:
            self.lanes.record_support(offer.id, record.tag, arch, True, "catalog")
        return record

    # -- adopting -------------------------------------------------------------

    def adopt(
        self,
        candidate: EngineRecord,
        *,
        max_drop: float = DEFAULT_GATE,
        model: str | None = None,
        workload: Workload | None = None,
    ) -> UpdateOutcome:
        """Activate `candidate` if the lane has no active engine or it passes the gate."""
        active = self.records.active(candidate.kind)
        if active is None:
            self.records.activate(candidate.kind, candidate.tag, "first install")
            return UpdateOutcome(
                candidate.kind, candidate.tag, True, True, f"{candidate.tag} is now active"
            )
        if active.tag == candidate.tag:
            return UpdateOutcome(candidate.kind, candidate.tag, False, False, "already active")
        results = self.bench([active, candidate], model=model, workload=workload, note="gate")
        old, new = results
        what, unit = GATE_FIGURE.get(candidate.kind, ("decode", "tokens/s"))
        verdict = gate(old.decode_tps, new.decode_tps, max_drop, what, unit)
        if verdict.accept:
            self.records.activate(candidate.kind, candidate.tag, "update")
        return UpdateOutcome(
            candidate.kind,
            candidate.tag,
            True,
            verdict.accept,
            verdict.explain(active.tag, candidate.tag),
            verdict,
            tuple(results),
        )

    def update(
        self,
        kind: str = KIND,
        *,
        method: str | None = None,
        version: str | None = None,
        max_drop: float = DEFAULT_GATE,
        model: str | None = None,
        feed: str | None = None,
        progress: Callable[[str], None] = lambda _: None,
        catalog: str | None = None,
        runner: Runner | None = None,
        backend: str = "cpu",
    ) -> UpdateOutcome:
        kind = canonical_kind(kind) if canonical_kind(kind) in KINDS else kind
        lane = self.lanes.get(kind)
        if lane.origin == FORK:
            return self.update_fork(
                lane,
                max_drop=max_drop,
                model=model,
                catalog=catalog,
                progress=progress,
                runner=runner,
            )
        if kind in PACKAGE_KINDS:
            return self.update_audio(
                kind, version=version, max_drop=max_drop, model=model, progress=progress
            )
        if kind in SOURCE_KINDS:
            return self.update_sdcpp(
                version=version, max_drop=max_drop, model=model, progress=progress, backend=backend
            )
        if kind != KIND:
            forks = tuple(lane.lane for lane in self.lanes.all() if lane.origin == FORK)
            raise InvalidInput(unknown_kind(kind, forks))
        active = self.records.active(kind)
        method = method or (active.method if active else "wheel")
        version = self.resolve_version(method, version, feed=feed)
        tag = self.expected_tag(method, version)
        if (held := self._held(kind, tag, WHY_INACTIVE)) is not None:
            return held
        progress(f"installing {kind} {tag} ({method} {version}) ...")
        candidate = self.install(method, version, feed=feed)
        if active:
            progress(f"benchmarking {active.tag} against {tag} ...")
        return self.adopt(candidate, max_drop=max_drop, model=model)

    def _held(self, lane: str, tag: str, why: str = "") -> UpdateOutcome | None:
        """What `update` says when lane `lane` holds `tag` already (nothing to install):
        current when active, else how to activate it (`why` it may be inactive)."""
        try:
            existing = self.records.get(lane, tag)
        except NotFound:
            return None
        if existing.active:
            return UpdateOutcome(lane, tag, False, False, f"{tag} is current (active)")
        return UpdateOutcome(
            lane,
            tag,
            False,
            False,
            f"{tag} is already installed but inactive{why}: `blazar engine use {tag}` activates it",
        )

    def update_audio(
        self,
        kind: str,
        *,
        version: str | None = None,
        max_drop: float = DEFAULT_GATE,
        model: str | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ) -> UpdateOutcome:
        """Install the newest (or `version`) faster-whisper, piper-tts or mistralrs beside
        the lane's engines, behind the lane's gate (its speed on the fixed clip or
        sentence; mistralrs: decode tokens/s on the fixed prompt)."""
        from blazar.engines.audio import lane, latest_version

        package = lane(kind).package
        version = version or latest_version(kind)
        tag = lane(kind).tag(version)
        if (held := self._held(kind, tag)) is not None:
            return held
        active = self.records.active(kind)
        progress(f"installing {kind} {tag} ({package} {version}) ...")
        candidate = self.install_audio(kind, version)
        if active:
            progress(f"benchmarking {active.tag} against {tag} ...")
        return self.adopt(candidate, max_drop=max_drop, model=model)

    def install_sdcpp(
        self,
        version: str | None = None,
        *,
        backend: str = "cpu",
        log: Callable[[str], None] | None = None,
    ) -> EngineRecord:
        """Install sd-server (`backend` cpu or cuda) from the stable-diffusion-cpp-python
        sdist (`version`, default the one checked to vendor the server) beside the lane's
        engines, unactivated; `engine install --kind sdcpp` and apply's ports both call
        it. $BLAZAR_SDCPP_BUILT names an engines directory holding that build already (the
        tests' cache): it is copied, not built."""
        import os

        from blazar.engines import sdcpp

        built = os.environ.get("BLAZAR_SDCPP_BUILT")
        installed = sdcpp.install_sdcpp(
            self.paths.engines,
            self.paths.cache / "src",
            version or sdcpp.PINNED,
            built_root=Path(built) if built else None,
            backend=backend,
            log=log,
        )
        return self.records.add(installed)

    def update_sdcpp(
        self,
        *,
        version: str | None = None,
        max_drop: float = DEFAULT_GATE,
        model: str | None = None,
        progress: Callable[[str], None] = lambda _: None,
        backend: str = "cpu",
    ) -> UpdateOutcome:
        """Build sd-server (`backend` cpu or cuda) from the stable-diffusion-cpp-python sdist
        (`version`, default the one checked to vendor the server) beside the lane's engines,
        behind the lane's gate (images per second at 64x64, 1 step); `install_sdcpp`
        installs it."""
        from blazar.engines import sdcpp

        version = version or sdcpp.PINNED
        tag = sdcpp.engine_tag(version, backend)
        if (held := self._held(sdcpp.KIND, tag)) is not None:
            return held
        active = self.records.active(sdcpp.KIND)
        progress(f"installing {sdcpp.KIND} {tag} ({sdcpp.PACKAGE} {version}) ...")
        candidate = self.install_sdcpp(version, backend=backend, log=progress)
        if active:
            progress(f"benchmarking {active.tag} against {tag} ...")
        return self.adopt(candidate, max_drop=max_drop, model=model)

    def update_fork(
        self,
        lane: LaneRecord,
        *,
        max_drop: float = DEFAULT_GATE,
        model: str | None = None,
        catalog: str | None = None,
        progress: Callable[[str], None] = lambda _: None,
        runner: Runner | None = None,
    ) -> UpdateOutcome:
        """Build the commit the catalog pins for fork `lane` now, behind the lane's gate."""
        name = lane.lane
        if lane.state == RETIRED:
            return UpdateOutcome(name, "", False, False, f"skipped (retired: {lane.reason})")
        active = self.records.active(name)
        found = self.catalog(catalog).offers.get(name)
        if found is None:
            tag = active.tag if active else ""
            return UpdateOutcome(name, tag, False, False, "current (the catalog offers no update)")
        backend = str(active.details.get("backend", "cpu")) if active else "cpu"
        tag = found.tag(backend)
        if (held := self._held(name, tag)) is not None:
            return held
        progress(f"building fork {name} at {found.short} ({backend}) ...")
        candidate = self.install_fork(found, backend, log=progress, runner=runner)
        if active:
            progress(f"benchmarking {active.tag} against {tag} ...")
        return self.adopt(candidate, max_drop=max_drop, model=model)

    # -- switching ------------------------------------------------------------

    def use(self, tag: str) -> tuple[EngineRecord, EngineRecord | None]:
        record = self.records.find_tag(tag)
        self._check_present(record)
        previous = self.records.activate(record.kind, record.tag, "use")
        return record, previous

    def rollback(self, kind: str = KIND) -> tuple[EngineRecord, str]:
        active = self.records.active(kind)
        previous = self.records.previous_active(kind)
        if active is None or previous is None:
            raise NotFound(f"no earlier {kind} engine to roll back to: `blazar engine list`")
        try:
            record = self.records.get(kind, previous)
        except NotFound:
            raise NotFound(
                f"the previous engine {previous} was removed; `blazar engine use TAG` picks another"
            ) from None
        self._check_present(record)
        self.records.activate(kind, previous, "rollback")
        return record, active.tag

    def remove(self, tag: str) -> EngineRecord:
        """Remove one engine: never one a running process uses, nor a mainstream lane's
        active one (a fork's may go: its models then route elsewhere, or are refused)."""
        record = self.records.find_tag(tag)
        fork = self.lanes.get(record.kind).origin == FORK
        if record.active and not fork:
            raise EngineInUse(
                f"{record.tag} is the active {record.kind} engine; "
                "activate another first (`blazar engine use TAG` or `blazar engine rollback`)"
            )
        self._refuse_in_use(record)
        self.records.remove(record.kind, record.tag)
        self.lanes.forget_engine(record.kind, record.tag)
        shutil.rmtree(record.path, ignore_errors=True)
        alone = fork and not self.records.installed(record.kind)
        if alone and self.lanes.get(record.kind).state != RETIRED:  # a retired one stays
            self.lanes.drop(record.kind)
        return record

    def remove_lane(self, lane: str) -> list[EngineRecord]:
        """Remove every engine of a (retired) fork lane; refused while one is in use."""
        records = self.records.installed(lane)
        for record in records:
            self._refuse_in_use(record)
        for record in records:
            self.records.remove(record.kind, record.tag)
            self.lanes.forget_engine(record.kind, record.tag)
            shutil.rmtree(record.path, ignore_errors=True)
        return records

    @staticmethod
    def _refuse_in_use(record: EngineRecord) -> None:
        users = processes_using(Path(record.path))
        if users:
            pids = ", ".join(str(p) for p in users)
            raise EngineInUse(
                f"{record.tag} is in use by running instance(s) with pid {pids}; "
                "stop them first (`blazar stop MODEL`, or kill the pids)"
            )

    @staticmethod
    def _check_present(record: EngineRecord) -> None:
        if not Path(record.path).is_dir():
            raise NotFound(
                f"engine {record.tag}'s files are gone ({record.path}); "
                f"`blazar engine rm {record.tag}` forgets it"
            )

    # -- benchmarking ---------------------------------------------------------

    def bench_model(self, name: str | None, lane: str = KIND) -> BenchModel:
        """The named model, else the smallest model in the store that `lane` can load, else a
        synthetic tiny one."""
        serves = {**AUDIO_LANES, **SOURCE_KINDS}.get(lane, "chat")
        if name:
            record = self.store.get_model(parse_name(name))
            if record.kind != serves:
                raise InvalidInput(
                    f"model '{record.ref.short}' is a {record.kind} model; the {lane} lane "
                    f"is measured with a {serves} model"
                )
            return BenchModel(record.ref.short, Path(record.path), record.sha256)
        models = sorted(
            (m for m in self.store.list_models() if m.kind == serves), key=lambda r: r.size
        )
        if lane in SOURCE_KINDS:
            return models_or_tiny_image(models, self.paths.cache / "bench" / "tiny-image")
        if lane in AUDIO_LANES:
            if not models:
                pull = "blazar whisper --pull base" if lane == "whisper" else "blazar tts --pull"
                raise NotFound(
                    f"no {serves} model is held to measure the {lane} lane with: pull one "
                    f"(`{pull} ...`), or pass --bench-model"
                )
            return BenchModel(models[0].ref.short, Path(models[0].path), models[0].sha256)
        if self.lanes.get(lane).origin != FORK:  # not what mainstream cannot load
            active = self.records.active(lane)
            known = self.lanes.support(lane, active.tag) if active else {}
            forks = {a for f in self.lanes.all() if f.origin == FORK for a in f.architectures}
            models = [
                m
                for m in models
                if known.get(m.architecture or "") is not False
                and (m.architecture not in forks or known.get(m.architecture or ""))
            ]
        if models and lane not in OPENAI_ONLY:  # mistral.rs: the tiny llama, which it loads
            return BenchModel(models[0].ref.short, Path(models[0].path), models[0].sha256)
        from blazar.models.hashing import sha256_file
        from blazar.testing.tiny import write_tiny_model

        path = self.paths.cache / "bench" / "tiny.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_tiny_model(path)
        return BenchModel(SYNTHETIC_MODEL, path, sha256_file(path)[0])

    def bench(
        self,
        engines: list[EngineRecord],
        *,
        model: str | None = None,
        workload: Workload | None = None,
        note: str = "bench",
        extra_args: Sequence[str] = (),
        spec: str = "off",
    ) -> list[BenchResult]:
        for engine in engines:
            self._check_present(engine)
        chosen = self.bench_model(model, engines[0].kind if engines else KIND)
        if engines and engines[0].kind in SOURCE_KINDS:
            from blazar.engines.sd_bench import bench_sd

            found = bench_sd(
                engines, chosen.path, chosen.name, chosen.sha256, self.paths.logs, note=note
            )
            for result in found:
                self.records.record_bench(result)
            return found
        if engines and engines[0].kind in AUDIO_LANES:
            from blazar.engines.audio_bench import bench_audio

            found = bench_audio(
                engines, chosen.path, chosen.name, chosen.sha256, self.paths.logs, note=note
            )
            for result in found:
                self.records.record_bench(result)
            return found
        results = bench_engines(
            engines,
            chosen.path,
            chosen.name,
            chosen.sha256,
            self.paths.logs,
            workload=workload,
            note=note,
            extra_args=extra_args,
            spec=spec,
        )
        for result in results:
            self.records.record_bench(result)
        return results


def models_or_tiny_image(models: Sequence[Any], directory: Path) -> BenchModel:
    """The smallest image model held, else the tests' tiny one written into `directory`
    (`blazar.testing.tiny_sd`: 28 MB, a few seconds an image on two cores)."""
    if models:
        return BenchModel(models[0].ref.short, Path(models[0].path), models[0].sha256)
    from blazar.models.filesets import set_digest
    from blazar.models.hashing import sha256_file
    from blazar.testing.tiny_sd import PARTS, write_tiny_image_model

    if not all((directory / part).is_file() for part in PARTS):
        write_tiny_image_model(directory)
    digest = set_digest({part: sha256_file(directory / part)[0] for part in PARTS})
    return BenchModel("tiny image (synthetic)", directory, digest)
