"""The gateway's own figures over the last hour, for the dashboard's charts (`/ui`, Metrics).

`blazar.serve.state.events.EventBus` appends one `point` every SAMPLE_EVERY seconds to a
`Series` (at most WINDOW seconds of them, so memory stays bounded: 1,800 small dicts).
A point summarizes the requests finished since the previous one (an `Interval` their
trace records were added to) and what runs now (queue depth, requests in flight, the
children's resident memory). `point` is a pure function of those facts, tested with
tables; reading /proc is `rss_bytes`'s, the one effect here.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

SAMPLE_EVERY = 2.0  # seconds between points
WINDOW = 3600.0  # seconds of points kept
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (`share` 0.5 is the median); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


class Interval:
    """What the requests finished since the last point add up to (`add` each record).

    Counts and token sums are exact; first-token times and rates are kept for the
    percentiles up to MAX_VALUES per point (a busier interval's later ones are left out).
    """

    MAX_VALUES = 10_000

    def __init__(self) -> None:
        self.requests = self.errors = self.prompt = self.cached = self.generated = 0
        self.cache_hits = self.cache_lookups = 0  # the response cache (docs/cache.md)
        self.ttft: list[float] = []
        self.rates: list[float] = []

    def add(self, record: dict[str, Any]) -> None:
        self.requests += 1
        if not 200 <= int(record.get("status") or 0) < 300:
            self.errors += 1
        self.prompt += record.get("prompt_tokens") or 0
        self.cached += record.get("cached_tokens") or 0
        self.generated += record.get("generated_tokens") or 0
        looked = record.get("response_cache")
        if looked and str(looked.get("result") or "").startswith(("hit", "miss")):
            self.cache_lookups += 1
            self.cache_hits += str(looked["result"]).startswith("hit")
        if (ttft := record.get("ttft_ms")) is not None and len(self.ttft) < self.MAX_VALUES:
            self.ttft.append(float(ttft))
        if (rate := record.get("tokens_per_second")) and len(self.rates) < self.MAX_VALUES:
            self.rates.append(float(rate))


def point(
    when: float,
    seconds: float,
    done: Interval,
    *,
    queue_depth: int,
    in_flight: int,
    memory_bytes: int | None,
    gateway_bytes: int | None,
) -> dict[str, Any]:
    """One sample: the requests finished in the last `seconds` and what runs at `when`."""
    seconds = max(seconds, 1e-9)

    def rounded(value: float | None, digits: int = 2) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "t": round(when, 3),
        "requests_per_second": round(done.requests / seconds, 3),
        "errors_per_second": round(done.errors / seconds, 3),
        "ttft_p50_ms": rounded(percentile(done.ttft, 0.5)),
        "ttft_p95_ms": rounded(percentile(done.ttft, 0.95)),
        "decode_tokens_per_second": rounded(statistics.median(done.rates) if done.rates else None),
        "generated_tokens_per_second": round(done.generated / seconds, 2),
        "cache_hit_ratio": rounded(done.cached / done.prompt if done.prompt else None, 4),
        "response_cache_hit_ratio": rounded(
            done.cache_hits / done.cache_lookups if done.cache_lookups else None, 4
        ),
        "queue_depth": queue_depth,
        "in_flight": in_flight,
        "memory_bytes": memory_bytes,
        "gateway_memory_bytes": gateway_bytes,
    }


class Series:
    """The points of the last WINDOW seconds, oldest first."""

    def __init__(self, every: float = SAMPLE_EVERY, window: float = WINDOW) -> None:
        self.every = every
        self.points: deque[dict[str, Any]] = deque(maxlen=max(1, int(window / every)))

    def add(self, sample: dict[str, Any]) -> None:
        self.points.append(sample)

    def view(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "window": self.every * (self.points.maxlen or 0),
            "points": list(self.points),
        }


def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of a process (Linux /proc); None when it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
