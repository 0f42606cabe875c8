"""The vision projectors reconciler: its plan table, and its order in an apply.

Planned purely (`reconcilers.projectors.plan_projectors`) and executed through the
in-memory ports of `tests.test_reconcilers`: a projector follows its model and is
skipped when the model fails.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconcilers.apply import execute, make_plan
from reconcilers.desired import DesiredProjector
from reconcilers.errors import PermanentError
from reconcilers.plan import Change
from reconcilers.ports import ObservedProjector
from reconcilers.projectors import plan_projectors
from tests.test_reconcilers import DESIRED, SHA_A, SHA_B, FakeWorld, ports

AUTO = DesiredProjector("v", "auto", None, {"model_source": "hf://o/r:Q4_K_M"})
HELD_AUTO = ObservedProjector("v", SHA_B, "auto", True, {"model_source": "hf://o/r:Q4_K_M"})


@pytest.mark.parametrize(
    ("desired", "observed", "prune", "expected"),
    [
        ([AUTO], [], False, [("v", Change.CREATE)]),
        ([AUTO], [HELD_AUTO], False, []),
        (
            [replace(AUTO, settings={"model_source": "hf://o/r:Q8_0"})],
            [HELD_AUTO],
            False,
            [("v", Change.REPLACE)],
        ),  # auto follows its model's repo
        (
            [DesiredProjector("v", "file:///p.gguf", None)],
            [HELD_AUTO],
            False,
            [("v", Change.REPLACE)],
        ),
        ([replace(AUTO, sha256=SHA_A)], [HELD_AUTO], False, [("v", Change.REPLACE)]),
        ([AUTO], [replace(HELD_AUTO, managed=False)], False, [("v", Change.UPDATE)]),
        ([], [HELD_AUTO], False, []),  # kept without --prune
        ([], [HELD_AUTO], True, [("v", Change.DELETE)]),
    ],
)
def test_plan_projectors(
    desired: list[DesiredProjector],
    observed: list[ObservedProjector],
    prune: bool,
    expected: list[tuple[str, Change]],
) -> None:
    actions, kept = plan_projectors(desired, observed, prune=prune)
    assert [(a.name, a.change) for a in actions] == expected
    assert kept == (["projectors.v"] if observed and not desired and not prune else [])


def test_a_projector_follows_its_model_and_is_skipped_when_the_model_fails() -> None:
    desired = replace(DESIRED, projectors=(DesiredProjector("a", "file:///p.gguf", None),))
    world = FakeWorld()
    report = execute(make_plan(desired, ports(world)), desired, ports(world), sleep=lambda s: None)
    assert report.ok
    assert world.calls.index("fetch a") < world.calls.index("fetch projector a")
    assert make_plan(desired, ports(world)).empty
    world = FakeWorld(failures={"a": [PermanentError("sha256 mismatch")]})
    report = execute(make_plan(desired, ports(world)), desired, ports(world), sleep=lambda s: None)
    failed = sorted((o.action.kind, o.action.name, o.skipped) for o in report.failed)
    assert failed == [("lora", "fox", True), ("model", "a", False), ("projector", "a", True)]
    assert world.conditions[("projector", "a")] == (False, "DependencyFailed")
    assert "fetch projector a" not in world.calls
