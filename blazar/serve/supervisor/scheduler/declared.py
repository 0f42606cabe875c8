"""What the manifest tells the scheduler beyond each model's runtime: the GPUs a model may
use (`models.NAME.devices`), which models are warm-pegged (`models.NAME.warm_peg`) and
the serving-wide peg budget and fairness window.

The daemon sets one `Declared` on the scheduler each pass (`Declared.of(manifest)`), as
it sets the groups; `blazar coreside` builds one from the manifest when no serve runs.
Pure: a value made from the manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from specs.manifest import Manifest
from specs.names import parse_name

DEFAULT_PEG_BUDGET = "25%"
DEFAULT_FAIRNESS = 10.0


@dataclass(frozen=True)
class Declared:
    """Per model (by the short name it is served under): the GPUs it may be placed on and
    whether it is warm-pegged; and serving's peg budget and fairness window (seconds)."""

    devices: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    pegs: frozenset[str] = frozenset()
    peg_budget: int | str = DEFAULT_PEG_BUDGET
    fairness_window: float = DEFAULT_FAIRNESS

    @classmethod
    def of(cls, manifest: Manifest) -> Declared:
        """Pure: what the manifest declares."""
        models = {parse_name(name).short: model for name, model in manifest.models.items()}
        return cls(
            devices={n: tuple(m.devices) for n, m in models.items() if m.devices},
            pegs=frozenset(n for n, m in models.items() if m.warm_peg),
            peg_budget=manifest.serving.warm_peg_budget,
            fairness_window=float(manifest.serving.fairness_window),
        )
