"""The engines reconciler: one active engine per declared lane, and fork lanes retired.

`version = "latest"` is satisfied by any active engine (newer releases are
adopted by `blazar engine update`, behind its regression gate); a pinned
version must be the active one, installed first if needed. A declared fork
lane (`lane = "ID"`) is installed from the catalog when absent. Engines are
never deleted by apply (removing one is `blazar engine rm`), except a fork
lane's: `plan_forks` marks a fork retiring once the active mainstream engine
supports every architecture it adds, retires it after `fork_retire_days` (its
models then route to mainstream) and removes its engines once nothing runs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from reconcilers.desired import LATEST, DesiredEngine
from reconcilers.plan import Action, Change, Note
from reconcilers.ports import EnginesPort, ObservedEngine, ObservedLane
from specs.engines import PACKAGE_ENGINES, SOURCE_ENGINES

TagOf = Callable[[str, str, str], str]  # (method, version, backend) -> tag


def audio_tag(kind: str, version: str) -> str:
    """The tag of a package engine (whisper, piper, mistralrs): its package and version,
    such as faster-whisper-1.2.1 (`blazar.engines.audio` installs it under that tag)."""
    return f"{PACKAGE_ENGINES[kind]}-{version}"


def sdcpp_tag(version: str, backend: str = "cpu") -> str:
    """The tag of an sdcpp engine: sdcpp-0.4.7-cpu, the stable-diffusion-cpp-python sdist's
    version and the backend (`blazar.engines.sdcpp` installs it under that tag)."""
    return f"sdcpp-{version}-{backend}"


def pinned_tag(engine: DesiredEngine, tag_of: TagOf) -> str:
    """The tag a pinned engine is installed under: a package engine's and an sdcpp
    engine's follow from their kind; llama.cpp's from the install method (`tag_of`)."""
    if engine.kind in PACKAGE_ENGINES:
        return audio_tag(engine.kind, engine.version)
    if engine.kind in SOURCE_ENGINES:
        return sdcpp_tag(engine.version, engine.backend)
    return tag_of(engine.method, engine.version, engine.backend)


class PlanError(ValueError):
    """The desired state cannot be planned (a conflict the schema cannot see)."""


def plan_engines(
    desired: Sequence[DesiredEngine], observed: Sequence[ObservedEngine], tag_of: TagOf
) -> list[Action]:
    """Pure: the engine actions that make each declared lane's active engine right."""
    lanes: dict[str, str] = {}
    for engine in desired:
        if engine.lane_name in lanes:
            raise PlanError(
                f"engines {lanes[engine.lane_name]!r} and {engine.name!r} both declare the "
                f"{engine.lane_name} lane; a lane has one active engine: keep one declaration"
            )
        lanes[engine.lane_name] = engine.name
    actions = []
    for engine in desired:
        if engine.fork:
            continue  # `plan_fork_installs`: they need the lanes' states
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
        tag = pinned_tag(engine, tag_of)
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


def apply_engine(
    action: Action, desired: DesiredEngine, port: EnginesPort, catalog: str | None = None
) -> None:
    """Install (when needed) and activate the engine the action names."""
    if desired.fork:
        built = port.install_fork(desired.lane_name, desired.backend, catalog)
        port.activate(desired.lane_name, built)
        return
    tag = action.details.get("tag")
    installed = {o.tag for o in port.observe() if o.kind == desired.kind}
    if tag is None or tag not in installed:
        version = None if desired.version == LATEST else desired.version
        tag = port.install(desired.kind, desired.method, version, dict(desired.options))
    port.activate(desired.kind, tag)


def plan_fork_installs(
    desired: Sequence[DesiredEngine], lanes: Sequence[ObservedLane]
) -> tuple[list[Action], list[Note]]:
    """Pure: install each declared fork lane that is absent; a note for a retired one."""
    by_name = {lane.lane: lane for lane in lanes}
    actions, notes = [], []
    for engine in desired:
        if not engine.fork:
            continue
        lane = by_name.get(engine.lane_name)
        if lane is not None and lane.state == RETIRED:
            notes.append(
                Note(
                    f"engines.{engine.name}",
                    f"fork lane {engine.lane_name!r} was retired ({lane.reason}); its models "
                    f"run on mainstream now: remove [engines.{engine.name}] from the manifest",
                )
            )
            continue
        if lane is not None and lane.active is not None:
            continue
        details: dict[str, object] = {"lane": engine.lane_name, "backend": engine.backend}
        reason = f"fork lane {engine.lane_name!r} is not installed"
        actions.append(Action("engine", engine.name, Change.CREATE, reason, details))
    return actions, notes


ACTIVE, RETIRING, RETIRED = "active", "retiring", "retired"


def caught_up(fork: ObservedLane, lanes: Sequence[ObservedLane]) -> str | None:
    """Why the active mainstream engine of the fork's kind now supports every architecture
    the fork adds, or None while it does not (or its support is not recorded yet)."""
    mainstream = next(
        (
            lane
            for lane in lanes
            if lane.origin == "mainstream" and lane.kind == fork.kind and lane.active
        ),
        None,
    )
    if mainstream is None or not fork.adds:
        return None
    if not all(mainstream.support.get(arch) is True for arch in fork.adds):
        return None
    upstream = f"b{fork.upstream}" if fork.upstream is not None else None
    if upstream and mainstream.build is not None and mainstream.build < (fork.upstream or 0):
        return None  # the catalog says it landed later than this build
    archs = ", ".join(fork.adds)
    since = f", added upstream in {upstream}" if upstream else ""
    return f"mainstream {mainstream.lane} {mainstream.active} supports {archs}{since}"


def _since(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def days_left(lane: ObservedLane, now: datetime, retire_days: int) -> int:
    """Whole days (rounded up) until a retiring lane is retired; 0 when it is due."""
    since = _since(lane.since) or now
    left = since + timedelta(days=retire_days) - now
    return max(0, math.ceil(left.total_seconds() / 86400))


def plan_forks(lanes: Sequence[ObservedLane], now: datetime, retire_days: int) -> list[Action]:
    """Pure: mark, retire and remove fork lanes whose architectures mainstream caught up on."""
    actions = []
    stamp = now.isoformat(timespec="seconds")

    def move(lane: ObservedLane, to: str, change: Change, reason: str, why: str) -> None:
        details: dict[str, object] = {
            "lane": lane.lane,
            "state": {"from": lane.state, "to": to},
            "since": stamp,
            "why": why,
        }
        actions.append(Action("engine", lane.lane, change, reason, details))

    for lane in lanes:
        if lane.origin != "fork":
            continue
        pids = ", ".join(str(p) for p in lane.in_use)
        if lane.state == RETIRED:
            if lane.tags and not lane.in_use:
                move(lane, RETIRED, Change.DELETE, "retired; nothing runs it now", lane.reason)
            continue
        why = caught_up(lane, lanes)
        if lane.state == ACTIVE and why is not None:
            reason = f"{why}: retiring in {retire_days} days (engine_routing.fork_retire_days)"
            move(lane, RETIRING, Change.UPDATE, reason, why)
        elif lane.state == RETIRING and why is None:
            reason = "mainstream no longer supports every architecture it adds"
            move(lane, ACTIVE, Change.UPDATE, reason, "")
        elif lane.state == RETIRING and days_left(lane, now, retire_days) == 0:
            reason = f"{lane.reason}; its {retire_days}-day retire period is over"
            if lane.in_use:
                reason += f": its models move to mainstream, then it is removed (pids {pids})"
                move(lane, RETIRED, Change.UPDATE, reason, lane.reason)
            else:
                move(lane, RETIRED, Change.DELETE, reason, lane.reason)
    return actions


def apply_fork_state(action: Action, port: EnginesPort) -> None:
    """Carry out one `plan_forks` action: a state change, and removal for a delete."""
    state = action.details["state"]
    assert isinstance(state, dict)
    lane, why, since = (str(action.details[k]) for k in ("lane", "why", "since"))
    if state["from"] != state["to"]:
        port.set_lane_state(lane, state["to"], why, since)
    if action.change == Change.DELETE:
        port.remove_lane(lane)
