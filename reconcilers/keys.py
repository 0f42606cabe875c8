"""The API keys reconciler: the store holds exactly the declared key hashes.

Only a sha256 of a key ever sits in a manifest or in the store. Keys are
small records, so they are created, updated and (with --prune) deleted in
place. The skeleton is `reconcilers.planner`'s; `_compare` is this kind's rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconcilers.desired import DesiredKey
from reconcilers.plan import Action, Change
from reconcilers.planner import Verdict, changed, plan_kind
from reconcilers.ports import KeysPort, ObservedKey


def _compare(key: DesiredKey, have: ObservedKey) -> Verdict | None:
    diff: dict[str, dict[str, object]] = {}
    if have.sha256 != key.sha256:
        diff["sha256"] = {"from": have.sha256[:12] + "...", "to": key.sha256[:12] + "..."}
    if tuple(have.models) != key.models:
        diff["models"] = {"from": list(have.models), "to": list(key.models)}
    if diff or not have.managed:
        why = changed(diff) if diff else "the manifest takes it over"
        return Verdict(Change.UPDATE, why, dict(diff))
    return None


def plan_keys(
    desired: Sequence[DesiredKey], observed: Sequence[ObservedKey], *, prune: bool
) -> tuple[list[Action], list[str]]:
    """Pure: (actions, managed keys kept because --prune was not given)."""
    return plan_kind(
        "key",
        desired,
        observed,
        prune=prune,
        created=lambda key: {"models": list(key.models)},
        compare=_compare,
    )


def apply_key(action: Action, desired: DesiredKey | None, port: KeysPort) -> None:
    if action.change is Change.DELETE:
        port.remove(action.name)
        return
    assert desired is not None
    port.put(desired.name, desired.sha256, desired.models)
