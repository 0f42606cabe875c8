"""The LoRA adapters reconciler: each declared adapter held and bound to its model.

Same rules as models: fetched when missing, replaced when its source, sha256
or base model changed, updated in place when only its settings (scale)
changed, deleted only with --prune when the manifest no longer declares it. The
skeleton is `reconcilers.planner`'s; `_compare` is this kind's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconcilers.desired import DesiredLora
from reconcilers.plan import Action, Change
from reconcilers.planner import Verdict, bytes_change, changed, plan_kind, settings_change
from reconcilers.ports import ObservedLora


def _details(lora: DesiredLora) -> dict[str, Any]:
    return {"model": lora.model, "source": lora.source}


def _compare(lora: DesiredLora, have: ObservedLora) -> Verdict | None:
    replace = bytes_change(lora.sha256, lora.source, have.sha256, have.source, _details(lora))
    if replace is not None:
        return replace
    if lora.model != have.model:
        details = {**_details(lora), "model": {"from": have.model, "to": lora.model}}
        return Verdict(Change.REPLACE, "its base model changed", details)
    diff = settings_change(lora.settings, lora.source, have.settings, have.source)
    if diff or not have.managed:
        why = changed(diff) if diff else "the manifest takes it over"
        return Verdict(Change.UPDATE, why, diff)
    return None


def plan_loras(
    desired: Sequence[DesiredLora], observed: Sequence[ObservedLora], *, prune: bool
) -> tuple[list[Action], list[str]]:
    """Pure: (actions, managed adapters kept because --prune was not given)."""
    return plan_kind("lora", desired, observed, prune=prune, created=_details, compare=_compare)
