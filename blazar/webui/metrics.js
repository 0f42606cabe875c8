// Metrics: the gateway's own series over the last hour (one point every few seconds, kept
// in serve's memory): requests/s, time to first token p50/p95, decode tokens/s, the prompt
// cache hit ratio, the response cache's hit ratio (docs/cache.md), queue depth and
// requests in flight, memory. New points arrive on the event stream.

import { el, clear, bytes } from "./util.js";
import { lineChart } from "./chart.js";

export const id = "metrics";
export const title = "Metrics";

let root, ctx, visible = false, dirty = true;

const CHARTS = [
  { title: "Requests per second", lines: [["requests/s", "requests_per_second"], ["errors/s", "errors_per_second"]],
    format: (v) => v.toFixed(2) },
  { title: "Time to first token", lines: [["p50 ms", "ttft_p50_ms"], ["p95 ms", "ttft_p95_ms"]],
    format: (v) => `${v.toFixed(0)} ms` },
  { title: "Decode tokens per second", lines: [["median per request", "decode_tokens_per_second"], ["generated in all", "generated_tokens_per_second"]],
    format: (v) => v.toFixed(0) },
  { title: "Prompt cache hit ratio", lines: [["cached / prompt tokens", "cache_hit_ratio"]],
    format: (v) => `${(v * 100).toFixed(0)}%`, max: 1 },
  { title: "Response cache hit ratio", lines: [["hits / cacheable requests", "response_cache_hit_ratio"]],
    format: (v) => `${(v * 100).toFixed(0)}%`, max: 1 },
  { title: "Queue depth and requests in flight", lines: [["queued", "queue_depth"], ["in flight", "in_flight"]],
    format: (v) => v.toFixed(0) },
  { title: "Memory (resident)", lines: [["children", "memory_bytes"], ["gateway", "gateway_memory_bytes"]],
    format: (v) => bytes(v) },
];

export function mount(node, context) {
  root = node;
  ctx = context;
  ctx.on("series", () => { if (visible) render(); else dirty = true; });
  ctx.on("hello", render);
  render();
}

export function show() { visible = true; if (dirty) render(); }
export function hide() { visible = false; }

function render() {
  dirty = false;
  clear(root);
  const { points, every } = ctx.state.series;
  root.append(el("h2", {}, "Metrics ", el("small", { text: `last hour, a point every ${every} s (${points.length} points)` })));
  if (!ctx.isAdmin()) {
    root.append(el("p", { class: "empty", text: "Metrics need an admin key (as /metrics does)." }));
    return;
  }
  const times = points.map((p) => p.t);
  const grid = el("div", { class: "charts" });
  for (const chart of CHARTS) {
    const lines = chart.lines.map(([label, key]) => ({ label, values: points.map((p) => p[key]) }));
    grid.append(el("figure", { class: "card", dataset: { chart: chart.lines[0][1] } },
      el("figcaption", { text: chart.title }),
      lineChart({ title: chart.title, times, lines, format: chart.format, max: chart.max ?? null })));
  }
  root.append(grid);
}
