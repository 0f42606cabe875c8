"""The LoRA adapters reconciler: each declared adapter held and bound to its model.

Same rules as models: fetched when missing, replaced when its source, sha256
or base model changed, updated in place when only its settings (scale)
changed, deleted only with --prune when the manifest no longer declares it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconcilers.desired import DesiredLora
from reconcilers.models import settings_diff
from reconcilers.plan import Action, Change
from reconcilers.ports import LorasPort, ObservedLora, Progress


def plan_loras(
    desired: Sequence[DesiredLora], observed: Sequence[ObservedLora], *, prune: bool
) -> tuple[list[Action], list[str]]:
    held = {o.name: o for o in observed}
    wanted = {d.name for d in desired}
    actions = []
    for lora in desired:
        have = held.get(lora.name)
        details: dict[str, Any] = {"model": lora.model, "source": lora.source}
        if have is None:
            actions.append(Action("lora", lora.name, Change.CREATE, "not in the store", details))
            continue
        same_bytes = lora.sha256 is not None and lora.sha256 == have.sha256
        if lora.sha256 and not same_bytes:
            details["sha256"] = {"from": have.sha256, "to": lora.sha256}
            reason = "its sha256 changed"
        elif lora.source != have.source and not same_bytes:
            details["source"] = {"from": have.source, "to": lora.source}
            reason = "its source changed"
        elif lora.model != have.model:
            details["model"] = {"from": have.model, "to": lora.model}
            reason = "its base model changed"
        else:
            diff = settings_diff(have.settings, lora.settings)
            if lora.source != have.source:
                diff["source"] = {"from": have.source, "to": lora.source}
            if diff or not have.managed:
                why = f"{', '.join(diff)} changed" if diff else "the manifest takes it over"
                actions.append(Action("lora", lora.name, Change.UPDATE, why, diff))
            continue
        actions.append(Action("lora", lora.name, Change.REPLACE, reason, details))
    kept = []
    for have in observed:
        if have.managed and have.name not in wanted:
            if prune:
                actions.append(
                    Action("lora", have.name, Change.DELETE, "no longer in the manifest", {})
                )
            else:
                kept.append(f"loras.{have.name}")
    return actions, kept


def apply_lora(
    action: Action, desired: DesiredLora | None, port: LorasPort, progress: Progress | None
) -> None:
    if action.change is Change.DELETE:
        port.remove(action.name)
        return
    assert desired is not None
    if action.change in (Change.CREATE, Change.REPLACE):
        port.fetch(
            desired.name, desired.model, desired.source, desired.sha256, desired.settings, progress
        )
    else:
        port.record_settings(desired.name, desired.source, desired.settings)
