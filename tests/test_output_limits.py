"""One list of the fields a request sets its output limit with (`steps.OUTPUT_LIMITS`),
read the same way by the preflight's count, the model defaults and the cap.

The bug this pins: the list stood three times, differently. The preflight's copy had no
`max_output_tokens`, so a body limited only by it counted as asking for no output, while
the cap (admission's copy, with it) and the defaults (steps' copy, in another order) read
it. The property runs over every mix of the fields with hostile values (negative, zero,
booleans, text, floats), alone or together, with other fields around them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.serve.request import prompts, steps

VALUES = st.one_of(
    st.integers(min_value=-5, max_value=1 << 40),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.text(max_size=4),
)
BODIES = st.dictionaries(
    st.sampled_from([*steps.OUTPUT_LIMITS, "num_predict", "temperature", "model"]),
    VALUES,
    max_size=6,
)


def first_limit(body: dict[str, Any]) -> int:
    """The limit a body asks for: the first field of the list that holds a positive int."""
    for key in steps.OUTPUT_LIMITS:
        value = body.get(key)
        if type(value) is int and value > 0:
            return value
    return 0


@settings(max_examples=300)
@given(BODIES)
def test_the_preflight_reads_every_output_limit_field(body: dict[str, Any]) -> None:
    assert prompts.requested_output(body) == first_limit(body)


@settings(max_examples=300)
@given(BODIES, st.integers(min_value=1, max_value=4096))
def test_a_models_num_predict_yields_to_any_limit_the_request_set(
    body: dict[str, Any], default: int
) -> None:
    out = dict(body)
    steps.with_defaults(out, "/v1/chat/completions", None, {"num_predict": default})
    if any(key in body for key in steps.OUTPUT_LIMITS):
        assert out.get("n_predict") == body.get("n_predict")
    else:
        assert out["n_predict"] == default


def test_max_output_tokens_alone_is_a_limit() -> None:
    assert prompts.requested_output({"max_output_tokens": 12}) == 12
