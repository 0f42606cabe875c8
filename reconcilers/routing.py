"""Engine routing: which lane serves a model, from its GGUF architecture. Pure.

`engine_routing.mode = "auto"` (the default):

1. A model whose manifest entry names an engine (`engine = "NAME"`) is pinned
   to that lane.
2. A model whose architecture an installed fork lane adds stays on that fork
   until the fork is retired: the retire period is the grace period before its
   models move to mainstream.
3. Otherwise the active mainstream engine, when it supports the architecture
   (recorded by a load probe; not probed yet counts as supported, and the
   engine's own load error is the answer then).
4. Otherwise the model is refused before any spawn, with a message that names
   the command to run: `blazar engine install --lane ID` when a catalog offer
   adds the architecture.

`engine_routing.policy = "fastest"` then looks past rules 2 and 3: when
another installed lane can load the model and the bench history holds a
decode figure of this very model file on both that lane's active engine and
the lane the rules chose, the faster one serves it. A lane without a figure
is never assumed faster; the rules' choice stands and `why` says what to
measure.

`"manual"` runs every model on its declared (or the default) lane, whatever
its architecture. The serve runtime (`blazar.serve.supervisor.runtime`) routes with this
when it builds what the gateway serves; `blazar diff` and `apply` show the
same refusals as plan notes (`reconcilers.apply`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from reconcilers.ports import ObservedLane, OfferView

AUTO, MANUAL = "auto", "manual"
MAINSTREAM, FASTEST = "mainstream", "fastest"  # engine_routing.policy
RETIRED = "retired"


@dataclass(frozen=True)
class Route:
    """Where a model runs: a lane and its active engine, or why it cannot run anywhere."""

    lane: str | None  # None: not served (no engine at all, or refused)
    tag: str | None
    why: str
    refusal: str | None = None  # the teaching error, when no engine supports the model


def _served(lane: ObservedLane) -> bool:
    return lane.active is not None and lane.state != RETIRED


def install_hint(architecture: str, offers: Sequence[OfferView], kind: str) -> str:
    """What to run for an architecture no installed engine supports."""
    adding = sorted(o.id for o in offers if o.kind == kind and architecture in o.architectures)
    if adding:
        lanes = " or ".join(f"`blazar engine install --lane {o}`" for o in adding)
        return f"run {lanes} (a fork lane that adds it), then retry"
    return (
        f"no engine supports architecture {architecture!r} and no catalog offer adds it; a "
        "llama.cpp fork that does can be served as a lane: list it, pinned by commit, in a "
        "catalog (engines.catalog), then `blazar engine install --lane ID`"
    )


def route(
    model: str,
    architecture: str | None,
    lanes: Sequence[ObservedLane],
    offers: Sequence[OfferView] = (),
    *,
    pin: str | None = None,
    default: str = "llamacpp",
    mode: str = AUTO,
    kind: str = "llamacpp",
    policy: str = MAINSTREAM,
    decode: Mapping[str, float] | None = None,
) -> Route:
    """The lane `model` (of GGUF `architecture`) runs on; `pin` is its declared lane;
    `decode`: the bench history's decode tokens/s of this model file by lane, each on that
    lane's active engine (read with `policy = "fastest"`)."""
    by_name = {lane.lane: lane for lane in lanes}
    if mode == MANUAL or pin is not None:
        name = pin or default
        lane = by_name.get(name)
        how = "pinned by the manifest" if pin is not None else "engine_routing.mode = 'manual'"
        if lane is None or lane.active is None:
            return Route(None, None, f"{how} to lane {name!r}, which has no engine installed")
        if lane.state == RETIRED:
            return Route(
                None,
                None,
                f"{how} to retired lane {name!r}",
                f"model '{model}' is pinned to the fork lane '{name}', which was retired "
                f"({lane.reason or 'mainstream supports its architectures'}): remove "
                f"models.{model}.engine from the manifest and apply",
            )
        if mode == AUTO and architecture and lane.support.get(architecture) is False:
            return Route(
                None,
                None,
                f"{how} to lane {name!r}, which cannot load {architecture}",
                f"model '{model}' is pinned to engine lane '{name}' ({lane.active}), which does "
                f"not support architecture '{architecture}': remove models.{model}.engine to "
                f"route it automatically, or {install_hint(architecture, offers, kind)}",
            )
        return Route(lane.lane, lane.active, how)
    chosen = _by_rules(model, architecture, lanes, offers, default, kind)
    if policy != FASTEST or chosen.lane is None:
        return chosen
    return _fastest(model, chosen, architecture, lanes, kind, decode or {})


def _fastest(
    model: str,
    chosen: Route,
    architecture: str | None,
    lanes: Sequence[ObservedLane],
    kind: str,
    decode: Mapping[str, float],
) -> Route:
    """`policy = "fastest"`: another lane that can load the model and decoded this file
    faster than the rules' lane, both measured; else the rules' choice, saying why."""
    rivals = [
        lane
        for lane in lanes
        if lane.lane != chosen.lane
        and lane.kind == kind
        and _served(lane)
        and (architecture is None or lane.support.get(architecture) is not False)
    ]
    own = decode.get(chosen.lane or "")
    measured = [lane for lane in rivals if lane.lane in decode]
    if own is None:
        if not rivals:
            return chosen
        return replace(
            chosen,
            why=f"{chosen.why}; policy fastest: {chosen.lane} has no decode figure for this "
            f"model file, so no lane is compared (`blazar bench {model} --engine "
            f"{chosen.tag}` measures it)",
        )
    best = max(measured, key=lambda lane: (decode[lane.lane], lane.lane), default=None)
    if best is None or decode[best.lane] <= own:
        return replace(
            chosen,
            why=f"{chosen.why}; policy fastest: the fastest measured ({own:.1f} tokens/s"
            + (f", {best.lane} {decode[best.lane]:.1f}" if best is not None else "")
            + ")",
        )
    return Route(
        best.lane,
        best.active,
        f"policy fastest: lane {best.lane!r} decodes it at {decode[best.lane]:.1f} tokens/s, "
        f"{chosen.lane!r} at {own:.1f} (bench history)",
    )


def _by_rules(
    model: str,
    architecture: str | None,
    lanes: Sequence[ObservedLane],
    offers: Sequence[OfferView],
    default: str,
    kind: str,
) -> Route:
    """Rules 2 to 4: a fork that adds the architecture, else mainstream, else a refusal."""
    forks = [
        lane
        for lane in lanes
        if lane.origin == "fork"
        and lane.kind == kind
        and _served(lane)
        and architecture is not None
        and architecture in lane.adds
    ]
    if forks:
        fork = min(forks, key=lambda f: (f.state != "active", f.lane))
        why = f"fork lane {fork.lane!r} adds {architecture}"
        if fork.state != "active":
            why += f" ({fork.state}: {fork.reason})" if fork.reason else f" ({fork.state})"
        return Route(fork.lane, fork.active, why)
    mainstream = next(
        (
            lane
            for lane in lanes
            if lane.origin == "mainstream"
            and lane.kind == kind
            and lane.active is not None
            and lane.lane == default
        ),
        None,
    ) or next(
        (
            lane
            for lane in lanes
            if lane.origin == "mainstream" and lane.kind == kind and lane.active is not None
        ),
        None,
    )
    if mainstream is None:
        return Route(None, None, f"no {kind} engine is installed")
    if not architecture:
        return Route(mainstream.lane, mainstream.active, "mainstream (architecture unknown)")
    support = mainstream.support.get(architecture)
    if support is None:
        return Route(mainstream.lane, mainstream.active, f"mainstream ({architecture} not probed)")
    if support:
        return Route(mainstream.lane, mainstream.active, f"mainstream supports {architecture}")
    return Route(
        None,
        None,
        f"no installed engine supports {architecture}",
        f"model '{model}' has architecture '{architecture}', which no installed engine supports "
        f"({mainstream.lane} {mainstream.active} does not load it): "
        f"{install_hint(architecture, offers, kind)}",
    )
