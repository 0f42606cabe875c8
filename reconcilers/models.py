"""The models reconciler: every declared model held, verified, with its settings recorded.

Plan rules (pure):
- declared, not held                          -> + create (fetch and verify)
- held, but its source or sha256 differ       -> -/+ replace (fetch the new bytes)
- held by `blazar import`, same bytes         -> ~ update (adopt: the manifest owns it now)
- held, runtime settings differ (ctx, slots)  -> ~ update in place, no download
- managed, no longer declared                 -> - delete with --prune, else kept and listed
Models imported by hand and not declared are never touched. The skeleton (observed vs
declared, create, prune or keep) is `reconcilers.planner`'s; `_compare` is this kind's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconcilers.desired import DesiredModel
from reconcilers.plan import Action, Change
from reconcilers.planner import (
    Verdict,
    bytes_change,
    changed,
    plan_kind,
    settings_change,
    settings_diff,
)
from reconcilers.ports import ObservedModel

__all__ = ["plan_models", "settings_diff"]


def _details(model: DesiredModel) -> dict[str, Any]:
    details: dict[str, Any] = {"source": model.source}
    if model.sha256:
        details["sha256"] = model.sha256
    return details


def _compare(model: DesiredModel, have: ObservedModel) -> Verdict | None:
    replace = bytes_change(model.sha256, model.source, have.sha256, have.source, _details(model))
    if replace is not None:
        return replace
    if not have.managed:
        return Verdict(
            Change.UPDATE,
            "imported by hand; the manifest takes it over (same bytes)",
            {"sha256": have.sha256},
        )
    diff = settings_change(model.settings, model.source, have.settings, have.source)
    return Verdict(Change.UPDATE, changed(diff), diff) if diff else None


def plan_models(
    desired: Sequence[DesiredModel], observed: Sequence[ObservedModel], *, prune: bool
) -> tuple[list[Action], list[str]]:
    """Pure: (actions, managed models kept because --prune was not given)."""
    return plan_kind(
        "model",
        desired,
        observed,
        prune=prune,
        created=_details,
        compare=_compare,
        deleted=lambda have: {"sha256": have.sha256},
    )
