"""Observe, plan and apply across all kinds, in dependency order.

`make_plan` observes through the ports and plans purely; `execute` carries a
plan out: engines, then models, then LoRA adapters, then keys. Each action's
outcome is a value. Temporary errors (and unclassified ones) are retried with
exponential backoff; permanent ones are not. A failed action never stops the
independent ones; an adapter whose model failed is skipped. Every declared
resource's Ready condition is written through the status port.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from reconcilers.desired import Desired
from reconcilers.engines import apply_engine, plan_engines
from reconcilers.errors import PermanentError, TemporaryError
from reconcilers.keys import apply_key, plan_keys
from reconcilers.loras import apply_lora, plan_loras
from reconcilers.models import apply_model, plan_models
from reconcilers.plan import Action, Plan
from reconcilers.ports import Ports, Progress


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


def make_plan(desired: Desired, ports: Ports, *, prune: bool = False) -> Plan:
    """Observe everything, then plan every kind (the planning itself is pure)."""
    actions = plan_engines(desired.engines, ports.engines.observe(), ports.engines.expected_tag)
    model_actions, kept_models = plan_models(desired.models, ports.models.observe(), prune=prune)
    lora_actions, kept_loras = plan_loras(desired.loras, ports.loras.observe(), prune=prune)
    key_actions, kept_keys = plan_keys(desired.keys, ports.keys.observe(), prune=prune)
    return Plan.of(
        [*actions, *model_actions, *lora_actions, *key_actions],
        [*kept_models, *kept_loras, *kept_keys],
    )


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
    failed_models: set[str] = set()
    outcomes = []
    for action in plan.actions:
        if action.kind == "lora" and action.name in loras:
            base = loras[action.name].model
            if base in failed_models:
                message = f"skipped: its model {base!r} failed in this apply"
                outcomes.append(Outcome(action, False, 0, message, skipped=True))
                ports.status.set_condition("lora", action.name, False, "DependencyFailed", message)
                emit("fail", action, message)
                continue
        progress = progress_for(action) if progress_for else None

        def run(action: Action = action, progress: Progress | None = progress) -> None:
            if action.kind == "engine":
                apply_engine(action, engines[action.name], ports.engines)
            elif action.kind == "model":
                apply_model(action, models.get(action.name), ports.models, progress)
            elif action.kind == "lora":
                apply_lora(action, loras.get(action.name), ports.loras, progress)
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
    for kind, names in (("engine", engines), ("model", models), ("lora", loras), ("key", keys)):
        for name in names:
            if (kind, name) not in touched:
                ports.status.set_condition(kind, name, True, "UpToDate", "matches the manifest")
    return ApplyReport(tuple(outcomes))


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
