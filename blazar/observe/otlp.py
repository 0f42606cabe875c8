"""Request spans over OTLP/HTTP, when `serving.otlp_endpoint` is set.

One span per request (its route, model, replica, tokens, status), with child spans
for its queue wait, its model's load and its generation, exported in batches by
`opentelemetry-sdk` from a background thread (the `otlp` extra: `pip install
'blazar[otlp]'`). The spans are built from a finished trace after the answer went
out, with the times the trace measured; a request's 32-hex-digit `x-request-id` is
its OpenTelemetry trace id, so a trace in Blazar and one in the collector share
their id. `blazar.serve.state.tracing` makes the `SpanExporter` and calls `export`.
"""

from __future__ import annotations

import random
from typing import Any

from blazar.errors import BlazarError

TRACES_PATH = "/v1/traces"


class OtlpUnavailable(BlazarError):
    pass


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: `endpoint` itself when it names a path, else /v1/traces."""
    _, _, rest = endpoint.partition("://")
    return endpoint if "/" in rest.strip("/") else f"{endpoint.rstrip('/')}{TRACES_PATH}"


class SpanExporter:
    """A tracer provider exporting to one collector; `close` flushes what is pending."""

    def __init__(self, endpoint: str, service: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import IdGenerator
        except ImportError:
            raise OtlpUnavailable(
                "serving.otlp_endpoint is set but opentelemetry-sdk is not installed: "
                "run `pip install 'blazar[otlp]'` (or remove serving.otlp_endpoint)"
            ) from None

        class TraceIds(IdGenerator):  # type: ignore[misc]
            """Random ids, except the trace id set for the next root span."""

            next_trace_id: int | None = None

            def generate_span_id(self) -> int:
                return random.getrandbits(64) or 1

            def generate_trace_id(self) -> int:
                chosen, self.next_trace_id = self.next_trace_id, None
                return chosen or random.getrandbits(128) or 1

        from opentelemetry.trace import SpanKind, set_span_in_context

        self.endpoint = traces_url(endpoint)
        self._ids = TraceIds()
        self._kind = SpanKind.SERVER
        self._in_context = set_span_in_context
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service}), id_generator=self._ids
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint), schedule_delay_millis=500)
        )
        self.tracer = self.provider.get_tracer("blazar")

    def export(self, record: dict[str, Any], timing: dict[str, int]) -> None:
        """Queue the spans of one finished request. `timing`: wall-clock ns of start, end,
        and (when it was leased) lease_begin, leased, and first (first output)."""
        try:
            self._ids.next_trace_id = int(record["id"], 16) if len(record["id"]) == 32 else None
        except ValueError:
            self._ids.next_trace_id = None
        attributes = {
            key: value
            for key, value in {
                "blazar.trace_id": record["id"],
                "blazar.protocol": record.get("protocol"),
                "blazar.requested": record.get("requested"),
                "blazar.model": record.get("model"),
                "blazar.adapter": record.get("adapter"),
                "blazar.instance": record.get("instance"),
                "blazar.replica": record.get("replica"),
                "blazar.decision": record.get("decision"),
                "blazar.finish_reason": record.get("finish_reason"),
                "gen_ai.request.model": record.get("requested"),
                "gen_ai.usage.input_tokens": record.get("prompt_tokens"),
                "gen_ai.usage.output_tokens": record.get("generated_tokens"),
                "http.route": record.get("route"),
                "http.response.status_code": record.get("status"),
            }.items()
            if value is not None
        }
        root = self.tracer.start_span(
            f"POST {record.get('route')}",
            kind=self._kind,
            start_time=timing["start"],
            attributes=attributes,
        )
        context = self._in_context(root)
        if "leased" in timing:
            queue_end = timing["lease_begin"] + timing.get("queue", 0)
            self._child("queue wait", timing["lease_begin"], queue_end, context)
            if timing.get("load"):
                self._child("load", queue_end, timing["leased"], context)
            self._child("generation", timing["leased"], timing["end"], context)
        root.end(end_time=timing["end"])

    def _child(self, name: str, start: int, end: int, context: Any) -> None:
        span = self.tracer.start_span(name, context=context, start_time=start)
        span.end(end_time=max(start, end))

    def close(self) -> None:
        self.provider.shutdown()
