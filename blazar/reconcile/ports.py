"""Real ports for the reconcilers: the store, the registry, engine lanes and model sources.

Domain errors are classified here: network trouble becomes a TemporaryError
(retried within an apply), everything else Blazar reports (a wrong checksum,
a missing file, a bad adapter) a PermanentError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blazar.engines.ledger import EngineStore
from blazar.errors import BlazarError
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.store.db import KeyRecord, Store
from reconcilers.desired import DesiredLora, DesiredModel, DesiredProjector
from reconcilers.errors import PermanentError, TemporaryError
from reconcilers.ports import (
    ObservedEngine,
    ObservedKey,
    ObservedLane,
    ObservedLora,
    ObservedModel,
    ObservedProjector,
    OfferView,
    Ports,
    Progress,
)
from specs.engines import PACKAGE_ENGINES, SOURCE_ENGINES
from specs.models import AUTO_PROJECTOR
from specs.names import parse_name
from specs.sources import parse_source

if TYPE_CHECKING:  # blazar.sources pulls in huggingface_hub: load it only when fetching
    from blazar.engines.service import Engines
    from blazar.sources import Fetched


@contextlib.contextmanager
def fetched_bytes(
    source: str,
    sha256: str | None,
    downloads: Path,
    progress: Progress | None,
    kind: str = "chat",
) -> Iterator[Fetched]:
    """Fetch and verify a source's bytes; delete Blazar's own download once the block is done
    (the registry hardlinks what it keeps)."""
    from blazar.sources import fetch

    fetched = fetch(
        parse_source(source), sha256=sha256, downloads=downloads, progress=progress, kind=kind
    )
    try:
        yield fetched
    finally:
        if fetched.temporary:
            for path in fetched.files:
                path.unlink(missing_ok=True)
            if staging := fetched.detail.get("staging"):  # a set assembled in the downloads
                import shutil

                shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def classified() -> Iterator[None]:
    """Turn Blazar's errors into the reconcilers' retry semantics."""
    from blazar.engines.download import DownloadError
    from blazar.sources import TemporaryFetchError

    try:
        yield
    except (TemporaryFetchError, DownloadError) as exc:
        raise TemporaryError(str(exc)) from exc
    except BlazarError as exc:
        raise PermanentError(str(exc)) from exc


class StoreEngines:
    def __init__(self, store: Store, paths: Paths) -> None:
        self.store = store
        self.records = EngineStore(store)
        self.paths = paths

    @cached_property
    def service(self) -> Engines:
        """The engine service (installers, bench): imported only when installing."""
        from blazar.engines.service import Engines

        return Engines(self.store, self.paths)

    def observe(self) -> list[ObservedEngine]:
        return [
            ObservedEngine(r.kind, r.tag, r.method, r.version, r.active)
            for r in self.records.installed()
        ]

    def expected_tag(self, method: str, version: str, backend: str) -> str:
        if method == "wheel":
            from blazar.engines.wheel import tag_for_version

            return tag_for_version(version)
        from blazar.engines.release import normalize_tag

        return f"{normalize_tag(version)}-{backend}"

    def install(self, kind: str, method: str, version: str | None, options: dict[str, Any]) -> str:
        with classified():
            if kind in SOURCE_ENGINES:  # sdcpp: sd-server from its sdist, as engine install
                backend = str(options.get("backend") or "cpu")
                return self.service.install_sdcpp(version, backend=backend).tag
            if method == "source":
                import tempfile

                from blazar.engines.source import build_source

                work = Path(tempfile.mkdtemp(prefix="build-", dir=self.paths.cache))
                spec = options.get("source") or "https://github.com/ggml-org/llama.cpp"
                built = build_source(
                    self.paths.engines, spec, options.get("backend", "cpu"), work_dir=work
                )
                return self.records.add(built).tag
            if kind in PACKAGE_ENGINES:  # whisper, piper, mistralrs: their package from PyPI
                return self.service.install_audio(kind, version).tag
            feed = options.get("feed")
            version = version or self.service.resolve_version(method, None, feed=feed)
            return self.service.install(method, version, feed=feed).tag

    def activate(self, kind: str, tag: str) -> None:
        self.records.activate(kind, tag, "apply")

    def lanes(self, architectures: set[str]) -> list[ObservedLane]:
        from blazar.engines import lanes
        from blazar.engines.probe import ensure_probed

        forks = {a for lane in lanes.LaneStore(self.store).all() for a in lane.architectures}
        ensure_probed(self.store, self.paths, architectures | forks)
        return lanes.observe(self.store, self.paths.engines)

    def offers(self, catalog: str | None) -> list[OfferView]:
        from blazar.engines.catalog import CatalogError, load_catalog

        try:
            found = load_catalog(catalog, self.paths.cache)
        except CatalogError:
            return []  # the plan still shows the refusal; `blazar engine offers` says why
        return [offer_view(o) for o in found.offers.values()]

    def install_fork(self, lane: str, backend: str, catalog: str | None) -> str:
        with classified():
            offer = self.service.catalog(catalog).get(lane)
            return self.service.install_fork(offer, backend).tag

    def set_lane_state(self, lane: str, state: str, reason: str, since: str) -> None:
        from blazar.engines.lanes import LaneStore

        LaneStore(self.store).set_state(lane, state, reason, since)

    def remove_lane(self, lane: str) -> None:
        with classified():
            self.service.remove_lane(lane)


def offer_view(offer: Any) -> OfferView:
    """An `blazar.engines.catalog.Offer` as the reconcilers see it."""
    return OfferView(offer.id, offer.kind, tuple(offer.architectures), offer.commit)


class HeldFiles:
    """What the ports of held files (models, adapters, projectors) share: the registry they
    import into, the downloads directory, and `pins`: source -> the source to fetch
    instead (`apply --locked`: a Hugging Face source at the revision the lock resolved);
    the declared source is what is recorded."""

    def __init__(
        self, registry: Registry, paths: Paths, pins: dict[str, str] | None = None
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.paths = paths
        self.pins = pins or {}

    @contextlib.contextmanager
    def fetched(
        self, source: str, sha256: str | None, progress: Progress | None, kind: str = "chat"
    ) -> Iterator[Fetched]:
        """The bytes of `source` (or of its pin), fetched and verified; Blazar's errors in
        the block classified for the retries."""
        fetch = self.pins.get(source, source)
        downloads = self.paths.downloads
        with classified(), fetched_bytes(fetch, sha256, downloads, progress, kind) as got:
            yield got


class StoreModels(HeldFiles):
    def observe(self) -> list[ObservedModel]:
        # A record whose file is gone is a model the host does not have: the plan fetches
        # it again (level-triggered; `blazar doctor` names `blazar apply` as the fix).
        owners = self.store.owners("model")
        return [
            ObservedModel(
                r.ref.short,
                r.sha256,
                r.source,
                r.size,
                r.managed,
                r.settings,
                r.architecture,
                owners.get(r.ref.short),
            )
            for r in self.store.list_models()
            if Path(r.path).is_file() or (r.is_set and Path(r.path).is_dir())
        ]

    def fetch(self, declared: DesiredModel, progress: Progress | None) -> None:
        kind = str(declared.settings.get("kind") or "chat")
        sha256 = declared.sha256
        held_set = self.paths.blobs / f"sha256-{sha256}.set" if sha256 else None
        if held_set is not None and held_set.is_dir():  # a set (a safetensors model too)
            files = sorted(f for f in held_set.rglob("*") if f.is_file())
            names = [str(f.relative_to(held_set)) for f in files]
            with classified():  # the same set is held already: verified and recorded again
                self._import_set(declared, kind, files, names)
            return
        held = self.paths.blobs / f"sha256-{sha256}" if sha256 else None
        if held is not None and held.is_file():
            # The same bytes are held already (another name for them, a model `blazar
            # create` derived): verified and linked again, nothing is fetched.
            with classified():
                self.registry.import_file(
                    held,
                    parse_name(declared.name),
                    force=True,
                    source=declared.source,
                    managed=True,
                    settings=declared.settings,
                    sha256=sha256,
                )
            return
        with self.fetched(declared.source, sha256, progress, kind) as got:
            if got.names or kind != "chat":  # a set of files: a transcription model, a voice
                names = list(got.names) or [f.name for f in got.files]
                self._import_set(declared, kind, got.files, names, got.hashes or None)
                return
            shards = got.detail.get("shards")
            self.registry.import_files(
                got.files,
                parse_name(declared.name),
                force=True,
                source=declared.source,
                managed=True,
                settings=declared.settings,
                names=[n.rsplit("/", 1)[-1] for n in shards.split(",")] if shards else None,
                resolved=got.detail,
            )

    def _import_set(
        self,
        declared: DesiredModel,
        kind: str,
        files: list[Path],
        names: list[str],
        hashes: dict[str, str] | None = None,
    ) -> None:
        """Register a set of files (held already, or just fetched) as the declared model."""
        self.registry.import_set(
            files,
            names,
            parse_name(declared.name),
            kind=kind,
            force=True,
            source=declared.source,
            managed=True,
            settings=declared.settings,
            sha256=declared.sha256,
            hashes=hashes,
        )

    def record(self, declared: DesiredModel) -> None:
        with classified():
            self.registry.adopt(parse_name(declared.name), declared.source, declared.settings)

    def remove(self, name: str) -> None:
        with classified():
            self.registry.remove(parse_name(name))


class StoreLoras(HeldFiles):
    def observe(self) -> list[ObservedLora]:
        owners = self.store.owners("lora")
        return [
            ObservedLora(
                r.name, r.model, r.sha256, r.source, r.managed, r.settings, owners.get(r.name)
            )
            for r in self.store.list_loras()
        ]

    def fetch(self, declared: DesiredLora, progress: Progress | None) -> None:
        with self.fetched(declared.source, declared.sha256, progress) as got:
            self.registry.import_lora(
                got.files[0],
                declared.name,
                parse_name(declared.model),
                source=declared.source,
                settings=declared.settings,
            )

    def record(self, declared: DesiredLora) -> None:
        from dataclasses import replace

        record = self.store.find_lora(declared.name)
        if record is None:
            raise PermanentError(f"lora {declared.name!r} is not in the store")
        taken = replace(
            record, source=declared.source, settings=dict(declared.settings), managed=True
        )
        self.store.put_lora(taken)

    def remove(self, name: str) -> None:
        self.registry.remove_lora(name)


class StoreProjectors(HeldFiles):
    """Vision projectors (`models.NAME.mmproj`): fetched like a model file, checked to be a
    projector made for the model (`blazar.sources.projectors`)."""

    def observe(self) -> list[ObservedProjector]:
        owners = self.store.owners("projector")
        return [
            ObservedProjector(
                r.model, r.sha256, r.source, r.managed, r.settings, owners.get(r.model)
            )
            for r in self.store.list_projectors()
            if Path(r.path).is_file()
        ]

    def fetch(self, declared: DesiredProjector, progress: Progress | None) -> None:
        from blazar.sources import projectors
        from blazar.sources.projector_files import PROJECTOR

        source = declared.source
        with classified():
            if source == AUTO_PROJECTOR:
                model_source = str(declared.settings.get("model_source", ""))
                source = str(projectors.auto_source(model_source))
        with self.fetched(source, declared.sha256, progress, PROJECTOR) as got:
            projectors.import_projector(
                self.registry,
                got.files[0],
                parse_name(declared.model),
                source=declared.source,
                settings=declared.settings,
                resolved=got.detail,
            )

    def record(self, declared: DesiredProjector) -> None:
        from blazar.sources import projectors

        with classified():
            projectors.adopt_projector(
                self.registry, declared.model, declared.source, declared.settings
            )

    def remove(self, model: str) -> None:
        from blazar.sources import projectors

        projectors.remove_projector(self.registry, model)


class StoreKeys:
    def __init__(self, store: Store) -> None:
        self.store = store

    def observe(self) -> list[ObservedKey]:
        owners = self.store.owners("key")
        return [
            ObservedKey(k.name, k.sha256, k.models, k.managed, owners.get(k.name))
            for k in self.store.list_keys()
        ]

    def put(self, name: str, sha256: str, models: tuple[str, ...]) -> None:
        self.store.put_key(KeyRecord(name, sha256, models))

    def remove(self, name: str) -> None:
        self.store.delete_key(name)


class StoreStatus:
    def __init__(self, store: Store) -> None:
        self.store = store

    def set_condition(self, kind: str, name: str, ready: bool, reason: str, message: str) -> None:
        self.store.set_condition(kind, name, "Ready", str(ready), reason, message)


def real_ports(store: Store, paths: Paths, pins: dict[str, str] | None = None) -> Ports:
    """The ports an apply uses; `pins` maps declared sources to what to fetch instead."""
    registry = Registry(store, paths)
    return Ports(
        engines=StoreEngines(store, paths),
        models=StoreModels(registry, paths, pins),
        loras=StoreLoras(registry, paths, pins),
        keys=StoreKeys(store),
        status=StoreStatus(store),
        projectors=StoreProjectors(registry, paths, pins),
    )
