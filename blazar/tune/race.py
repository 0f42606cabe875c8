"""The decision of a tune stage: adopt a candidate only when it beats the baseline. Pure.

The figure compared is each run's tokens/s as a client sees it (`blazar.tune.measure`):
for the decoding modes (spec-race, ngram), the speed the answers stream at, from each
first token to its last, since prompts cost the same in every mode but one, whose cost
shows in the time to first token reported beside it (a draft model reads each prompt
too); for the other stages, end to end, prompts included (slots, batch sizes and the
prompt cache change both). A candidate's figure is the median of its runs; it is
adopted only when that median beats the baseline's by more than the threshold (5% by
default), and the figures are printed either way: measured, never assumed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figures:
    """One candidate's measurements: per run, and medians over the runs."""

    label: str
    runs: tuple[float, ...]  # tokens/s of each run, by `figure`
    decode_tps: float | None = None  # the engine's own decode speed (timings), median
    prompt_tps: float | None = None
    ttft_s: float | None = None  # time to first token, median over requests
    acceptance: float | None = None  # drafted tokens accepted / drafted (None: no drafts)
    memory_mb: float | None = None  # resident memory of its children after the runs
    argv: tuple[str, ...] = ()
    settings: dict[str, object] = field(default_factory=dict)
    figure: str = "e2e"  # e2e: tokens over the run's time; stream: over the streaming time
    error: str | None = None  # why its child did not start (it has no runs then)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else 0.0


@dataclass(frozen=True)
class Decision:
    winner: str  # the label adopted: the baseline's when no candidate beat it
    adopted: bool  # a candidate other than the baseline won
    best: str | None  # the best of the others
    gain: float  # best's median over the baseline's, minus 1
    threshold: float
    reason: str


def decide(figures: Sequence[Figures], baseline: str, threshold: float) -> Decision:
    """Adopt the best candidate if its median beats the baseline's by more than
    `threshold`; keep the baseline otherwise (and when it could not be measured)."""
    base = next(f for f in figures if f.label == baseline)
    others = [f for f in figures if f.label != baseline and f.runs]
    if not others:
        return Decision(baseline, False, None, 0.0, threshold, f"kept {baseline}: nothing to race")
    best = max(others, key=lambda f: f.median)
    if base.median <= 0:
        reason = f"kept {baseline}: it could not be measured"
        return Decision(baseline, False, best.label, 0.0, threshold, reason)
    gain = best.median / base.median - 1
    how = "streamed" if best.figure == "stream" else "end to end"
    change = (
        f"{best.label} {best.median:.1f} vs {baseline} {base.median:.1f} tokens/s {how} "
        f"({gain:+.1%}, median of {len(best.runs)} runs)"
    )
    if gain > threshold:
        reason = f"adopted {best.label}: {change}, above the {threshold:.0%} threshold"
        return Decision(best.label, True, best.label, gain, threshold, reason)
    reason = f"kept {baseline}: {change}, not above the {threshold:.0%} threshold"
    return Decision(baseline, False, best.label, gain, threshold, reason)
