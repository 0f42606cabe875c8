"""Engine routing and fork retirement are pure decisions: tables of cases, an injected clock.

Also the catalog's parser: each bad offer is refused with its reason, the good ones stay.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from blazar.engines.catalog import parse_catalog, parse_offer
from reconcilers.apply import route_notes
from reconcilers.desired import Desired, DesiredEngine, DesiredModel, DesiredRouting
from reconcilers.engines import days_left, plan_fork_installs, plan_forks
from reconcilers.plan import Change, Plan, render
from reconcilers.ports import ObservedLane, ObservedModel, OfferView
from reconcilers.routing import route

SHA, TREE = "ab" * 20, "2" * 40
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MAIN = ObservedLane(
    "llamacpp",
    "llamacpp",
    "mainstream",
    active="b11549-cpu",
    build=11549,
    support={"llama": True, "nova": False, "zeta": False},
)
FORK = ObservedLane(
    "nova",
    "llamacpp",
    "fork",
    active="fork-nova-1111111-cpu",
    adds=("nova",),
    upstream=12000,
    tags=("fork-nova-1111111-cpu",),
    since="2026-11-01T00:00:00+00:00",
)
CAUGHT_UP = replace(MAIN, active="b12345-cpu", build=12345, support={"llama": True, "nova": True})
OFFERS = [OfferView("nova", "llamacpp", ("nova",), SHA)]


# -- route ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "lanes", "pin", "mode", "lane", "refused"),
    [
        ("llama", [MAIN, FORK], None, "auto", "llamacpp", None),
        ("nova", [MAIN, FORK], None, "auto", "nova", None),  # the fork adds it
        ("nova", [MAIN], None, "auto", None, "blazar engine install --lane nova"),
        ("zeta", [MAIN, FORK], None, "auto", None, "no catalog offer adds it"),
        ("mystery", [MAIN], None, "auto", "llamacpp", None),  # not probed: the load tells
        (None, [MAIN], None, "auto", "llamacpp", None),
        ("nova", [CAUGHT_UP, replace(FORK, state="retiring")], None, "auto", "nova", None),
        ("nova", [CAUGHT_UP, replace(FORK, state="retired")], None, "auto", "llamacpp", None),
        ("nova", [MAIN, FORK], "llamacpp", "auto", None, "pinned to engine lane 'llamacpp'"),
        ("llama", [MAIN, FORK], "nova", "auto", "nova", None),  # a pin wins
        ("nova", [MAIN, FORK], None, "manual", "llamacpp", None),  # manual: no routing
        ("nova", [MAIN, replace(FORK, state="retired")], "nova", "auto", None, "was retired"),
        ("llama", [], None, "auto", None, None),  # nothing installed: not served, not refused
    ],
)
def test_route(
    arch: str | None,
    lanes: list[ObservedLane],
    pin: str | None,
    mode: str,
    lane: str | None,
    refused: str | None,
) -> None:
    decided = route("m", arch, lanes, OFFERS, pin=pin, mode=mode)
    assert decided.lane == lane, decided.why
    if refused is None:
        assert decided.refusal is None
    else:
        assert decided.refusal is not None and refused in decided.refusal
        assert "model 'm'" in decided.refusal


def test_refusal_names_every_offer_and_the_engine_that_rejects() -> None:
    offers = [*OFFERS, OfferView("nova2", "llamacpp", ("nova", "x"), SHA)]
    refusal = route("m", "nova", [MAIN], offers).refusal
    assert refusal is not None
    assert "`blazar engine install --lane nova` or `blazar engine install --lane nova2`" in refusal
    assert "llamacpp b11549-cpu does not load it" in refusal


# -- retirement -----------------------------------------------------------------------------


def one(actions: list) -> tuple[Change, str, str]:  # type: ignore[type-arg]
    assert len(actions) == 1, actions
    state = actions[0].details["state"]
    return actions[0].change, state["from"], state["to"]


def test_a_fork_stays_while_mainstream_lacks_its_architecture() -> None:
    assert plan_forks([MAIN, FORK], NOW, 14) == []


def test_caught_up_marks_retiring_with_the_reason() -> None:
    actions = plan_forks([CAUGHT_UP, FORK], NOW, 14)
    assert one(actions) == (Change.UPDATE, "active", "retiring")
    why = actions[0].details["why"]
    assert why == "mainstream llamacpp b12345-cpu supports nova, added upstream in b12000"
    assert (
        "retiring in 14 days" in actions[0].reason
        and actions[0].details["since"] == NOW.isoformat()
    )


@pytest.mark.parametrize(
    "mainstream",
    [
        replace(CAUGHT_UP, build=11999),  # the catalog says it landed in b12000
        replace(CAUGHT_UP, support={"nova": False}),  # the probe says no
        replace(CAUGHT_UP, support={}),  # not probed yet
    ],
)
def test_not_caught_up_without_the_build_and_the_recorded_support(
    mainstream: ObservedLane,
) -> None:
    assert plan_forks([mainstream, FORK], NOW, 14) == []


def test_retire_period_with_an_injected_clock() -> None:
    since = NOW - timedelta(days=13, hours=23)
    retiring = replace(FORK, state="retiring", since=since.isoformat(), reason="why")
    assert plan_forks([CAUGHT_UP, retiring], NOW, 14) == []  # an hour to go
    assert days_left(retiring, NOW, 14) == 1
    later = NOW + timedelta(hours=1)
    assert days_left(retiring, later, 14) == 0
    # due, nothing runs it: retired and removed in one step
    assert one(plan_forks([CAUGHT_UP, retiring], later, 14)) == (
        Change.DELETE,
        "retiring",
        "retired",
    )
    # due, an instance still runs it: retired (its models re-route), removed once drained
    busy = replace(retiring, in_use=(4242,))
    actions = plan_forks([CAUGHT_UP, busy], later, 14)
    assert one(actions) == (Change.UPDATE, "retiring", "retired") and "4242" in actions[0].reason
    retired = replace(busy, state="retired")
    assert plan_forks([CAUGHT_UP, retired], later, 14) == []  # waits for the drain
    drained = replace(retired, in_use=())
    assert one(plan_forks([CAUGHT_UP, drained], later, 14)) == (Change.DELETE, "retired", "retired")
    assert plan_forks([CAUGHT_UP, replace(drained, tags=())], later, 14) == []  # history only


def test_mainstream_rolled_back_un_retires() -> None:
    retiring = replace(FORK, state="retiring", since=NOW.isoformat())
    assert one(plan_forks([MAIN, retiring], NOW, 14)) == (Change.UPDATE, "retiring", "active")


def test_declared_fork_installs_and_a_retired_one_is_a_note() -> None:
    nova = DesiredEngine("nova", "llamacpp", "fork", "latest", lane="nova")
    actions, notes = plan_fork_installs([nova], [MAIN])
    assert [(a.change, a.details["lane"]) for a in actions] == [(Change.CREATE, "nova")]
    assert plan_fork_installs([nova], [MAIN, FORK]) == ([], [])
    actions, notes = plan_fork_installs([nova], [MAIN, replace(FORK, state="retired")])
    assert actions == [] and "remove [engines.nova]" in notes[0].message


# -- plan notes -----------------------------------------------------------------------------


def test_route_notes_in_the_plan_text_and_json() -> None:
    desired = Desired(
        models=(DesiredModel("a", "file:///a", None), DesiredModel("b", "file:///b", None)),
        routing=DesiredRouting(),
    )
    observed = [
        ObservedModel("a", "0" * 64, "file:///a", 1, True, architecture="nova"),
        ObservedModel("b", "0" * 64, "file:///b", 1, True, architecture="llama"),
    ]
    notes = route_notes(desired, observed, [MAIN], OFFERS)
    assert [n.address for n in notes] == ["models.a"]
    text = render(Plan.of([], notes=notes))
    assert "No changes." in text and "!   models.a" in text
    assert "blazar engine install --lane nova" in text
    assert Plan.of([], notes=notes).to_json()["notes"][0]["address"] == "models.a"
    # a fork lane this plan installs adds it: nothing to say
    coming = replace(
        desired, engines=(DesiredEngine("n", "llamacpp", "fork", "latest", lane="nova"),)
    )
    assert route_notes(coming, observed, [MAIN], OFFERS) == []


# -- the catalog ----------------------------------------------------------------------------

GOOD = {
    "repo": "https://example.org/fork.git",
    "commit": SHA,
    "tree": TREE,
    "architectures": ["nova"],
}


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"commit": SHA[:12]}, "not a full commit SHA"),
        ({"commit": "main"}, "never a branch or tag"),
        ({"commit": SHA.upper()}, "40 lowercase hex"),
        ({"tree": None}, "needs a digest"),
        ({"tree": "abc"}, "not a git tree hash"),
        ({"tree": None, "archive": "https://x/a.tar.gz", "sha256": "f" * 63}, "64 lowercase hex"),
        ({"architectures": []}, "adds no architecture"),
        ({"architectures": "nova"}, "architectures must be a list"),
        ({"build_options": ["--fast"]}, "cmake -D options"),
        ({"upstream": "12000"}, "not a mainstream build"),
        ({"repo": "not a url"}, "repo must be a git URL"),
        ({"branch": "main"}, "unknown key(s) branch"),
        ({"kind": "vllm"}, "not a kind Blazar serves"),
        ({"backends": ["rocm"]}, "backends must list some of cpu, cuda"),
        ({"backends": []}, "backends must list some of"),
        ({"build_minutes": 0}, "build_minutes must be a whole number"),
        ({"build_minutes": "an hour"}, "build_minutes must be a whole number"),
    ],
)
def test_bad_offers_are_refused(change: dict[str, object], refused: str) -> None:
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        parse_offer("nova", body)


def test_a_catalog_keeps_its_good_offers_beside_refused_ones() -> None:
    text = f"""
[offers.nova]
repo = "file:///r.git"
commit = "{SHA}"
tree = "{TREE}"
architectures = ["nova"]
upstream = "b12000"

[offers.short]
repo = "file:///r.git"
commit = "{SHA[:7]}"
tree = "{TREE}"
architectures = ["x"]

[offers.llamacpp]
repo = "file:///r.git"
commit = "{SHA}"
tree = "{TREE}"
architectures = ["y"]
"""
    catalog = parse_catalog(text, "test")
    assert list(catalog.offers) == ["nova"] and set(catalog.refused) == {"short", "llamacpp"}
    nova = catalog.get("nova")
    assert nova.tag("cpu") == f"fork-nova-{SHA[:7]}-cpu" and nova.upstream == 12000
    assert [o.id for o in catalog.adding("nova")] == ["nova"]
    with pytest.raises(Exception, match="is refused: commit"):
        catalog.get("short")
    with pytest.raises(Exception, match=r"has no offer 'nope'.*offers: nova"):
        catalog.get("nope")
