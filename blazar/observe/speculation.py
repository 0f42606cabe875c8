"""Which speculative decoding mode served an answer, and how much of the draft it took.

llama-server's `timings` carry `draft_n` (tokens drafted) and `draft_n_accepted` (those
the model accepted) once speculative decoding drafted anything for the request; the mode
is the model's (`Tuning.describe()`: off, ngram, draft:NAME). `acceptance` and
`spec_header` are pure: the traces use the first (`blazar.observe.trace`), and the
gateway may send the second on `/v1/chat/completions` answers as `x-blazar-spec`
(`ngram; accepted=0.62`).
"""

from __future__ import annotations

from typing import Any

HEADER = "x-blazar-spec"


def acceptance(timings: Any) -> tuple[int, int, float] | None:
    """(drafted, accepted, accepted / drafted) from an answer's `timings`; None when the
    engine drafted nothing (dense decoding, or no lookup hit)."""
    if not isinstance(timings, dict):
        return None
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(drafted, int) or isinstance(drafted, bool) or drafted <= 0:
        return None
    taken = accepted if isinstance(accepted, int) and not isinstance(accepted, bool) else 0
    return drafted, taken, taken / drafted


def spec_header(mode: str, timings: Any = None) -> str:
    """The `x-blazar-spec` value: the mode, and the acceptance rate when the answer's
    timings give one (`ngram; accepted=0.62`, `draft:qwen-0.5b; accepted=0.80`, `off`)."""
    found = acceptance(timings)
    return mode if found is None else f"{mode}; accepted={found[2]:.2f}"
