"""`blazar.lock`: what a manifest resolved to on a host, written by `apply`, meant to be committed.

`blazar apply` writes it next to the manifest (`lock_path`: in a manifest
directory, or beside a manifest file); `apply --locked` installs exactly what
it says and refuses, before changing anything, a manifest that resolves
differently (`refusals`); `blazar diff` reports drift between the manifest, the
lock and the host (`drift`). docs/fleet.md has the loop.

One lock serves every host of a manifest directory: its entries are keyed by
what was asked (a model's name and source, an engine's name, install method,
backend and declared version), so hosts whose overlays ask differently each
find their own entry, and an apply keeps the entries some other view of the
directory (the base, or a `hosts/NAME` overlay) still asks for (`merged`).
Each entry says what that resolved to: for models and adapters the file's
sha256 and size, the file names, and for Hugging Face the repository, the
exact revision and the download URL; for engines the exact version, the tag
and the artifact's digest. The text is TOML in a stable order.

The functions that compare are pure; reading the host (`held`) and the file
(`read_lock`, `write_lock`) are the edges. `blazar.reconcile.apply` and the CLI call
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blazar.engines.ledger import EngineRecord
from blazar.errors import InvalidInput
from blazar.store.db import LoraRecord, ModelRecord
from reconcilers.desired import LATEST, Desired, DesiredEngine, DesiredLora, DesiredModel
from specs.sources import HFSource, InvalidSource, parse_source

LOCK_NAME = "blazar.lock"
HEADER = (
    "# blazar.lock: what `blazar apply` resolved (commit it). `blazar apply --locked`\n"
    "# installs exactly this and refuses a manifest that resolves differently.\n"
)


@dataclass(frozen=True)
class Locked:
    """One resolved resource: `kind` (engine, model, lora), `name`, what was asked (`asked`:
    the key an entry is found by) and what it resolved to (`resolved`)."""

    kind: str
    name: str
    asked: tuple[tuple[str, str], ...]
    resolved: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def address(self) -> str:
        return f"{self.kind}s.{self.name}"

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.kind, self.name, self.asked)

    def get(self, name: str) -> Any:
        return self.resolved.get(name)


@dataclass(frozen=True)
class Lock:
    entries: tuple[Locked, ...] = ()

    def find(self, key: tuple[str, str, tuple[tuple[str, str], ...]]) -> Locked | None:
        return next((e for e in self.entries if e.key == key), None)

    def named(self, kind: str, name: str) -> list[Locked]:
        return [e for e in self.entries if e.kind == kind and e.name == name]


# -- what a manifest asks -------------------------------------------------------------


def engine_asked(engine: DesiredEngine) -> tuple[tuple[str, str], ...]:
    if engine.fork:
        return (("lane", engine.lane_name),)
    return (("install", engine.method), ("backend", engine.backend), ("declared", engine.version))


def model_asked(resource: DesiredModel | DesiredLora) -> tuple[tuple[str, str], ...]:
    return (("source", resource.source),)


def keys_of(desired: Desired) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """The keys of every entry `desired` needs from a lock."""
    found = {("engine", e.name, engine_asked(e)) for e in desired.engines}
    found |= {("model", m.name, model_asked(m)) for m in desired.models}
    found |= {("lora", lo.name, model_asked(lo)) for lo in desired.loras}
    return found


# -- comparing (pure) -----------------------------------------------------------------


def refusals(lock: Lock, desired: Desired) -> list[str]:
    """Why `apply --locked` must refuse `desired` (empty: the lock covers it exactly):
    a resource the lock has no entry for what it asks, or a sha256 the manifest declares
    that the lock's bytes do not have."""
    out = []
    for kind, name, asked in sorted(keys_of(desired)):
        entry = lock.find((kind, name, asked))
        if entry is None:
            others = lock.named(kind, name)
            locked = "; ".join(_asked_text(o.asked) for o in others) or "nothing"
            out.append(
                f"{kind}s.{name}: the manifest asks {_asked_text(asked)}, but the lock has "
                f"{locked} for it"
            )
    for resource, kind in _files(desired):
        entry = lock.find((kind, resource.name, model_asked(resource)))
        if entry is not None and resource.sha256 and resource.sha256 != entry.get("sha256"):
            out.append(
                f"{kind}s.{resource.name}: the manifest asks sha256 {resource.sha256}, the lock "
                f"has {entry.get('sha256')}"
            )
    return out


def _files(desired: Desired) -> list[tuple[DesiredModel | DesiredLora, str]]:
    """The models and adapters `desired` asks for, with their kind."""
    found: list[tuple[DesiredModel | DesiredLora, str]] = [(m, "model") for m in desired.models]
    return found + [(lo, "lora") for lo in desired.loras]


def _asked_text(asked: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in asked)


def locked_desired(desired: Desired, lock: Lock) -> Desired:
    """`desired` as the lock resolved it: each engine at its locked version, each model
    and adapter expecting its locked sha256 (a download of other bytes keeps nothing)."""
    engines = []
    for engine in desired.engines:
        entry = lock.find(("engine", engine.name, engine_asked(engine)))
        version = entry.get("version") if entry is not None else None
        if not engine.fork and engine.version == LATEST and isinstance(version, str):
            engine = replace(engine, version=version)
        engines.append(engine)

    def pinned(resource: Any, kind: str) -> Any:
        entry = lock.find((kind, resource.name, model_asked(resource)))
        sha = entry.get("sha256") if entry is not None else None
        return replace(resource, sha256=sha) if isinstance(sha, str) and sha else resource

    return replace(
        desired,
        engines=tuple(engines),
        models=tuple(pinned(m, "model") for m in desired.models),
        loras=tuple(pinned(lo, "lora") for lo in desired.loras),
    )


def fetch_pins(desired: Desired, lock: Lock) -> dict[str, str]:
    """Source -> the source to fetch under `--locked`: a Hugging Face source at the
    revision the lock resolved (the declared source is still what is recorded)."""
    pins = {}
    for resource, kind in _files(desired):
        entry = lock.find((kind, resource.name, model_asked(resource)))
        revision = entry.get("revision") if entry is not None else None
        if not isinstance(revision, str) or not revision:
            continue
        try:
            parsed = parse_source(resource.source)
        except InvalidSource:
            continue
        if isinstance(parsed, HFSource):
            pins[resource.source] = str(replace(parsed, revision=revision))
    return pins


def merged(new: Lock, old: Lock | None, views: Sequence[Desired]) -> Lock:
    """The lock to write: `new` (this host's entries), and the entries of `old` that
    another view of the manifest (the base, another host's overlay) still asks for."""
    wanted: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    for view in views:
        wanted |= keys_of(view)
    entries = {e.key: e for e in (old.entries if old else ()) if e.key in wanted}
    entries.update({e.key: e for e in new.entries})
    return Lock(tuple(sorted(entries.values(), key=_order)))


def _order(entry: Locked) -> tuple[int, str, tuple[tuple[str, str], ...]]:
    return (("engine", "model", "lora").index(entry.kind), entry.name, entry.asked)


def drift(desired: Desired, lock: Lock | None, host: Lock, views: Sequence[Desired]) -> list[str]:
    """Where the manifest, the lock and the host disagree, one line each (pure): what the
    lock lacks or resolves differently, what the host holds that the lock does not say,
    and entries no view of the manifest asks for any more."""
    if lock is None:
        return []
    lines = [f"manifest vs lock: {r}" for r in refusals(lock, desired)]
    for entry in host.entries:
        locked = lock.find(entry.key)
        if locked is None:
            continue
        for fact in ("sha256", "version", "tag"):
            want, have = locked.get(fact), entry.get(fact)
            if want and have and want != have:
                lines.append(
                    f"lock vs host: {entry.address}: the lock has {fact} {want}, the host "
                    f"holds {have}"
                )
    wanted: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    for view in views:
        wanted |= keys_of(view)
    for entry in lock.entries:
        if entry.key not in wanted:
            lines.append(
                f"lock: {entry.address} ({_asked_text(entry.asked)}) is asked for by no view "
                "of the manifest; the next apply drops it"
            )
    return lines


# -- reading the host -----------------------------------------------------------------


def held(
    desired: Desired,
    models: Sequence[ModelRecord],
    loras: Sequence[LoraRecord],
    engines: Sequence[EngineRecord],
) -> Lock:
    """The entries the host's records give for what `desired` asks (what it holds now)."""
    entries: list[Locked] = []
    by_model = {m.ref.short: m for m in models}
    for engine in desired.engines:
        record = _engine_record(engine, engines)
        if record is None:
            continue
        resolved: dict[str, Any] = {"version": record.version, "tag": record.tag}
        digest = record.details.get("sha256")
        if digest:
            resolved["digest"] = f"sha256:{digest}"
        for extra in ("wheel", "asset", "source", "commit"):
            if record.details.get(extra):
                resolved[extra] = str(record.details[extra])
        entries.append(Locked("engine", engine.name, engine_asked(engine), resolved))
    for model in desired.models:
        found = by_model.get(model.name)
        if found is None or found.source != model.source:
            continue
        entries.append(Locked("model", model.name, model_asked(model), model_facts(found)))
    by_lora = {lo.name: lo for lo in loras}
    for lora in desired.loras:
        got = by_lora.get(lora.name)
        if got is None or got.source != lora.source:
            continue
        facts = {"sha256": got.sha256, "size": got.size, "files": [Path(got.path).name]}
        entries.append(Locked("lora", lora.name, model_asked(lora), facts))
    return Lock(tuple(sorted(entries, key=_order)))


def _engine_record(engine: DesiredEngine, records: Sequence[EngineRecord]) -> EngineRecord | None:
    """The active engine of the lane, when it is what the manifest asks (its method, and
    its version when pinned)."""
    for record in records:
        if not record.active:
            continue
        if engine.fork:
            if record.kind == engine.lane_name:
                return record
            continue
        if record.kind != engine.kind or record.method != engine.method:
            continue
        if engine.version in (LATEST, record.version) or record.tag.startswith(engine.version):
            return record
    return None


def model_facts(record: ModelRecord) -> dict[str, Any]:
    """What a held model resolved to: sha256, size, file names, and where it came from."""
    facts: dict[str, Any] = {"sha256": record.sha256, "size": record.size}
    shards = record.facts.get("shards")
    facts["files"] = list(shards) if isinstance(shards, list) else [Path(record.path).name]
    origin = record.facts.get("resolved")
    if isinstance(origin, dict):
        repo, revision = origin.get("repo"), origin.get("revision")
        if repo and revision:
            facts["repo"], facts["revision"] = repo, revision
            endpoint = str(origin.get("endpoint") or "https://huggingface.co").rstrip("/")
            facts["url"] = f"{endpoint}/{repo}/resolve/{revision}/{origin.get('filename', '')}"
            files = origin.get("shards") or origin.get("filename")
            if files:
                facts["files"] = str(files).split(",")
        elif origin.get("digest"):
            facts["digest"] = origin["digest"]
        elif origin.get("url"):
            facts["url"] = origin["url"]
    if record.source.startswith(("https://", "http://")):
        facts.setdefault("url", record.source)
    return facts


# -- the file -------------------------------------------------------------------------


def lock_path(manifest: Path) -> Path:
    """Where the lock of the manifest at `manifest` lives: in its directory, or beside it."""
    return (manifest if manifest.is_dir() else manifest.parent) / LOCK_NAME


def lock_text(lock: Lock) -> str:
    import tomlkit

    data: dict[str, Any] = {"version": 1}
    for kind in ("engine", "model", "lora"):
        rows = []
        for entry in lock.entries:
            if entry.kind == kind:
                row: dict[str, Any] = {"name": entry.name, **dict(entry.asked)}
                row.update({k: v for k, v in sorted(entry.resolved.items()) if v is not None})
                rows.append(row)
        if rows:
            data[kind] = rows
    return HEADER + tomlkit.dumps(data)


ASKED = {
    "engine": ("lane", "install", "backend", "declared"),
    "model": ("source",),
    "lora": ("source",),
}


def parse_lock(text: str, where: str = LOCK_NAME) -> Lock:
    """A lock's text as a Lock; InvalidInput that names the file when it is not one."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(
            f"{where} is not valid TOML ({exc}): fix it, or delete it and apply"
        ) from None
    if data.get("version") != 1:
        raise InvalidInput(f"{where}: unknown lock version {data.get('version')!r}")
    entries = []
    for kind, fields in ASKED.items():
        for row in data.get(kind, []):
            if not isinstance(row, dict) or not isinstance(row.get("name"), str):
                raise InvalidInput(f"{where}: a [[{kind}]] entry without a name")
            asked: tuple[tuple[str, str], ...]
            if kind == "engine" and "lane" in row:
                asked = (("lane", str(row["lane"])),)
            else:
                asked = tuple((f, str(row[f])) for f in fields if f != "lane" and f in row)
            resolved = {k: v for k, v in row.items() if k != "name" and k not in fields}
            entries.append(Locked(kind, row["name"], asked, resolved))
    return Lock(tuple(entries))


def read_lock(path: Path) -> Lock | None:
    """The lock at `path`, or None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return parse_lock(text, str(path))


def write_lock(path: Path, lock: Lock) -> bool:
    """Write `lock` at `path` (atomically) unless it already says exactly that; True when
    the file changed."""
    text = lock_text(lock)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
