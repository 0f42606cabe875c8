// Models: a memory bar per device (its budget, the bytes each loaded model holds there,
// the warm pegs' bytes), what the manifest declares beside what runs, each model's Ready
// condition and why, its instances (slots, in flight, queue, keep-alive countdown,
// memory), and for admin keys the load, unload and pin buttons (POST /api/blazar/load,
// /stop, /pin).

import { postJSON } from "./api.js";
import { el, clear, badge, bytes, duration, table } from "./util.js";

export const id = "models";
export const title = "Models";

let root, ctx, timer = null;

export function mount(node, context) {
  root = node;
  ctx = context;
  ctx.on("models", render);
  ctx.on("hello", render);
  render();
}

export function show() {
  if (!timer) timer = setInterval(tickCountdowns, 1000);
}

export function hide() {
  clearInterval(timer);
  timer = null;
}

// The keep-alive countdowns run here between model events (no request is made).
function tickCountdowns() {
  const elapsed = (performance.now() - ctx.state.modelsAt) / 1000;
  for (const cell of root.querySelectorAll("[data-remaining]")) {
    const left = Number(cell.dataset.remaining) - elapsed;
    cell.textContent = duration(Math.max(0, left));
  }
}

async function act(button, path, body, done) {
  button.disabled = true;
  try {
    await postJSON(path, body);
    ctx.toast(done);
  } catch (error) {
    ctx.toast(`${path}: ${error.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

function buttons(model) {
  if (!ctx.isAdmin() || model.remote || !model.served) return null;
  const row = el("div", { class: "actions" });
  if (model.instances.length) {
    row.append(el("button", {
      class: "unload", text: "Unload", dataset: { model: model.name },
      onclick: (e) => act(e.target, "/api/blazar/stop", { model: model.name }, `${model.name} unloaded`),
    }));
  } else {
    row.append(el("button", {
      class: "load", text: "Load", dataset: { model: model.name },
      onclick: (e) => act(e.target, "/api/blazar/load", { model: model.name }, `${model.name} loaded`),
    }));
  }
  if (model.declared) {
    const pinned = model.pin;
    row.append(el("button", {
      class: "pin", text: pinned ? "Unpin" : "Pin", dataset: { model: model.name },
      title: "sets pin in the manifest: a pinned model is never evicted",
      onclick: (e) => act(e.target, "/api/blazar/pin", { model: model.name, pinned: !pinned },
        `${model.name} ${pinned ? "unpinned" : "pinned"}`),
    }));
  }
  return row;
}

function readiness(model) {
  if (model.remote) return badge(`remote ${model.remote}: ${model.remote_state}`, "info");
  const ready = model.ready;
  if (!ready) return badge(model.declared ? "no status" : "not declared", "info");
  const kind = ready.status === "True" ? "ok" : "error";
  return el("span", {}, badge(ready.status === "True" ? "Ready" : "Not ready", kind),
    ready.reason ? ` ${ready.reason}` : "");
}

function instanceTable(model) {
  const admin = ctx.isAdmin();
  const headers = ["replica", "state", "in flight / slots", "queued", "keep alive", "memory"];
  if (admin) headers.push("pid", "port");
  const rows = model.instances.map((inst) => {
    const remaining = inst.keep_alive_remaining;
    const keep = remaining === null || remaining === undefined
      ? el("span", { text: inst.pinned ? "pinned" : "no expiry" })
      : el("span", { class: "countdown", dataset: { remaining: String(remaining) }, text: duration(remaining) });
    const cells = [
      `#${inst.replica}`, badge(inst.state, inst.state === "ready" ? "ok" : "warn"),
      `${inst.in_flight} / ${inst.slots}`, String(inst.queued), keep, bytes(inst.memory_bytes),
    ];
    if (admin) cells.push(String(inst.pid ?? "-"), String(inst.port ?? "-"));
    return { cells, attrs: { class: "instance" } };
  });
  return table(headers, rows, { class: "instances" });
}

function card(model) {
  const facts = [];
  if (model.kind) facts.push(model.kind);
  if (model.engine) facts.push(`engine ${model.engine}`);
  if (model.slots) facts.push(`${model.slots} slot${model.slots > 1 ? "s" : ""}`);
  if (model.ctx) facts.push(`ctx ${model.ctx}`);
  if (model.replicas) facts.push(`${model.replicas} warm replicas`);
  if (model.keep_alive !== undefined) facts.push(`keep_alive ${duration(model.keep_alive)}`);
  if (model.size) facts.push(bytes(model.size));
  const title = el("h3", {}, model.name,
    model.pin ? badge("pinned", "info") : null,
    model.declared ? badge("declared", "") : badge(model.remote ? "remote" : "held, not declared", ""),
    model.served ? null : badge("not served", "error"));
  const body = el("div", { class: "model card", dataset: { model: model.name } },
    el("div", { class: "row" }, title, el("span", { class: "spacer" }), buttons(model)),
    el("div", { class: "facts", text: facts.join(" · ") }),
    el("div", { class: "ready" }, readiness(model)));
  if (model.variants && model.variants.length) {
    body.append(el("div", { class: "facts", text: `adapters: ${model.variants.join(", ")}` }));
  }
  if (model.problem) body.append(el("p", { class: "problem", text: model.problem }));
  for (const c of model.conditions || []) {
    if (c.message && c.status !== "True") body.append(el("p", { class: "condition", text: `${c.type} ${c.status} ${c.reason}: ${c.message} (since ${c.since})` }));
  }
  body.append(model.instances.length ? instanceTable(model) : el("p", { class: "idle", text: "not loaded" }));
  return body;
}

// One bar per device, its width the budget (or, for a host bar of pegs only, the peg
// budget): a segment per model placed there, then the pegged files' bytes, hatched.
// Widths are set through the CSSOM: the page's CSP refuses inline style attributes.
function segment(cls, title, size, scale, dataset) {
  const node = el("span", { class: `seg ${cls}`, title, dataset: { ...dataset, bytes: String(size) } });
  node.style.width = `${Math.min(100, (100 * size) / scale)}%`;
  return node;
}

function memoryBars(bars) {
  if (!bars || !bars.length) return null;
  const box = el("div", { class: "memory card" });
  for (const bar of bars) {
    const scale = Math.max(bar.budget, 1);
    const used = bar.models.reduce((n, m) => n + m.bytes, 0);
    const pegged = bar.pegged.reduce((n, p) => n + p.bytes, 0);
    const track = el("div", { class: "bar" });
    bar.models.forEach((m, i) => track.append(
      segment(`c${i % 3}`, `${m.name}: ${bytes(m.bytes)}`, m.bytes, scale, { model: m.name })));
    if (pegged) {
      const names = bar.pegged.map((p) => `${p.name} ${bytes(p.bytes)}`).join(", ");
      track.append(segment("pegged", `warm pegs: ${names}`, pegged, scale, {}));
    }
    const pegText = pegged ? `, warm pegs ${bytes(pegged)} of ${bytes(bar.peg_budget)}` : "";
    const label = bar.device === "host"
      ? `host RAM: warm pegs ${bytes(pegged)} of ${bytes(bar.budget)}`
      : `${bar.device}: ${bytes(used)} of ${bytes(bar.budget)} budget${pegText}`;
    box.append(el("div", { class: "memory-bar", dataset: { device: bar.device, budget: String(bar.budget) } },
      el("div", { class: "facts", text: label }), track));
  }
  return box;
}

function render() {
  clear(root);
  const models = ctx.state.models;
  const running = models.filter((m) => m.instances.length).length;
  root.append(el("h2", {}, "Models ", el("small", { text: `${models.length} known, ${running} running` })));
  if (!ctx.state.hello) {
    root.append(el("p", { class: "idle", text: "waiting for the gateway's event stream…" }));
    return;
  }
  if (!models.length) {
    root.append(el("p", { class: "empty", text: "No model is declared or held yet: `blazar pull` or declare one in the manifest." }));
    return;
  }
  const memory = memoryBars(ctx.state.memory);
  if (memory) root.append(memory);
  for (const model of models) root.append(card(model));
}
