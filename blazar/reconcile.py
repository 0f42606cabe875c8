"""One reconcile pass with real ports: load the manifest, plan, and (optionally) apply.

The CLI (`diff`, `apply`, imperative commands) and, later, `serve`'s control
loop call this. The manifest is validated whole before anything is
observed or changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from blazar.errors import BlazarError, InvalidInput
from blazar.locking import apply_lock
from blazar.paths import Paths
from blazar.store import Store
from blazar.wiring import real_ports
from reconcilers.apply import ApplyReport, Event, execute, make_plan
from reconcilers.desired import Desired, desired_from_manifest
from reconcilers.engines import PlanError
from reconcilers.plan import Action, Plan
from reconcilers.ports import Progress
from specs.loader import ManifestError, load_manifest
from specs.manifest import Manifest
from specs.support import unsupported


class InvalidManifest(BlazarError):
    """The manifest has problems; the message lists every one, one per line."""


def manifest_path(paths: Paths, given: Path | None) -> Path:
    return given if given is not None else paths.manifest


def load(path: Path) -> Manifest:
    """Load and validate a manifest whole, refusing fields Blazar does not act on yet
    (`specs.support`)."""
    if not path.exists():
        raise InvalidInput(
            f"no manifest at {path}: create it, or `blazar pull SOURCE` to start one"
        )
    try:
        return supported(load_manifest(path))
    except ManifestError as exc:
        raise InvalidManifest(_problems(str(path), exc)) from None


def supported(manifest: Manifest) -> Manifest:
    """The manifest, unless it sets a field Blazar does not act on yet (`specs.support`):
    then a ManifestError naming each, since ignoring a declared field silently misleads."""
    problems = unsupported(manifest)
    if problems:
        raise ManifestError(problems)
    return manifest


def _problems(where: str, exc: ManifestError) -> str:
    count = len(exc.problems)
    return f"{where} has {count} problem{'s' if count != 1 else ''}; nothing was changed:\n{exc}"


def load_or_empty(path: Path) -> Manifest:
    return load(path) if path.exists() else Manifest()


@dataclass(frozen=True)
class Pass:
    plan: Plan
    report: ApplyReport | None


def plan_for(
    store: Store, paths: Paths, desired: Desired, *, prune: bool, now: datetime | None = None
) -> Plan:
    try:
        return make_plan(desired, real_ports(store, paths), prune=prune, now=now)
    except PlanError as exc:
        raise InvalidInput(str(exc)) from None


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
) -> Pass:
    """Plan (and apply, when asked) under the apply lock, so passes never interleave.

    `now` is the clock fork retirement reads (tests inject one; default: the time now).
    """
    desired = desired_from_manifest(manifest)
    with apply_lock(paths.state / "apply.lock", timeout=lock_timeout, notify=notify):
        plan = plan_for(store, paths, desired, prune=prune, now=now)
        if targets:
            unknown = [t for t in targets if not _declared(desired, t)]
            if unknown:
                raise InvalidInput(f"--target {', '.join(unknown)} is not declared in the manifest")
            plan = plan.only(targets)
        show(plan)
        if not apply or plan.empty or not confirm(plan):
            return Pass(plan, None)
        report = execute(
            plan, desired, real_ports(store, paths), on_event=on_event, progress_for=progress_for
        )
        return Pass(plan, report)


def _declared(desired: Desired, target: str) -> bool:
    names = {e.name for e in desired.engines} | {m.name for m in desired.models}
    names |= {lo.name for lo in desired.loras} | {k.name for k in desired.keys}
    addresses = {f"engines.{e.name}" for e in desired.engines}
    addresses |= {f"models.{m.name}" for m in desired.models}
    addresses |= {f"loras.{lo.name}" for lo in desired.loras}
    addresses |= {f"keys.{k.name}" for k in desired.keys}
    return target in names or target in addresses
