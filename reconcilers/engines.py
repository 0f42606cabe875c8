"""The engines reconciler: one active engine per declared lane, at the pinned version.

`version = "latest"` is satisfied by any active engine (newer releases are
adopted by `blazar engine update`, behind its regression gate); a pinned
version must be the active one, installed first if needed. Engines are never
deleted by apply: removing one is `blazar engine rm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reconcilers.desired import LATEST, DesiredEngine
from reconcilers.plan import Action, Change
from reconcilers.ports import EnginesPort, ObservedEngine

TagOf = Callable[[str, str, str], str]  # (method, version, backend) -> tag


class PlanError(ValueError):
    """The desired state cannot be planned (a conflict the schema cannot see)."""


def plan_engines(
    desired: Sequence[DesiredEngine], observed: Sequence[ObservedEngine], tag_of: TagOf
) -> list[Action]:
    """Pure: the engine actions that make each declared lane's active engine right."""
    lanes: dict[str, str] = {}
    for engine in desired:
        if engine.kind in lanes:
            raise PlanError(
                f"engines {lanes[engine.kind]!r} and {engine.name!r} both declare the "
                f"{engine.kind} lane; a lane has one active engine: keep one declaration"
            )
        lanes[engine.kind] = engine.name
    actions = []
    for engine in desired:
        mine = [o for o in observed if o.kind == engine.kind]
        active = next((o for o in mine if o.active), None)
        details: dict[str, object] = {
            "kind": engine.kind,
            "install": engine.method,
            "version": engine.version,
        }
        if engine.version == LATEST:
            if active is None:
                actions.append(
                    Action(
                        "engine",
                        engine.name,
                        Change.CREATE,
                        f"no {engine.kind} engine is installed",
                        details,
                    )
                )
            continue
        tag = tag_of(engine.method, engine.version, engine.backend)
        if active is not None and active.tag == tag:
            continue
        installed = any(o.tag == tag for o in mine)
        details = {**details, "tag": tag}
        if active is not None:
            details["active"] = {"from": active.tag, "to": tag}
        reason = (
            f"pinned {tag} is installed but not active"
            if installed
            else f"pinned {tag} is not installed"
        )
        change = Change.CREATE if active is None and not installed else Change.UPDATE
        actions.append(Action("engine", engine.name, change, reason, details))
    return actions


def apply_engine(action: Action, desired: DesiredEngine, port: EnginesPort) -> None:
    """Install (when needed) and activate the engine the action names."""
    tag = action.details.get("tag")
    installed = {o.tag for o in port.observe() if o.kind == desired.kind}
    if tag is None or tag not in installed:
        version = None if desired.version == LATEST else desired.version
        tag = port.install(desired.kind, desired.method, version, dict(desired.options))
    port.activate(desired.kind, tag)
