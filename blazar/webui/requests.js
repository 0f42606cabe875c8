// Requests: every traced request as it runs and when it finishes (model, route, protocol,
// status, time to first token, tokens/s, cache hit ratio); a click opens its routing trail
// (GET /api/ui/trail/ID: the lines `blazar why` prints, sentinels, the cache-bust fix).

import { getJSON } from "./api.js";
import { el, clear, badge, ms, pct, clock, table } from "./util.js";

export const id = "requests";
export const title = "Requests";

let root, ctx, list, panel, opened = null, visible = false, dirty = false, pending = null;

// Many requests a second re-render the table at most every 100 ms.
function soon() {
  if (!pending) pending = setTimeout(() => { pending = null; render(); }, 100);
}

export function mount(node, context) {
  root = node;
  ctx = context;
  list = el("div", { class: "requests" });
  panel = el("div", { class: "trail card", hidden: true });
  root.append(el("h2", { text: "Requests" }), panel, list);
  ctx.on("requests", () => { if (visible) soon(); else dirty = true; });
  ctx.on("hello", render);
  render();
}

export function show() { visible = true; if (dirty) render(); }
export function hide() { visible = false; }

function status(row) {
  if (!row.done) return badge("running", "warn");
  const ok = row.status >= 200 && row.status < 300;
  return badge(String(row.status), ok ? "ok" : "error");
}

function flags(row) {
  const out = [];
  for (const check of row.sentinels || []) out.push(badge(check, "warn"));
  if (row.cache_finding) out.push(badge(row.cache_finding, "warn"));
  if (row.remote) out.push(badge("remote", "info"));
  return out;
}

async function open(row) {
  opened = row.key;
  panel.hidden = false;
  clear(panel).append(el("h3", { text: `trace ${row.id}` }));
  if (!row.done) {
    panel.append(el("p", { text: "still running: the trail is complete once it finishes." }));
    return;
  }
  try {
    const { record, trail } = await getJSON(`/api/ui/trail/${encodeURIComponent(row.id)}`);
    if (opened !== row.key) return;
    panel.append(el("pre", { class: "why", text: trail.join("\n") }));
    if (record.cache) {
      panel.append(el("p", { class: "fix" }, el("b", { text: "fix: " }), record.cache.fix));
    }
    if (record.prompt && record.prompt.excerpt) {
      panel.append(el("p", { class: "excerpt" }, el("b", { text: "prompt: " }), record.prompt.excerpt));
    }
    if (record.output && record.output.excerpt) {
      panel.append(el("p", { class: "excerpt" }, el("b", { text: "output: " }), record.output.excerpt));
    }
  } catch (error) {
    panel.append(el("p", { class: "problem", text: error.message }));
  }
  panel.append(el("button", { class: "small", text: "close", onclick: () => { panel.hidden = true; opened = null; } }));
}

function render() {
  dirty = false;
  clear(list);
  if (!ctx.isAdmin()) {
    list.append(el("p", { class: "empty", text: "Requests and their trails need an admin key (as /api/why does)." }));
    return;
  }
  const rows = [...ctx.state.requests.values()].reverse();
  if (!rows.length) {
    list.append(el("p", { class: "empty", text: "No request yet: the playground, or any client, makes one." }));
    return;
  }
  const headers = ["time", "status", "model", "route", "protocol", "TTFT", "tokens/s", "cache hit", "tokens", "duration", ""];
  const body = rows.map((row) => ({
    attrs: {
      class: `req ${row.done ? "done" : "running"}${opened === row.key ? " opened" : ""}`,
      dataset: { id: row.id },
      onclick: () => open(row),
    },
    cells: [
      clock(row.time), status(row), row.model || "-", row.route, row.protocol,
      row.done ? ms(row.ttft_ms) : "-",
      row.tokens_per_second ? row.tokens_per_second.toFixed(1) : "-",
      pct(row.cache_hit_ratio),
      row.generated_tokens ?? "-",
      row.done ? ms(row.duration_ms) : `${ms(row.elapsed_ms)}…`,
      el("span", {}, flags(row)),
    ],
  }));
  list.append(table(headers, body, { class: "reqs" }));
}
