"""Observe, plan and apply across all kinds, in dependency order.

`make_plan` observes through the ports and plans purely; `execute` carries a
plan out: engines, then models, then vision projectors, then LoRA adapters, then
keys. Each action's outcome is a value. Temporary errors (and unclassified ones)
are retried with exponential backoff; permanent ones are not. A failed action never
stops the independent ones; an adapter or projector whose model failed is skipped. Every declared
resource's Ready condition is written through the status port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from reconcilers.desired import Desired
from reconcilers.engines import (
    apply_engine,
    apply_fork_state,
    plan_engines,
    plan_fork_installs,
    plan_forks,
)
from reconcilers.errors import PermanentError, TemporaryError
from reconcilers.keys import apply_key, plan_keys
from reconcilers.loras import plan_loras
from reconcilers.models import plan_models
from reconcilers.plan import Action, Change, Note, Plan
from reconcilers.ports import HeldPort, ObservedLane, ObservedModel, OfferView, Ports, Progress
from reconcilers.projectors import plan_projectors
from reconcilers.routing import route

D = TypeVar("D")
Seen = TypeVar("Seen")


@dataclass(frozen=True)
class Outcome:
    action: Action
    ok: bool
    attempts: int = 1
    error: str | None = None
    skipped: bool = False


@dataclass(frozen=True)
class ApplyReport:
    outcomes: tuple[Outcome, ...]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def ok(self) -> bool:
        return not self.failed


def _name(resource: Any) -> str:
    return str(resource.name)


def _model(resource: Any) -> str:
    return str(resource.model)


def not_anothers(
    owner: str,
    declared: Sequence[Any],
    observed: Sequence[Seen],
    key: Callable[[Any], str] = _name,
) -> list[Seen]:
    """Pure: what a manifest plans over: everything it declares, and what no other
    manifest applied last. Another manifest's resources sharing the store are neither
    pruned nor listed as kept by this one (prune of one manifest deleted a model another
    had declared), as terraform's state and kubectl's apply labels keep owners apart. A
    resource whose owner was never recorded, or a manifest with no path, plans as before."""
    names = {key(d) for d in declared}
    return [
        o
        for o in observed
        if key(o) in names or not owner or getattr(o, "owner", None) in (None, "", owner)
    ]


def make_plan(
    desired: Desired, ports: Ports, *, prune: bool = False, now: datetime | None = None
) -> Plan:
    """Observe everything, then plan every kind (the planning itself is pure).

    `now` is the clock fork retirement reads (injected by tests; default: the time now).
    """
    now = now or datetime.now(UTC)
    actions = plan_engines(desired.engines, ports.engines.observe(), ports.engines.expected_tag)
    observed_models = ports.models.observe()
    wanted = {m.architecture for m in observed_models if m.architecture}
    lanes = ports.engines.lanes(wanted)
    fork_actions, notes = plan_fork_installs(desired.engines, lanes)
    actions += fork_actions + plan_forks(lanes, now, desired.routing.fork_retire_days)
    if route_notes(desired, observed_models, lanes, ()):  # read the catalog only when needed
        offers = ports.engines.offers(desired.routing.catalog)
        notes += route_notes(desired, observed_models, lanes, offers)
    mine = partial(not_anothers, desired.owner)
    model_actions, kept_models = plan_models(
        desired.models, mine(desired.models, observed_models), prune=prune
    )
    lora_actions, kept_loras = plan_loras(
        desired.loras, mine(desired.loras, ports.loras.observe()), prune=prune
    )
    key_actions, kept_keys = plan_keys(
        desired.keys, mine(desired.keys, ports.keys.observe()), prune=prune
    )
    projector_actions, kept_projectors = plan_projectors(
        desired.projectors,
        mine(desired.projectors, ports.projectors.observe(), key=_model),
        prune=prune,
    )
    return Plan.of(
        [*actions, *model_actions, *projector_actions, *lora_actions, *key_actions],
        [*kept_models, *kept_projectors, *kept_loras, *kept_keys],
        notes,
    )


def route_notes(
    desired: Desired,
    observed: Sequence[ObservedModel],
    lanes: Sequence[ObservedLane],
    offers: Sequence[OfferView],
) -> list[Note]:
    """Pure: a note for each declared model no installed engine can serve (the gateway
    answers its requests with the same message, a 400), unless a fork lane this plan
    installs adds its architecture."""
    held = {m.name: m for m in observed}
    routing = desired.routing
    coming = {e.lane_name for e in desired.engines if e.fork}
    offered = {o.id: o for o in offers}
    notes = []
    for model in desired.models:
        found = held.get(model.name)
        if found is None or not found.architecture:
            continue  # not pulled yet: its architecture is not known
        arch = found.architecture
        if any(arch in offered[c].architectures for c in coming if c in offered):
            continue
        decided = route(
            model.name,
            arch,
            lanes,
            offers,
            pin=routing.pins.get(model.name),
            default=routing.defaults.get(model.name, "llamacpp"),
            mode=routing.mode,
        )
        if decided.refusal is not None:
            notes.append(Note(f"models.{model.name}", decided.refusal))
    return notes


Event = Callable[[str, Action, str], None]  # (phase, action, message): start | retry | done | fail


def execute(
    plan: Plan,
    desired: Desired,
    ports: Ports,
    *,
    retries: int = 3,
    backoff: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    on_event: Event | None = None,
    progress_for: Callable[[Action], Progress | None] | None = None,
) -> ApplyReport:
    """Carry out `plan`; report every outcome. Never raises for a resource's failure."""
    emit = on_event or (lambda phase, action, message: None)
    engines = {e.name: e for e in desired.engines}
    models = {m.name: m for m in desired.models}
    loras = {lo.name: lo for lo in desired.loras}
    keys = {k.name: k for k in desired.keys}
    projectors = {p.model: p for p in desired.projectors}
    failed_models: set[str] = set()
    outcomes = []
    for action in plan.actions:
        base = None
        if action.kind == "lora" and action.name in loras:
            base = loras[action.name].model
        elif action.kind == "projector" and action.name in projectors:
            base = action.name
        if base is not None and base in failed_models:
            message = f"skipped: its model {base!r} failed in this apply"
            outcomes.append(Outcome(action, False, 0, message, skipped=True))
            ports.status.set_condition(action.kind, action.name, False, "DependencyFailed", message)
            emit("fail", action, message)
            continue
        progress = progress_for(action) if progress_for else None

        def run(action: Action = action, progress: Progress | None = progress) -> None:
            if action.kind == "engine" and "state" in action.details:
                apply_fork_state(action, ports.engines)
            elif action.kind == "engine":
                apply_engine(action, engines[action.name], ports.engines, desired.routing.catalog)
            elif action.kind == "model":
                apply_held(action, models.get(action.name), ports.models, progress)
            elif action.kind == "lora":
                apply_held(action, loras.get(action.name), ports.loras, progress)
            elif action.kind == "projector":
                apply_held(action, projectors.get(action.name), ports.projectors, progress)
            else:
                apply_key(action, keys.get(action.name), ports.keys)

        outcome = _attempt(action, run, retries, backoff, sleep, emit)
        outcomes.append(outcome)
        if not outcome.ok and action.kind == "model":
            failed_models.add(action.name)
        if action.change != "delete":
            reason = "Applied" if outcome.ok else "ApplyFailed"
            ports.status.set_condition(
                action.kind, action.name, outcome.ok, reason, outcome.error or action.reason
            )
    touched = {(a.kind, a.name) for a in plan.actions}
    kinds = (
        ("engine", engines),
        ("model", models),
        ("projector", projectors),
        ("lora", loras),
        ("key", keys),
    )
    for kind, names in kinds:
        for name in names:
            if (kind, name) not in touched:
                ports.status.set_condition(kind, name, True, "UpToDate", "matches the manifest")
    for note in plan.notes:  # held but not servable: no engine supports it, a bad draft
        kind, _, name = note.address.partition(".")
        if kind == "models":
            ports.status.set_condition("model", name, False, note.reason, note.message)
    return ApplyReport(tuple(outcomes))


def apply_held(
    action: Action, declared: D | None, port: HeldPort[D], progress: Progress | None
) -> None:
    """One action on a held file (a model, an adapter, a projector), the same for each kind:
    a delete removes it, a create or replace fetches it, an update records its declaration
    on what is held (no download)."""
    if action.change is Change.DELETE:
        port.remove(action.name)
        return
    assert declared is not None  # the planner creates, replaces and updates declared ones
    if action.change in (Change.CREATE, Change.REPLACE):
        port.fetch(declared, progress)
    else:
        port.record(declared)


def _attempt(
    action: Action,
    run: Callable[[], None],
    retries: int,
    backoff: float,
    sleep: Callable[[float], None],
    emit: Event,
) -> Outcome:
    emit("start", action, action.reason)
    for attempt in range(1, retries + 1):
        try:
            run()
        except PermanentError as exc:
            emit("fail", action, str(exc))
            return Outcome(action, False, attempt, str(exc))
        except Exception as exc:  # TemporaryError and anything unclassified: retry
            if attempt == retries:
                emit("fail", action, str(exc))
                return Outcome(action, False, attempt, str(exc))
            base = exc.delay if isinstance(exc, TemporaryError) else backoff
            delay = base * 2 ** (attempt - 1)
            emit("retry", action, f"{exc} (attempt {attempt} of {retries}; retrying in {delay:g}s)")
            sleep(delay)
        else:
            emit("done", action, "")
            return Outcome(action, True, attempt)
    raise AssertionError("unreachable")
