"""Planning is pure and table-tested; execute runs against in-memory fakes of the ports."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from reconcilers.apply import execute, make_plan
from reconcilers.desired import (
    Desired,
    DesiredEngine,
    DesiredKey,
    DesiredLora,
    DesiredModel,
    DesiredProjector,
)
from reconcilers.engines import PlanError, plan_engines
from reconcilers.errors import PermanentError, TemporaryError
from reconcilers.keys import plan_keys
from reconcilers.loras import plan_loras
from reconcilers.models import plan_models
from reconcilers.plan import Action, Change, Plan, render
from reconcilers.ports import (
    ObservedEngine,
    ObservedKey,
    ObservedLane,
    ObservedLora,
    ObservedModel,
    ObservedProjector,
    OfferView,
    Ports,
    Progress,
)
from tests.fixtures import OLD_ENGINE_VERSION

SHA_A, SHA_B = "a" * 64, "b" * 64


def tag_of(method: str, version: str, backend: str) -> str:
    return f"b{version.rsplit('.', 1)[-1].lstrip('b')}-{backend}"


def eng(tag: str, active: bool = False) -> ObservedEngine:
    return ObservedEngine("llamacpp", tag, "wheel", tag, active)


LATEST = DesiredEngine("llamacpp", "llamacpp", "wheel", "latest")
PINNED = DesiredEngine("llamacpp", "llamacpp", "wheel", OLD_ENGINE_VERSION)


@pytest.mark.parametrize(
    ("desired", "observed", "expected"),
    [
        ([LATEST], [], [("create", "no llamacpp engine is installed")]),
        ([LATEST], [eng("b1-cpu", active=True)], []),
        ([LATEST], [eng("b1-cpu")], [("create", "no llamacpp engine is installed")]),
        ([PINNED], [eng("b11063-cpu", active=True)], []),
        ([PINNED], [], [("create", "pinned b11063-cpu is not installed")]),
        (
            [PINNED],
            [eng("b11549-cpu", active=True)],
            [("update", "pinned b11063-cpu is not installed")],
        ),
        (
            [PINNED],
            [eng("b11549-cpu", active=True), eng("b11063-cpu")],
            [("update", "pinned b11063-cpu is installed but not active")],
        ),
        ([], [eng("b1-cpu", active=True)], []),  # engines are never deleted by apply
    ],
)
def test_plan_engines(
    desired: list[DesiredEngine], observed: list[ObservedEngine], expected: list[tuple[str, str]]
) -> None:
    actions = plan_engines(desired, observed, tag_of)
    assert [(str(a.change), a.reason) for a in actions] == expected


def test_two_engines_for_one_lane_is_a_plan_error() -> None:
    other = DesiredEngine("other", "llamacpp", "wheel", "latest")
    with pytest.raises(PlanError, match="both declare the llamacpp lane"):
        plan_engines([LATEST, other], [], tag_of)


def model(
    name: str = "m", sha: str | None = None, source: str = "file:///m.gguf", **settings: Any
) -> DesiredModel:
    return DesiredModel(name, source, sha, dict(settings))


def held(
    name: str = "m",
    sha: str = SHA_A,
    source: str = "file:///m.gguf",
    managed: bool = True,
    **settings: Any,
) -> ObservedModel:
    return ObservedModel(name, sha, source, 10, managed, dict(settings))


@pytest.mark.parametrize(
    ("desired", "observed", "prune", "expected", "kept"),
    [
        ([model()], [], False, [("create", "not in the store")], []),
        ([model(sha=SHA_A)], [held()], False, [], []),
        ([model(ctx=4096)], [held(ctx=4096)], False, [], []),
        ([model(sha=SHA_B)], [held()], False, [("replace", "its sha256 changed")], []),
        (
            [model(source="file:///n.gguf")],
            [held()],
            False,
            [("replace", "its source changed")],
            [],
        ),
        # Same bytes from a new address: record the new source, download nothing.
        (
            [model(sha=SHA_A, source="file:///n.gguf")],
            [held()],
            False,
            [("update", "source changed")],
            [],
        ),
        ([model(ctx=8192)], [held(ctx=4096)], False, [("update", "ctx changed")], []),
        (
            [model()],
            [held(managed=False)],
            False,
            [("update", "imported by hand; the manifest takes it over (same bytes)")],
            [],
        ),
        ([], [held()], False, [], ["models.m"]),
        ([], [held()], True, [("delete", "no longer in the manifest")], []),
        ([], [held(managed=False)], True, [], []),  # never touches what it does not manage
    ],
)
def test_plan_models(
    desired: list[DesiredModel],
    observed: list[ObservedModel],
    prune: bool,
    expected: list[tuple[str, str]],
    kept: list[str],
) -> None:
    actions, kept_now = plan_models(desired, observed, prune=prune)
    assert [(str(a.change), a.reason) for a in actions] == expected
    assert kept_now == kept


def test_plan_loras_and_keys() -> None:
    lora = DesiredLora("fox", "m", "file:///fox.gguf", None, {"scale": 1.0})
    have = ObservedLora("fox", "m", SHA_A, "file:///fox.gguf", True, {"scale": 0.5})
    actions, _ = plan_loras([lora], [have], prune=False)
    assert [(a.change, a.reason) for a in actions] == [(Change.UPDATE, "scale changed")]
    moved = ObservedLora("fox", "other", SHA_A, "file:///fox.gguf", True, {"scale": 1.0})
    actions, _ = plan_loras([lora], [moved], prune=False)
    assert [(a.change, a.reason) for a in actions] == [(Change.REPLACE, "its base model changed")]

    key = DesiredKey("ci", SHA_A, ("*",))
    actions, _ = plan_keys([key], [], prune=False)
    assert [a.change for a in actions] == [Change.CREATE]
    actions, _ = plan_keys([key], [ObservedKey("ci", SHA_B, ("*",), True)], prune=False)
    assert [(a.change, a.reason) for a in actions] == [(Change.UPDATE, "sha256 changed")]
    actions, kept = plan_keys([], [ObservedKey("old", SHA_B, ("*",), True)], prune=False)
    assert actions == [] and kept == ["keys.old"]


def test_render_like_terraform() -> None:
    plan = Plan.of(
        [
            Action(
                "model",
                "b",
                Change.REPLACE,
                "its sha256 changed",
                {"sha256": {"from": "x", "to": "y"}},
            ),
            Action("engine", "llamacpp", Change.CREATE, "no llamacpp engine is installed"),
            Action("model", "a", Change.UPDATE, "ctx changed", {"ctx": {"from": 1, "to": 2}}),
            Action("key", "old", Change.DELETE, "no longer in the manifest"),
        ]
    )
    assert render(plan).splitlines() == [
        "    + engines.llamacpp",
        "        # (no llamacpp engine is installed)",
        "    ~ models.a",
        "        # (ctx changed)",
        "        ctx: 1 -> 2",
        "  -/+ models.b",
        "        # (its sha256 changed)",
        "        sha256: 'x' -> 'y'",
        "    - keys.old",
        "        # (no longer in the manifest)",
        "",
        "Plan: 2 to add, 1 to change, 2 to destroy.",
    ]
    assert render(Plan()) == "No changes. The host matches the manifest."
    data = plan.to_json()
    assert data["summary"] == {"add": 2, "change": 1, "destroy": 2}
    assert [c["address"] for c in data["changes"]] == [
        "engines.llamacpp",
        "models.a",
        "models.b",
        "keys.old",
    ]


# -- execute against in-memory fakes ------------------------------------------


@dataclass
class FakeWorld:
    engines: list[ObservedEngine] = field(default_factory=list)
    models: dict[str, ObservedModel] = field(default_factory=dict)
    loras: dict[str, ObservedLora] = field(default_factory=dict)
    keys: dict[str, ObservedKey] = field(default_factory=dict)
    projectors: dict[str, ObservedProjector] = field(default_factory=dict)
    conditions: dict[tuple[str, str], tuple[bool, str]] = field(default_factory=dict)
    failures: dict[str, list[Exception]] = field(default_factory=dict)  # name -> errors to raise
    calls: list[str] = field(default_factory=list)
    lanes: list[ObservedLane] = field(default_factory=list)
    offers: list[OfferView] = field(default_factory=list)

    def _maybe_fail(self, name: str) -> None:
        pending = self.failures.get(name)
        if pending:
            raise pending.pop(0)


class Engines:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def observe(self) -> list[ObservedEngine]:
        return list(self.w.engines)

    def expected_tag(self, method: str, version: str, backend: str) -> str:
        return tag_of(method, version, backend)

    def install(self, kind: str, method: str, version: str | None, options: dict[str, Any]) -> str:
        tag = tag_of(method, version or "b9", "cpu")
        self.w.calls.append(f"install {tag}")
        self.w.engines.append(ObservedEngine(kind, tag, method, version or "b9", False))
        return tag

    def activate(self, kind: str, tag: str) -> None:
        self.w.calls.append(f"activate {tag}")
        self.w.engines = [
            ObservedEngine(e.kind, e.tag, e.method, e.version, e.tag == tag) for e in self.w.engines
        ]

    def lanes(self, architectures: set[str]) -> list[ObservedLane]:
        return list(self.w.lanes)

    def offers(self, catalog: str | None) -> list[OfferView]:
        return list(self.w.offers)

    def install_fork(self, lane: str, backend: str, catalog: str | None) -> str:
        self.w.calls.append(f"install fork {lane} {backend}")
        return f"fork-{lane}-0000000-{backend}"

    def set_lane_state(self, lane: str, state: str, reason: str, since: str) -> None:
        self.w.calls.append(f"lane {lane} {state}")
        self.w.lanes = [
            replace(x, state=state, reason=reason, since=since) if x.lane == lane else x
            for x in self.w.lanes
        ]

    def remove_lane(self, lane: str) -> None:
        self.w.calls.append(f"remove lane {lane}")
        self.w.lanes = [
            replace(x, tags=(), active=None) if x.lane == lane else x for x in self.w.lanes
        ]


class Models:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def observe(self) -> list[ObservedModel]:
        return list(self.w.models.values())

    def fetch(self, declared: DesiredModel, progress: Progress | None) -> None:
        name, sha256 = declared.name, declared.sha256 or SHA_A
        self.w.calls.append(f"fetch {name}")
        self.w._maybe_fail(name)
        self.w.models[name] = ObservedModel(
            name, sha256, declared.source, 1, True, declared.settings
        )

    def record(self, declared: DesiredModel) -> None:
        m = self.w.models[declared.name]
        self.w.models[declared.name] = replace(
            m, source=declared.source, managed=True, settings=declared.settings
        )

    def remove(self, name: str) -> None:
        del self.w.models[name]


class Loras:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def observe(self) -> list[ObservedLora]:
        return list(self.w.loras.values())

    def fetch(self, declared: DesiredLora, progress: Progress | None) -> None:
        d = declared
        self.w.calls.append(f"fetch lora {d.name}")
        self.w.loras[d.name] = ObservedLora(
            d.name, d.model, d.sha256 or SHA_A, d.source, True, d.settings
        )

    def record(self, declared: DesiredLora) -> None:
        raise AssertionError("not expected")

    def remove(self, name: str) -> None:
        del self.w.loras[name]


class Keys:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def observe(self) -> list[ObservedKey]:
        return list(self.w.keys.values())

    def put(self, name: str, sha256: str, models: tuple[str, ...]) -> None:
        self.w.keys[name] = ObservedKey(name, sha256, models, True)

    def remove(self, name: str) -> None:
        del self.w.keys[name]


class Projectors:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def observe(self) -> list[ObservedProjector]:
        return list(self.w.projectors.values())

    def fetch(self, declared: DesiredProjector, progress: Progress | None) -> None:
        model = declared.model
        self.w.calls.append(f"fetch projector {model}")
        self.w._maybe_fail(f"projector {model}")
        self.w.projectors[model] = ObservedProjector(
            model, declared.sha256 or SHA_B, declared.source, True, declared.settings
        )

    def record(self, declared: DesiredProjector) -> None:
        p = self.w.projectors[declared.model]
        self.w.projectors[declared.model] = replace(
            p, source=declared.source, managed=True, settings=declared.settings
        )

    def remove(self, model: str) -> None:
        del self.w.projectors[model]


class Status:
    def __init__(self, w: FakeWorld) -> None:
        self.w = w

    def set_condition(self, kind: str, name: str, ready: bool, reason: str, message: str) -> None:
        self.w.conditions[(kind, name)] = (ready, reason)


def ports(w: FakeWorld) -> Ports:
    return Ports(Engines(w), Models(w), Loras(w), Keys(w), Status(w), Projectors(w))


DESIRED = Desired(
    engines=(LATEST,),
    models=(DesiredModel("a", "file:///a.gguf", None), DesiredModel("b", "file:///b.gguf", None)),
    loras=(DesiredLora("fox", "a", "file:///fox.gguf", None, {"scale": 1.0}),),
    keys=(DesiredKey("ci", SHA_A, ("*",)),),
)


def test_apply_then_plan_again_is_empty() -> None:
    world = FakeWorld()
    plan = make_plan(DESIRED, ports(world))
    report = execute(plan, DESIRED, ports(world), sleep=lambda s: None)
    assert report.ok
    assert world.calls == [
        "install b9-cpu",
        "activate b9-cpu",
        "fetch a",
        "fetch b",
        "fetch lora fox",
    ]
    assert make_plan(DESIRED, ports(world)).empty
    assert all(ready for ready, _ in world.conditions.values())
    assert len(world.conditions) == 5


def test_temporary_errors_are_retried_with_backoff() -> None:
    world = FakeWorld(failures={"a": [TemporaryError("connection reset", delay=0.5), OSError("x")]})
    slept: list[float] = []
    report = execute(make_plan(DESIRED, ports(world)), DESIRED, ports(world), sleep=slept.append)
    assert report.ok
    assert slept == [0.5, 2.0]  # TemporaryError's own delay, then the default backoff doubled
    assert [o.attempts for o in report.outcomes if o.action.name == "a"] == [3]


def test_a_permanent_failure_skips_dependents_and_completes_the_rest() -> None:
    world = FakeWorld(failures={"a": [PermanentError("sha256 mismatch")]})
    report = execute(make_plan(DESIRED, ports(world)), DESIRED, ports(world), sleep=lambda s: None)
    assert not report.ok
    failed = {o.action.name: o for o in report.failed}
    assert set(failed) == {"a", "fox"}
    assert failed["a"].attempts == 1 and failed["fox"].skipped
    assert "b" in world.models and "ci" in world.keys  # the independent ones completed
    assert world.conditions[("model", "a")] == (False, "ApplyFailed")
    assert world.conditions[("lora", "fox")] == (False, "DependencyFailed")
    assert world.conditions[("model", "b")] == (True, "Applied")
