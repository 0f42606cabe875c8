"""The API keys reconciler: the store holds exactly the declared key hashes.

Only a sha256 of a key ever sits in a manifest or in the store. Keys are
small records, so they are created, updated and (with --prune) deleted in
place.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconcilers.desired import DesiredKey
from reconcilers.plan import Action, Change
from reconcilers.ports import KeysPort, ObservedKey


def plan_keys(
    desired: Sequence[DesiredKey], observed: Sequence[ObservedKey], *, prune: bool
) -> tuple[list[Action], list[str]]:
    held = {o.name: o for o in observed}
    wanted = {d.name for d in desired}
    actions = []
    for key in desired:
        have = held.get(key.name)
        if have is None:
            actions.append(
                Action(
                    "key", key.name, Change.CREATE, "not in the store", {"models": list(key.models)}
                )
            )
            continue
        diff: dict[str, dict[str, object]] = {}
        if have.sha256 != key.sha256:
            diff["sha256"] = {"from": have.sha256[:12] + "...", "to": key.sha256[:12] + "..."}
        if tuple(have.models) != key.models:
            diff["models"] = {"from": list(have.models), "to": list(key.models)}
        if diff or not have.managed:
            actions.append(
                Action(
                    "key",
                    key.name,
                    Change.UPDATE,
                    f"{', '.join(diff)} changed" if diff else "the manifest takes it over",
                    diff,
                )
            )
    kept = []
    for have in observed:
        if have.managed and have.name not in wanted:
            if prune:
                actions.append(Action("key", have.name, Change.DELETE, "no longer in the manifest"))
            else:
                kept.append(f"keys.{have.name}")
    return actions, kept


def apply_key(action: Action, desired: DesiredKey | None, port: KeysPort) -> None:
    if action.change is Change.DELETE:
        port.remove(action.name)
        return
    assert desired is not None
    port.put(desired.name, desired.sha256, desired.models)
