"""Seeing what the host does: request traces, response sentinels, cache-bust detection,
metrics and span export.

The gateway (its observer, `blazar.serve.state.tracing`, and the one request path,
`blazar.serve.request.pipeline` and `exchange`) fills a `trace.Trace` per request; the
pure parts here read it: `outcome` (what the engine answered: text,
finish reason, usage, timings), `sentinels` (checks on each answer), `cachebust`
(a client whose system prompt changes every turn), `trail` (a trace as a routing
trail, for `blazar why`). `metrics` holds the Prometheus families, `trace_store`
keeps traces in the store, `otlp` exports spans when `serving.otlp_endpoint` is set.
Nothing here imports the gateway.
"""
