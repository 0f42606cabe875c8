"""The gateway's Prometheus metrics: families per model, and the children's own, relabelled.

`Metrics` owns one `CollectorRegistry` (one per gateway app, so tests can run
several in a process) with the request families below; `blazar.serve.state.tracing`
calls `observe` once per finished request (off the answer's way out) and
`instance_event` for a child's start and crash, and registers a collector for what
is read at scrape time (queue depth, instances, evictions, build info, the
children's `llamacpp:*` metrics: `relabel`). The request families are plain
numbers per label tuple (`_Family`), exposed through prometheus_client's metric
families when scraped, so counting a request costs about a microsecond.
Labels are bounded: model (the served ones; "" for a name that resolved to
none), replica, protocol, status, reason, check; never one per request or user text.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from blazar.observe.trace import Trace

# Seconds: milliseconds (a cached short answer) to minutes (a long prompt on a CPU).
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
TOKEN_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Spread:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= le
        self.sum += value

    def observe_ns(self, values: Iterable[int]) -> None:
        """`observe` of each of `values`, nanoseconds (a stream's gaps: one loop, not a
        call each)."""
        counts, bounds, total = self.counts, self.bounds, 0
        for ns in values:
            counts[bisect_left(bounds, ns / 1e9)] += 1
            total += ns
        self.sum += total / 1e9


class _Family:
    """A counter or histogram family: a child per label tuple, made on first use.

    Plain numbers, not prometheus_client's Counter/Histogram: those take a lock and
    walk their buckets in Python on every update (about 1 us each, several per
    request); these are updated on the event loop thread only and turned into
    prometheus_client metric families when /metrics is scraped (`collect`).
    """

    __slots__ = ("bounds", "children", "doc", "labels", "name")

    def __init__(
        self, name: str, doc: str, labels: list[str], bounds: Iterable[float] | None = None
    ) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.bounds = tuple(bounds) if bounds is not None else None
        self.children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *labels: str) -> Any:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = (
                _Count() if self.bounds is None else _Spread(self.bounds)
            )
        return child

    def collect(self) -> Metric:
        if self.bounds is None:
            counter = CounterMetricFamily(self.name, self.doc, labels=self.labels)
            for labels, count in self.children.items():
                counter.add_metric(labels, count.value)
            return counter
        histogram = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        names = [repr(float(b)) for b in self.bounds] + ["+Inf"]
        for labels, spread in self.children.items():
            total, buckets = 0, []
            for le, n in zip(names, spread.counts, strict=True):
                total += n
                buckets.append((le, float(total)))
            histogram.add_metric(labels, buckets, spread.sum)
        return histogram


class Metrics:
    """The request, load and rejection families of one gateway."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: list[_Family] = []

        def counter(name: str, doc: str, labels: list[str]) -> _Family:
            family = _Family(name, doc, labels)
            self.families.append(family)
            return family

        def histogram(name: str, doc: str, labels: list[str], buckets: Iterable[float]) -> _Family:
            family = _Family(name, doc, labels, buckets)
            self.families.append(family)
            return family

        by_model = ["model", "protocol"]
        self.requests = counter(
            "blazar_requests_total",
            "Requests answered, by model, protocol and HTTP status.",
            ["model", "protocol", "status"],
        )
        self.duration = histogram(
            "blazar_request_duration_seconds",
            "From arrival to the answer's last byte.",
            by_model,
            LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            "blazar_time_to_first_token_seconds",
            "From arrival to the first output token (streams: as sent; whole answers: the "
            "wait plus the engine's prompt time).",
            by_model,
            LATENCY_BUCKETS,
        )
        self.itl = histogram(
            "blazar_inter_token_latency_seconds",
            "Between output events of a stream.",
            ["model"],
            TOKEN_BUCKETS,
        )
        self.queue_wait = histogram(
            "blazar_queue_wait_seconds",
            "Time a request waited in its model's queue for a slot.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter(
            "blazar_prompt_tokens_total", "Prompt tokens, cached ones included.", ["model"]
        )
        self.cached_tokens = counter(
            "blazar_prompt_tokens_cached_total",
            "Prompt tokens the engine reused from its cache (divide by blazar_prompt_tokens_total "
            "for the hit ratio).",
            ["model"],
        )
        self.generated_tokens = counter(
            "blazar_generated_tokens_total", "Tokens generated.", ["model"]
        )
        self.images = counter(
            "blazar_images_total", "Pictures drawn by image models (/v1/images/*).", ["model"]
        )
        self.image_seconds = counter(
            "blazar_image_generation_seconds_total",
            "Seconds image models spent drawing (divide by blazar_images_total for seconds "
            "per picture).",
            ["model"],
        )
        self.loads = counter(
            "blazar_model_loads_total", "Instances started (a load, or a restart).", ["model"]
        )
        self.load_seconds = histogram(
            "blazar_model_load_seconds",
            "From spawning an instance to its first healthy answer.",
            ["model"],
            LOAD_BUCKETS,
        )
        self.restarts = counter(
            "blazar_child_restarts_total",
            "Instances that exited while ready and are restarted.",
            ["model", "replica"],
        )
        self.rejected = counter(
            "blazar_rejected_total",
            "Requests refused before reaching a model: busy (no slot, no room to load), "
            "preflight, auth, rate.",
            ["reason"],
        )
        self.sentinels = counter(
            "blazar_sentinel_detections_total",
            "Answers a sentinel flagged: empty, truncated, invalid_json, schema_mismatch.",
            ["model", "check"],
        )
        self.cache_busts = counter(
            "blazar_cache_busts_total",
            "Requests whose changed system prompt re-prefilled a continuing conversation.",
            ["model"],
        )

        self.registry.register(self)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect()

    def observe(self, trace: Trace, busted: bool) -> None:
        """Count one finished request."""
        asked, placement, result = trace.asked, trace.placement, trace.result
        model = placement.model or ""
        protocol = asked.protocol
        self.requests(model, protocol, str(result.status)).inc()
        self.duration(model, protocol).observe(result.duration_ns / 1e9)
        if result.rejected:
            self.rejected(result.rejected).inc()
        if not model:
            return
        if result.first_ns is not None:
            self.ttft(model, protocol).observe(result.first_ns / 1e9)
        decision = placement.decision
        if decision is not None:
            self.queue_wait(model).observe(decision.queue_ns / 1e9)
        if result.gaps:
            self.itl(model).observe_ns(result.gaps)
        out = result.outcome
        if out is not None:
            if out.prompt_tokens:
                self.prompt_tokens(model).inc(out.prompt_tokens)
            if out.cached_tokens:
                self.cached_tokens(model).inc(out.cached_tokens)
            if out.generated_tokens:
                self.generated_tokens(model).inc(out.generated_tokens)
            if out.images:
                self.images(model).inc(out.images)
                if out.predicted_ms:
                    self.image_seconds(model).inc(out.predicted_ms / 1000)
        for detection in result.detections or ():
            self.sentinels(model, detection.check).inc()
        if busted:
            self.cache_busts(model).inc()


class CacheCollector:
    """The response cache's figures (`blazar.serve.request.cache.ResponseCache.stats`),
    read when scraped: hits and misses per tier, bypasses, evictions by reason, entries
    and bytes (docs/cache.md)."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from cache_metrics(self.stats())


def cache_metrics(stats: Mapping[str, Any]) -> list[Metric]:
    """The response cache's families from its stats (pure)."""
    hits = CounterMetricFamily(
        "blazar_response_cache_hits", "Requests answered from the response cache.", labels=["tier"]
    )
    misses = CounterMetricFamily(
        "blazar_response_cache_misses",
        "Lookups that found no entry (exact: every cacheable request not answered by the "
        "exact tier; semantic: those the semantic tier looked up and did not answer).",
        labels=["tier"],
    )
    for tier in ("exact", "semantic"):
        hits.add_metric([tier], stats["hits"].get(tier, 0))
        misses.add_metric([tier], stats["misses"].get(tier, 0))
    bypasses = CounterMetricFamily(
        "blazar_response_cache_bypasses",
        "Requests the response cache did not look up (headers, sampled, not replayable).",
        value=stats["bypasses"],
    )
    evictions = CounterMetricFamily(
        "blazar_response_cache_evictions",
        "Entries deleted: ttl, max_bytes, model changed or removed, key removed, cleared.",
        labels=["reason"],
    )
    for reason, count in sorted(stats["evictions"].items()):
        evictions.add_metric([reason], count)
    entries = GaugeMetricFamily(
        "blazar_response_cache_entries", "Answers in the response cache.", value=stats["entries"]
    )
    size = GaugeMetricFamily(
        "blazar_response_cache_bytes", "The response cache's entries' bytes.", value=stats["bytes"]
    )
    return [hits, misses, bypasses, evictions, entries, size]


def rejection(status: int, code: str | None) -> str | None:
    """Why a request was refused before reaching a model, from its status and code: busy,
    preflight, auth or rate (None when it was not refused that way)."""
    if code in ("all_slots_busy", "max_loaded_models"):
        return "busy"
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate"
    if code and ("preflight" in code or "context_length" in code):
        return "preflight"
    return None


def relabel(scraped: Iterable[tuple[str, int, str]]) -> list[Metric]:
    """The children's own metrics (`llamacpp:*`, from llama-server's `/metrics`), one family
    each, every sample labelled with its child's model and replica."""
    families: dict[str, Metric] = {}
    for model, replica, text in scraped:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError:
            continue  # a child that answered garbage is skipped, like one that did not answer
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type
                )
            for sample in family.samples:
                labels = {**sample.labels, "model": model, "replica": str(replica)}
                merged.add_sample(sample.name, labels, sample.value, sample.timestamp)
    return list(families.values())
