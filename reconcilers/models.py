"""The models reconciler: every declared model held, verified, with its settings recorded.

Plan rules (pure):
- declared, not held                          -> + create (fetch and verify)
- held, but its source or sha256 differ       -> -/+ replace (fetch the new bytes)
- held by `blazar import`, same bytes         -> ~ update (adopt: the manifest owns it now)
- held, runtime settings differ (ctx, slots)  -> ~ update in place, no download
- managed, no longer declared                 -> - delete with --prune, else kept and listed
Models imported by hand and not declared are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconcilers.desired import DesiredModel
from reconcilers.plan import Action, Change
from reconcilers.ports import ModelsPort, ObservedModel, Progress


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keys = sorted(set(old) | set(new))
    return {k: {"from": old.get(k), "to": new.get(k)} for k in keys if old.get(k) != new.get(k)}


def plan_models(
    desired: Sequence[DesiredModel], observed: Sequence[ObservedModel], *, prune: bool
) -> tuple[list[Action], list[str]]:
    """Pure: (actions, managed models kept because --prune was not given)."""
    held = {o.name: o for o in observed}
    wanted = {d.name for d in desired}
    actions = []
    for model in desired:
        have = held.get(model.name)
        details: dict[str, Any] = {"source": model.source}
        if model.sha256:
            details["sha256"] = model.sha256
        if have is None:
            actions.append(Action("model", model.name, Change.CREATE, "not in the store", details))
            continue
        same_bytes = model.sha256 is not None and model.sha256 == have.sha256
        if model.sha256 and not same_bytes:
            details["sha256"] = {"from": have.sha256, "to": model.sha256}
            actions.append(
                Action("model", model.name, Change.REPLACE, "its sha256 changed", details)
            )
            continue
        if model.source != have.source and not same_bytes:
            details["source"] = {"from": have.source, "to": model.source}
            actions.append(
                Action("model", model.name, Change.REPLACE, "its source changed", details)
            )
            continue
        if not have.managed:
            actions.append(
                Action(
                    "model",
                    model.name,
                    Change.UPDATE,
                    "imported by hand; the manifest takes it over (same bytes)",
                    {"sha256": have.sha256},
                )
            )
            continue
        diff = settings_diff(have.settings, model.settings)
        if model.source != have.source:
            diff["source"] = {"from": have.source, "to": model.source}
        if diff:
            actions.append(
                Action("model", model.name, Change.UPDATE, f"{', '.join(diff)} changed", diff)
            )
    kept = []
    for have in observed:
        if have.managed and have.name not in wanted:
            if prune:
                actions.append(
                    Action(
                        "model",
                        have.name,
                        Change.DELETE,
                        "no longer in the manifest",
                        {"sha256": have.sha256},
                    )
                )
            else:
                kept.append(f"models.{have.name}")
    return actions, kept


def apply_model(
    action: Action, desired: DesiredModel | None, port: ModelsPort, progress: Progress | None
) -> None:
    if action.change is Change.DELETE:
        port.remove(action.name)
        return
    assert desired is not None
    if action.change in (Change.CREATE, Change.REPLACE):
        port.fetch(desired.name, desired.source, desired.sha256, desired.settings, progress)
    else:
        port.record_settings(desired.name, desired.source, desired.settings)
