"""A plan is a value: the actions that take observed state to desired state.

Planners (one per resource kind) return actions; renderers turn the same plan
into terraform-style text or JSON. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

KIND_ORDER = ("engine", "model", "projector", "lora", "key")


class Change(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"
    DELETE = "delete"


SYMBOLS = {Change.CREATE: "+", Change.UPDATE: "~", Change.REPLACE: "-/+", Change.DELETE: "-"}


@dataclass(frozen=True)
class Action:
    """One change to one resource, with the reason it is needed."""

    kind: str  # engine | model | projector | lora | key
    name: str
    change: Change
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.kind}s.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "kind": self.kind,
            "name": self.name,
            "change": str(self.change),
            "reason": self.reason,
            "details": self.details,
        }


@dataclass(frozen=True)
class Note:
    """Something the plan cannot change but the user must hear: a model no engine can
    serve, or whose draft cannot draft for it, with the command that fixes it."""

    address: str
    message: str
    reason: str = "NoEngine"  # the Ready condition's reason apply records for the model

    def to_json(self) -> dict[str, str]:
        return {"address": self.address, "message": self.message}


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    kept: tuple[str, ...] = ()  # managed resources not in the manifest, kept without --prune
    notes: tuple[Note, ...] = ()

    @classmethod
    def of(
        cls, actions: Iterable[Action], kept: Iterable[str] = (), notes: Iterable[Note] = ()
    ) -> Plan:
        ordered = sorted(actions, key=lambda a: (KIND_ORDER.index(a.kind), a.name))
        return cls(tuple(ordered), tuple(sorted(kept)), tuple(notes))

    @property
    def empty(self) -> bool:
        return not self.actions

    def counts(self) -> dict[str, int]:
        add = sum(a.change in (Change.CREATE, Change.REPLACE) for a in self.actions)
        change = sum(a.change is Change.UPDATE for a in self.actions)
        destroy = sum(a.change in (Change.DELETE, Change.REPLACE) for a in self.actions)
        return {"add": add, "change": change, "destroy": destroy}

    def only(self, names: Iterable[str]) -> Plan:
        """The plan restricted to resources with these names (apply --target)."""
        wanted = set(names)
        actions = tuple(a for a in self.actions if a.name in wanted or a.address in wanted)
        return Plan(actions, notes=self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": 1,
            "changes": [a.to_json() for a in self.actions],
            "summary": self.counts(),
            "kept_without_prune": list(self.kept),
            "notes": [n.to_json() for n in self.notes],
        }


def _detail_lines(details: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in details.items():
        if isinstance(value, dict) and set(value) == {"from", "to"}:
            lines.append(f"{key}: {value['from']!r} -> {value['to']!r}")
        else:
            lines.append(f"{key}: {value!r}")
    return lines


def render(plan: Plan) -> str:
    """Terraform's way: a symbol, the address, a reason line, details; a summary line."""
    if plan.empty:
        text = "No changes. The host matches the manifest."
        if plan.kept:
            text += f"\n{_kept_note(plan)}"
        return text + _notes(plan)
    out = []
    for action in plan.actions:
        out.append(f"  {SYMBOLS[action.change]:>3} {action.address}")
        out.append(f"        # ({action.reason})")
        out.extend(f"        {line}" for line in _detail_lines(action.details))
    counts = plan.counts()
    out.append("")
    out.append(
        f"Plan: {counts['add']} to add, {counts['change']} to change, "
        f"{counts['destroy']} to destroy."
    )
    if plan.kept:
        out.append(_kept_note(plan))
    return "\n".join(out) + _notes(plan)


def _notes(plan: Plan) -> str:
    """`!` lines: what the plan cannot fix, and what to run."""
    lines = [f"\n  !   {n.address}\n        # ({n.message})" for n in plan.notes]
    return "\n" + "".join(lines) if lines else ""


def _kept_note(plan: Plan) -> str:
    return (
        f"Kept (managed, no longer in the manifest; --prune deletes them): {', '.join(plan.kept)}"
    )
