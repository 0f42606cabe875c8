"""The plan skeleton the models, adapters and keys reconcilers share (`reconcilers.planner`),
with tables: create, compare, prune or keep, and the file rule models and adapters share.
The kinds' own rules are tests/test_reconcilers.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from reconcilers.plan import Change
from reconcilers.planner import Verdict, bytes_change, plan_kind, settings_change

A, B = "a" * 64, "b" * 64


@dataclass(frozen=True)
class Want:
    name: str
    value: int = 0


@dataclass(frozen=True)
class Have:
    name: str
    value: int = 0
    managed: bool = True


def compare(want: Want, have: Have) -> Verdict | None:
    if want.value == have.value:
        return None
    return Verdict(
        Change.UPDATE, "value changed", {"value": {"from": have.value, "to": want.value}}
    )


@pytest.mark.parametrize(
    ("desired", "observed", "prune", "actions", "kept"),
    [
        ([], [], False, [], []),
        ([Want("x")], [], False, [("create", "x", "not in the store", {"v": 0})], []),
        ([Want("x")], [Have("x")], False, [], []),  # the same: no action
        (
            [Want("x", 2)],
            [Have("x", 1)],
            False,
            [("update", "x", "value changed", {"value": {"from": 1, "to": 2}})],
            [],
        ),
        ([], [Have("x")], False, [], ["things.x"]),  # managed, not declared: kept, listed
        ([], [Have("x")], True, [("delete", "x", "no longer in the manifest", {"gone": 0})], []),
        ([], [Have("x", managed=False)], True, [], []),  # never what it does not manage
        # declarations first, in their order; then deletions, in the observed order
        (
            [Want("b"), Want("a")],
            [Have("z"), Have("b", 5), Have("y")],
            True,
            [
                ("update", "b", "value changed", {"value": {"from": 5, "to": 0}}),
                ("create", "a", "not in the store", {"v": 0}),
                ("delete", "z", "no longer in the manifest", {"gone": 0}),
                ("delete", "y", "no longer in the manifest", {"gone": 0}),
            ],
            [],
        ),
    ],
)
def test_plan_kind(
    desired: list[Want],
    observed: list[Have],
    prune: bool,
    actions: list[tuple[str, str, str, dict[str, Any]]],
    kept: list[str],
) -> None:
    got, kept_now = plan_kind(
        "thing",
        desired,
        observed,
        prune=prune,
        compare=compare,
        created=lambda w: {"v": w.value},
        deleted=lambda h: {"gone": h.value},
    )
    assert [(str(a.change), a.name, a.reason, a.details) for a in got] == actions
    assert all(a.kind == "thing" for a in got)
    assert kept_now == kept


@pytest.mark.parametrize(
    ("sha", "source", "held_sha", "held_source", "expected"),
    [
        (None, "file:///a", A, "file:///a", None),
        (A, "file:///a", A, "file:///a", None),
        (B, "file:///a", A, "file:///a", ("its sha256 changed", "sha256", A, B)),
        (
            None,
            "file:///b",
            A,
            "file:///a",
            ("its source changed", "source", "file:///a", "file:///b"),
        ),
        (A, "file:///b", A, "file:///a", None),  # the same pinned bytes from a new address
        (B, "file:///b", A, "file:///a", ("its sha256 changed", "sha256", A, B)),  # sha first
    ],
)
def test_bytes_change(
    sha: str | None,
    source: str,
    held_sha: str,
    held_source: str,
    expected: tuple[str, str, str, str] | None,
) -> None:
    verdict = bytes_change(sha, source, held_sha, held_source, {"source": source, "extra": 1})
    if expected is None:
        assert verdict is None
        return
    reason, field, old, new = expected
    assert verdict is not None and verdict.change is Change.REPLACE and verdict.reason == reason
    assert verdict.details[field] == {"from": old, "to": new} and verdict.details["extra"] == 1
    assert next(iter(verdict.details)) == "source"  # the declaration's order is kept


def test_settings_change() -> None:
    assert settings_change({"ctx": 1}, "s", {"ctx": 1}, "s") == {}
    assert settings_change({"ctx": 2}, "t", {"ctx": 1, "pin": True}, "s") == {
        "ctx": {"from": 1, "to": 2},
        "pin": {"from": True, "to": None},
        "source": {"from": "s", "to": "t"},
    }


def test_plan_kind_names_resources_by_key() -> None:
    """Projectors are named after their model: `key` picks the name, `missing` the reason."""

    @dataclass(frozen=True)
    class Projector:
        model: str
        managed: bool = True

    got, kept = plan_kind(
        "projector",
        [Projector("v")],
        [Projector("u")],
        prune=False,
        created=lambda p: {},
        compare=lambda want, have: None,
        key=lambda p: p.model,
        missing="not held",
    )
    assert [(a.name, a.reason) for a in got] == [("v", "not held")] and kept == ["projectors.u"]
