"""The vision projectors reconciler: each declared `models.NAME.mmproj` held for its model.

Same rules as models and adapters: fetched when missing, replaced when its source,
sha256 or what it was resolved against (`auto`: the model's source) changed, deleted
only with --prune when the manifest no longer declares it. A projector is named after
its model (`projectors.NAME`) and applied after it: one whose model failed is skipped.
The skeleton is `reconcilers.planner`'s; `_compare` is this kind's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconcilers.desired import DesiredProjector
from reconcilers.plan import Action, Change
from reconcilers.planner import Verdict, plan_kind
from reconcilers.ports import ObservedProjector

KIND = "projector"


def _compare(projector: DesiredProjector, have: ObservedProjector) -> Verdict | None:
    details: dict[str, Any] = {"source": projector.source}
    if projector.sha256 and projector.sha256 != have.sha256:
        details["sha256"] = {"from": have.sha256, "to": projector.sha256}
        reason = "its sha256 changed"
    elif projector.source != have.source:  # a projector's source is its identity too
        details["source"] = {"from": have.source, "to": projector.source}
        reason = "its source changed"
    elif projector.settings != have.settings:
        details["model_source"] = {
            "from": have.settings.get("model_source"),
            "to": projector.settings.get("model_source"),
        }
        reason = "its model's source changed (mmproj = auto follows it)"
    elif not have.managed:
        return Verdict(Change.UPDATE, "the manifest takes it over", {})
    else:
        return None
    return Verdict(Change.REPLACE, reason, details)


def plan_projectors(
    desired: Sequence[DesiredProjector], observed: Sequence[ObservedProjector], *, prune: bool
) -> tuple[list[Action], list[str]]:
    """Pure: (actions, managed projectors kept because --prune was not given). Named after
    their model; the skeleton is `reconcilers.planner`'s."""
    return plan_kind(
        KIND,
        desired,
        observed,
        prune=prune,
        created=lambda p: {"source": p.source},
        compare=_compare,
        key=lambda p: str(p.model),
        missing="not held",
    )
