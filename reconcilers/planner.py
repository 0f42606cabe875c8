"""The plan skeleton the resource reconcilers share (models, projectors, adapters, keys).

Each of `reconcilers.models`, `reconcilers.projectors`, `reconcilers.loras` and
`reconcilers.keys` plans the same way: the resources it observed, keyed by name, are
compared with the declared ones; a declared resource not held is created; one held is
compared by the reconciler's own rule (`compare`), which says what to change and why,
or nothing; a resource the manifest managed and no longer declares is deleted with
--prune and otherwise kept and listed. Only `compare` and the details each action
carries differ between kinds; `bytes_change` is the rule models and adapters share for
the file behind them. Everything here is pure (no I/O, no clock), called by the planners.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from reconcilers.plan import Action, Change

NOT_HELD = "not in the store"
GONE = "no longer in the manifest"


class Held(Protocol):
    @property
    def managed(self) -> bool: ...  # a manifest made it (apply), not `blazar import`


Declared = TypeVar("Declared")
Observed = TypeVar("Observed", bound=Held)


def _name(resource: Any) -> str:
    return str(resource.name)


@dataclass(frozen=True)
class Verdict:
    """What `compare` decided for a resource that is held: the change, why, its details."""

    change: Change
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


def plan_kind(
    kind: str,
    desired: Sequence[Declared],
    observed: Sequence[Observed],
    *,
    prune: bool,
    created: Callable[[Declared], dict[str, Any]],
    compare: Callable[[Declared, Observed], Verdict | None],
    deleted: Callable[[Observed], dict[str, Any]] = lambda have: {},
    key: Callable[[Any], str] = _name,
    missing: str = NOT_HELD,
) -> tuple[list[Action], list[str]]:
    """Pure: the actions that take `observed` to `desired` for one kind, in the order the
    declarations come, then the deletions; and the managed resources kept because
    --prune was not given (as addresses). `created` gives a create's details (its reason
    is `missing`), `deleted` a delete's, and `compare` the change (or None) for a declared
    resource that is held; `key` is a resource's name (default: its `name`)."""
    held = {key(o): o for o in observed}
    wanted = {key(d) for d in desired}
    actions = []
    for resource in desired:
        name = key(resource)
        have = held.get(name)
        if have is None:
            actions.append(Action(kind, name, Change.CREATE, missing, created(resource)))
            continue
        verdict = compare(resource, have)
        if verdict is not None:
            actions.append(Action(kind, name, verdict.change, verdict.reason, verdict.details))
    kept = []
    for have in observed:
        name = key(have)
        if have.managed and name not in wanted:
            if prune:
                actions.append(Action(kind, name, Change.DELETE, GONE, deleted(have)))
            else:
                kept.append(f"{kind}s.{name}")
    return actions, kept


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runtime settings that differ, each as {"from": old, "to": new}."""
    keys = sorted(set(old) | set(new))
    return {k: {"from": old.get(k), "to": new.get(k)} for k in keys if old.get(k) != new.get(k)}


def same_bytes(sha256: str | None, held_sha256: str) -> bool:
    """The manifest pins the sha256 the store holds: the file is the same, wherever from."""
    return sha256 is not None and sha256 == held_sha256


def bytes_change(
    sha256: str | None, source: str, held_sha256: str, held_source: str, details: dict[str, Any]
) -> Verdict | None:
    """A replace when the file behind a model or an adapter must be fetched again: its
    pinned sha256 changed, or its source did (unless the pinned bytes are the same);
    `details` are the declaration's, with the field that changed shown from -> to."""
    if sha256 and not same_bytes(sha256, held_sha256):
        return Verdict(
            Change.REPLACE,
            "its sha256 changed",
            {**details, "sha256": {"from": held_sha256, "to": sha256}},
        )
    if source != held_source and not same_bytes(sha256, held_sha256):
        return Verdict(
            Change.REPLACE,
            "its source changed",
            {**details, "source": {"from": held_source, "to": source}},
        )
    return None


def settings_change(
    settings: dict[str, Any], source: str, held_settings: dict[str, Any], held_source: str
) -> dict[str, dict[str, Any]]:
    """What an update in place records: the settings that differ, and the source when the
    same bytes now come from another address."""
    diff = settings_diff(held_settings, settings)
    if source != held_source:
        diff["source"] = {"from": held_source, "to": source}
    return diff


def changed(diff: dict[str, Any]) -> str:
    """An update's reason: the fields that changed."""
    return f"{', '.join(diff)} changed"
