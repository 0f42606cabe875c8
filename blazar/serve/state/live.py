"""What the gateway reports about itself right now: the scrape-time part of `/metrics`, the
children's own metrics, and the live summary `blazar watch` and `blazar doctor` read.

`StateCollector` is registered on the observer's registry (`blazar.serve.state.tracing`)
and reads the scheduler when `/metrics` is scraped: queue depth, instances by
state, evictions, build info, plus the children's `llamacpp:*` families that
`scrape_children` fetched just before (each ready child's `/metrics`, within
SCRAPE_TIMEOUT; a child that does not answer is skipped). `stats` builds the
summary of `/api/blazar/stats` from the scheduler, the registry's counters and the
ring of recent traces.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from blazar import __version__
from blazar.observe.cachebust import Tracker
from blazar.observe.trail import COLD_LOAD_MS
from blazar.serve.supervisor.instance import State
from blazar.serve.supervisor.scheduler import Pool, Scheduler

SCRAPE_TIMEOUT = 1.0  # seconds for all children's /metrics together
RECENT = 60.0  # seconds of traces behind the summary's recent figures


def pools(scheduler: Scheduler | None) -> list[Pool]:
    """Every pool the scheduler has: elders and retired ones (still draining) included."""
    if scheduler is None:
        return []
    return scheduler.all_pools()


async def scrape_children(of: list[Pool]) -> list[tuple[str, int, str]]:
    """(model, replica, /metrics text) of each ready child that answered in time."""
    targets = [
        (pool.runtime.name, member.instance.spec.replica, url)
        for pool in of
        for member in pool.members
        if member.instance.state == State.READY and (url := member.instance.url)
    ]
    if not targets:
        return []
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def scrape(url: str) -> str | None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
                async with session.get(f"{url}/metrics") as resp:
                    if resp.status == 200:
                        return await resp.text()
            return None

        texts = await asyncio.gather(*(scrape(url) for _, _, url in targets))
    return [
        (model, replica, text)
        for (model, replica, _), text in zip(targets, texts, strict=True)
        if text is not None
    ]


class StateCollector:
    """The families read at scrape time, and the children's scraped just before."""

    def __init__(
        self, scheduler: Callable[[], Scheduler | None], children: Callable[[], list[Metric]]
    ) -> None:
        self.scheduler, self.children = scheduler, children

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        scheduler = self.scheduler()
        queue = GaugeMetricFamily(
            "blazar_queue_depth", "Requests waiting for a slot, by model.", labels=["model"]
        )
        instances = GaugeMetricFamily(
            "blazar_instances", "Instances by model and state.", labels=["model", "state"]
        )
        evictions = CounterMetricFamily(
            "blazar_evictions_total",
            "Models unloaded for another's load, by reason: memory (serving.memory_budget), "
            "count (serving.max_loaded_models), group (an exclusive group's other).",
            labels=["model", "reason"],
        )
        used = GaugeMetricFamily(
            "blazar_memory_used_bytes",
            "Bytes the loaded models' footprints take on each device (every GPU, else host "
            "RAM), measured or estimated.",
            labels=["device"],
        )
        budget = GaugeMetricFamily(
            "blazar_memory_budget_bytes",
            "What models may use on each device (serving.memory_budget).",
            labels=["device"],
        )
        pegged = GaugeMetricFamily(
            "blazar_warm_peg_bytes",
            "Bytes of an unloaded warm_peg model's files held in memory, by model.",
            labels=["model"],
        )
        if scheduler is not None:
            for device in scheduler.memory_use():
                used.add_metric([device["device"]], device["used"])
                budget.add_metric([device["device"]], device["budget"])
            for model, size in scheduler.pegs.sizes().items():
                pegged.add_metric([model], size)
        info = GaugeMetricFamily(
            "blazar_build_info",
            "Blazar's version and the engines serving.",
            labels=["version", "engine"],
        )
        counts: dict[tuple[str, str], int] = {}
        queued: dict[str, int] = {}  # a model and its elder (docs/lora.md) are one model
        engines: set[str] = set()
        for pool in pools(scheduler):
            name = pool.runtime.name
            engines.add(pool.runtime.engine_tag)
            if not pool.retired:
                queued[name] = queued.get(name, 0) + len(pool.waiters)
                for each in State:
                    counts.setdefault((name, str(each)), 0)
            for member in pool.members:
                at = (name, str(member.instance.state))
                counts[at] = counts.get(at, 0) + 1
        for name, n in queued.items():
            queue.add_metric([name], n)
        for (name, state_name), n in sorted(counts.items()):
            instances.add_metric([name, state_name], n)
        for (name, reason), n in sorted((scheduler.evictions if scheduler else {}).items()):
            evictions.add_metric([name, reason], n)
        for engine in sorted(engines) or [""]:
            info.add_metric([__version__, engine], 1)
        yield from (queue, instances, evictions, used, budget, pegged, info)
        yield from self.children()


def stats(
    scheduler: Scheduler | None,
    registry: CollectorRegistry,
    ring: deque[dict[str, Any]],
    tracker: Tracker,
) -> dict[str, Any]:
    """Instances, per-model totals and recent figures, rejections, cache-busting clients."""
    instances = []
    for pool in pools(scheduler):
        for member in pool.members:
            inst = member.instance
            instances.append(
                {
                    "model": pool.runtime.name,
                    "replica": inst.spec.replica,
                    "state": str(inst.state),
                    "in_flight": member.in_flight,
                    "queued": len(pool.waiters),
                    "restarts": getattr(inst, "restarts", 0),
                    "last_error": getattr(inst, "last_error", None),
                    "retired": pool.retired,
                }
            )
    totals, rejected = _totals(registry.collect())
    return {
        "time": time.time(),
        "instances": instances,
        "models": {
            m: {**t, **_recent(ring, m), **_cold_loads(ring, m)} for m, t in sorted(totals.items())
        },
        "rejected": rejected,
        "cache_busters": [b.to_dict() for b in tracker.busters()],
    }


_TOTALS = {
    "blazar_requests_total": "requests",
    "blazar_prompt_tokens_total": "prompt_tokens",
    "blazar_prompt_tokens_cached_total": "cached_tokens",
    "blazar_generated_tokens_total": "generated_tokens",
    "blazar_sentinel_detections_total": "sentinels",
    "blazar_cache_busts_total": "cache_busts",
}


def _totals(families: Iterable[Metric]) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Per-model totals and rejections by reason, from the registry's own samples."""
    totals: dict[str, dict[str, Any]] = {}
    rejected: dict[str, float] = {}
    for family in families:
        if family.name.startswith("llamacpp:"):
            continue
        for sample in family.samples:
            if sample.name == "blazar_rejected_total":
                rejected[sample.labels["reason"]] = sample.value
                continue
            key = _TOTALS.get(sample.name)
            model = sample.labels.get("model")
            if key is None or not model:
                continue
            row = totals.setdefault(model, {**dict.fromkeys(_TOTALS.values(), 0), "errors": 0})
            row[key] += sample.value
            if key == "requests" and not sample.labels.get("status", "").startswith("2"):
                row["errors"] += sample.value
    return totals, rejected


def _cold_loads(ring: deque[dict[str, Any]], model: str) -> dict[str, Any]:
    """The requests of the traces kept (the ring) that waited for their model to start,
    for at least `COLD_LOAD_MS` (doctor's "slow to first token after idle")."""
    slow = [
        r["load_ms"]
        for r in ring
        if r["model"] == model
        and r.get("decision") == "spawned"
        and (r.get("load_ms") or 0) >= COLD_LOAD_MS
    ]
    return {"cold_loads": {"count": len(slow), "max_ms": max(slow)}} if slow else {}


def _recent(ring: deque[dict[str, Any]], model: str) -> dict[str, Any]:
    """The last RECENT seconds of one model's traces: rate and medians."""
    since = time.time() - RECENT
    rows = [r for r in ring if r["model"] == model and r["time"] >= since]

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    return {
        "recent": {
            "seconds": RECENT,
            "requests": len(rows),
            "requests_per_second": round(len(rows) / RECENT, 3),
            "ttft_ms": median("ttft_ms"),
            "tokens_per_second": median("tokens_per_second"),
            "duration_ms": median("duration_ms"),
        }
    }
