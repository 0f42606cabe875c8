"""One reconcile pass with real ports: load the manifest, plan, and (optionally) apply.

The CLI (`diff`, `apply`, imperative commands) and `serve`'s control loop call
this. The manifest is validated whole before anything is observed or changed.
Host overlays are chosen here (`overlay_host`: `--host NAME`, else this
machine's name), and the lock file is kept here (`update_lock`,
`manifest_drift`; `blazar.reconcile.lockfile` has the rules).
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from blazar.errors import InvalidInput, InvalidManifest
from blazar.host.locking import apply_lock
from blazar.models.vocab import draft_problem
from blazar.paths import Paths
from blazar.reconcile.lockfile import (
    Lock,
    drift,
    fetch_pins,
    held,
    lock_path,
    locked_desired,
    merged,
    read_lock,
    refusals,
    write_lock,
)
from blazar.reconcile.ports import real_ports
from blazar.store.db import Store
from reconcilers.apply import ApplyReport, Event, execute, make_plan
from reconcilers.desired import Desired, desired_from_manifest
from reconcilers.engines import PlanError
from reconcilers.plan import Action, Note, Plan
from reconcilers.ports import Progress
from specs.loader import ManifestError, hosts, load_manifest, overlay_file
from specs.manifest import Manifest
from specs.support import missing_packages, unsupported


def manifest_path(paths: Paths, given: Path | None) -> Path:
    return given if given is not None else paths.manifest


def load(path: Path, host: str | None = None) -> Manifest:
    """Load and validate a manifest whole, refusing fields Blazar does not act on yet
    (`specs.support`). With `host` (`--host NAME`), that host's overlay is merged over a
    manifest directory (an error when it has none); without, this machine's, when the
    directory has one (`overlay_host`)."""
    if not path.exists():
        raise InvalidInput(
            f"no manifest at {path}: create it, or `blazar pull SOURCE` to start one"
        )
    try:
        return supported(load_manifest(path, overlay_host(path, host)))
    except ManifestError as exc:
        raise InvalidManifest(_problems(str(path), exc)) from None


def machine_names() -> list[str]:
    """This machine's host name, then its short form (before the first dot)."""
    name = socket.gethostname()
    short = name.split(".", 1)[0]
    return [name] if short == name else [name, short]


def overlay_host(path: Path, given: str | None = None) -> str | None:
    """The host whose overlay applies to the manifest at `path`: `given`, or this
    machine's name when the directory holds an overlay for it; None for none."""
    if given is not None:
        return given
    try:
        return next((n for n in machine_names() if overlay_file(path, n) is not None), None)
    except ManifestError as exc:
        raise InvalidManifest(_problems(str(path), exc)) from None


def supported(manifest: Manifest) -> Manifest:
    """The manifest, unless it sets a field Blazar does not act on yet, or one whose
    optional package is not installed (`specs.support`): then a ManifestError naming each,
    since ignoring a declared field silently misleads, and a setting that cannot work must
    be refused when it is set, not when serve next starts."""
    problems = unsupported(manifest) + missing_packages(manifest, _installed)
    if problems:
        raise ManifestError(problems)
    return manifest


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def _problems(where: str, exc: ManifestError) -> str:
    count = len(exc.problems)
    return f"{where} has {count} problem{'s' if count != 1 else ''}; nothing was changed:\n{exc}"


def load_or_empty(path: Path, host: str | None = None) -> Manifest:
    return load(path, host) if path.exists() else Manifest()


@dataclass(frozen=True)
class Pass:
    plan: Plan
    report: ApplyReport | None
    notes: tuple[Note, ...] = ()  # found once the apply held what the plan had not (drafts)


def plan_for(
    store: Store,
    paths: Paths,
    desired: Desired,
    *,
    prune: bool,
    now: datetime | None = None,
    pins: dict[str, str] | None = None,
) -> Plan:
    try:
        plan = make_plan(desired, real_ports(store, paths, pins), prune=prune, now=now)
    except PlanError as exc:
        raise InvalidInput(str(exc)) from None
    return replace(plan, notes=plan.notes + tuple(draft_notes(store, desired)))


def draft_notes(store: Store, desired: Desired) -> list[Note]:
    """A `!` note for each declared model whose draft cannot draft for it (their GGUFs'
    vocabularies differ, `blazar.models.vocab`), once both are held; serve refuses the model with
    the same reason, before any spawn."""
    held = {r.ref.short: r for r in store.list_models()}
    notes = []
    for model in desired.models:
        draft = model.settings.get("draft")
        target, other = held.get(model.name), held.get(str(draft))
        if not draft or target is None or other is None:
            continue  # no draft, or not pulled yet: checked once both are held
        found = draft_problem(Path(target.path), Path(other.path))
        if found is not None:
            message = (
                f"model '{draft}' cannot draft for '{model.name}': {found}; choose another "
                f"(`blazar drafts {model.name}` lists those that fit) or remove "
                f"models.{model.name}.draft"
            )
            notes.append(Note(f"models.{model.name}", message, "DraftMismatch"))
    return notes


def reconcile(
    store: Store,
    paths: Paths,
    manifest: Manifest,
    *,
    apply: bool,
    prune: bool = False,
    targets: Sequence[str] = (),
    confirm: Callable[[Plan], bool] = lambda plan: True,
    show: Callable[[Plan], None] = lambda plan: None,
    notify: Callable[[str], None] | None = None,
    on_event: Event | None = None,
    progress_for: Callable[[Action], Progress | None] | None = None,
    lock_timeout: float = 600.0,
    now: datetime | None = None,
    locked: Lock | None = None,
) -> Pass:
    """Plan (and apply, when asked) under the apply lock, so passes never interleave.

    `now` is the clock fork retirement reads (tests inject one; default: the time now).
    With `locked` (`apply --locked`), a manifest the lock does not cover exactly is
    refused before anything is observed or changed, and what is installed is what the
    lock resolved (`blazar.reconcile.lockfile`).
    """
    desired = desired_from_manifest(manifest)
    pins: dict[str, str] = {}
    if locked is not None:
        refused = refusals(locked, desired)
        if refused:
            raise LockMismatch(
                "the manifest resolves differently from blazar.lock; nothing was changed:\n"
                + "\n".join(f"  {r}" for r in refused)
                + "\nRun `blazar apply` without --locked where the change is meant (it "
                "rewrites the lock), and commit blazar.lock."
            )
        desired, pins = locked_desired(desired, locked), fetch_pins(desired, locked)
    with apply_lock(paths.state / "apply.lock", timeout=lock_timeout, notify=notify):
        plan = plan_for(store, paths, desired, prune=prune, now=now, pins=pins)
        if targets:
            unknown = [t for t in targets if not _declared(desired, t)]
            if unknown:
                raise InvalidInput(f"--target {', '.join(unknown)} is not declared in the manifest")
            plan = plan.only(targets)
        show(plan)
        if apply and not targets:
            forget_undeclared(store, desired)
        if apply and desired.owner:
            record_owner(store, desired, targets)
        if not apply or plan.empty or not confirm(plan):
            return Pass(plan, None)
        report = execute(
            plan,
            desired,
            real_ports(store, paths, pins),
            on_event=on_event,
            progress_for=progress_for,
        )
        late = tuple(n for n in draft_notes(store, desired) if n not in plan.notes)
        for note in late:  # both models are held only now: their Ready condition says why
            name = note.address.partition(".")[2]
            store.set_condition("model", name, "Ready", "False", note.reason, note.message)
        return Pass(plan, report, late)


def declared_names(desired: Desired) -> dict[str, set[str]]:
    """The names each kind of resource the reconcile pass keeps a Ready condition for."""
    return {
        "model": {m.name for m in desired.models},
        "lora": {lora.name for lora in desired.loras},
        "projector": {p.model for p in desired.projectors},
        "key": {k.name for k in desired.keys},
    }


def forget_undeclared(store: Store, desired: Desired, only: Sequence[str] = ()) -> None:
    """Drop the Ready conditions of models, adapters, projectors and keys that `desired`
    does not declare (of the addresses `only`, `models.NAME`, when given). A condition
    belongs to a declaration: a pull that failed and was taken back, or a model removed
    from the manifest, leaves no "not ready" behind for `doctor` and `status` to show."""
    names = declared_names(desired)
    wanted: dict[str, set[str]] = {}
    for address in only:
        table, _, name = address.partition(".")
        wanted.setdefault(_KINDS.get(table, table), set()).add(name)
    for condition in store.conditions():
        if condition.type != "Ready" or condition.kind not in names:
            continue
        if only and condition.name not in wanted.get(condition.kind, set()):
            continue
        if condition.name not in names[condition.kind]:
            store.delete_condition(condition.kind, condition.name, "Ready")


_KINDS = {"models": "model", "loras": "lora", "projectors": "projector", "keys": "key"}


def record_owner(store: Store, desired: Desired, targets: Sequence[str] = ()) -> None:
    """Record this manifest as the one that applies what it declares (of `targets`, when
    given): another manifest's `apply --prune` then leaves them alone
    (`reconcilers.apply.not_anothers`)."""
    only = {(_KINDS.get(t.partition(".")[0], ""), t.partition(".")[2]) for t in targets}
    changed = []
    for kind, names in declared_names(desired).items():
        recorded = store.owners(kind)
        changed += [
            (kind, name)
            for name in sorted(names)
            if (not targets or (kind, name) in only) and recorded.get(name) != desired.owner
        ]
    if changed:  # serve applies every pass: a write only when an owner changes
        store.set_owners(desired.owner, changed)


class LockMismatch(InvalidInput):
    """`apply --locked` on a manifest that resolves differently from its lock."""


def views(path: Path, known: tuple[str | None, Desired] | None = None) -> list[Desired]:
    """Every view of the manifest at `path` a lock serves: the base, and each host
    overlay its directory holds. `known`: one the caller has already (the host whose
    overlay it applied, None for the base; its Desired), not loaded again."""

    def view(host: str | None) -> Desired:
        if known is not None and known[0] == host:
            return known[1]
        return desired_from_manifest(load_manifest(path, host))

    return [view(None), *(view(host) for host in hosts(path))]


def host_lock(store: Store, desired: Desired) -> Lock:
    """What this host holds now for what the manifest asks (`desired`), as lock entries."""
    from blazar.engines.ledger import EngineStore

    return held(desired, store.list_models(), store.list_loras(), EngineStore(store).installed())


def _other_views(path: Path, host: str | None, desired: Desired) -> list[Desired]:
    """`views`, with the one the caller loaded (`host` as given to `load`) reused."""
    known = (overlay_host(path, host), desired)
    try:
        return views(path, known)
    except ManifestError:
        return []


def update_lock(
    store: Store, path: Path, manifest: Manifest, host: str | None = None
) -> Path | None:
    """After an apply: write the lock next to the manifest at `path` with this host's
    entries (and those other views of the manifest still ask for); the lock's path when
    it changed. `host`: as given to `load`."""
    where = lock_path(path)
    desired = desired_from_manifest(manifest)
    others = _other_views(path, host, desired)
    if write_lock(where, merged(host_lock(store, desired), read_lock(where), others)):
        return where
    return None


def manifest_drift(
    store: Store, path: Path, manifest: Manifest, host: str | None = None
) -> list[str]:
    """Drift between the manifest at `path`, its lock and this host (`lockfile.drift`);
    empty when there is no lock. `host`: as given to `load`."""
    lock = read_lock(lock_path(path))
    if lock is None:
        return []
    desired = desired_from_manifest(manifest)
    others = _other_views(path, host, desired)
    return drift(desired, lock, host_lock(store, desired), [desired, *others])


def _declared(desired: Desired, target: str) -> bool:
    names = {e.name for e in desired.engines} | {m.name for m in desired.models}
    names |= {lo.name for lo in desired.loras} | {k.name for k in desired.keys}
    addresses = {f"engines.{e.name}" for e in desired.engines}
    addresses |= {f"models.{m.name}" for m in desired.models}
    addresses |= {f"loras.{lo.name}" for lo in desired.loras}
    addresses |= {f"projectors.{p.model}" for p in desired.projectors}
    addresses |= {f"keys.{k.name}" for k in desired.keys}
    return target in names or target in addresses
