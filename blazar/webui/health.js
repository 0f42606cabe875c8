// Health: `blazar doctor`'s findings with their fixes, the remotes and their health, the
// engine lanes with their versions, and every condition that is not Ready
// (GET /api/ui/health, read when the page opens and on "check again").

import { getJSON } from "./api.js";
import { el, clear, badge, table } from "./util.js";

export const id = "health";
export const title = "Health";

let root, ctx, body, busy = false;
const KINDS = { ok: "ok", info: "info", warning: "warn", error: "error" };

export function mount(node, context) {
  root = node;
  ctx = context;
  body = el("div");
  root.append(el("div", { class: "row" }, el("h2", { text: "Health" }), el("span", { class: "spacer" }),
    el("button", { class: "small", text: "check again", onclick: load })), body);
  ctx.on("hello", () => { if (!root.hidden) load(); });
}

export function show() { load(); }

async function load() {
  if (busy) return;
  if (!ctx.isAdmin()) {
    clear(body).append(el("p", { class: "empty", text: "The host's health needs an admin key (as `blazar doctor` on the daemon does)." }));
    return;
  }
  busy = true;
  clear(body).append(el("p", { class: "idle", text: "checking…" }));
  try {
    render(await getJSON("/api/ui/health"));
  } catch (error) {
    clear(body).append(el("p", { class: "problem", text: error.message }));
  } finally {
    busy = false;
  }
}

function render(data) {
  clear(body);
  const errors = data.findings.filter((f) => f.severity === "error").length;
  const warnings = data.findings.filter((f) => f.severity === "warning").length;
  body.append(el("p", {}, badge(`${errors} error(s)`, errors ? "error" : "ok"), " ", badge(`${warnings} warning(s)`, warnings ? "warn" : "ok")));
  for (const group of data.groups) {
    const mine = data.findings.filter((f) => f.group === group);
    if (!mine.length) continue;
    body.append(el("div", { class: "card findings", dataset: { group } }, el("h3", { text: group }),
      mine.map((f) => el("div", { class: `finding ${f.severity}` }, badge(f.severity, KINDS[f.severity]), " ", f.what,
        f.fix && f.severity !== "ok" ? el("div", { class: "fix" }, el("b", { text: "fix: " }), f.fix) : null))));
  }
  const remotes = data.remotes.remotes || [];
  body.append(el("div", { class: "card" }, el("h3", { text: "Remotes" }), remotes.length
    ? table(["name", "url", "kind", "health", "models", "forwarded", "failed", "last error"], remotes.map((r) => [
      r.name, r.url, r.kind, badge(r.drained ? "drained" : r.health, r.health === "up" ? "ok" : "warn"),
      (r.models || []).join(", "), String(r.forwarded), String(r.failed), r.last_error || "-"]))
    : el("p", { class: "empty", text: "No remote is declared ([remotes.NAME], docs/fleet.md)." })));
  body.append(el("div", { class: "card" }, el("h3", { text: "Engine lanes" }), data.engines.length
    ? table(["lane", "tag", "version", "method", "active", "serving", "last bench"], data.engines.map((e) => [
      e.kind, e.tag, e.version, e.method, e.active ? badge("active", "ok") : "", e.models.join(", ") || "-",
      e.bench ? `${e.bench.decode_tps.toFixed(1)} tg/s, ${e.bench.prompt_tps.toFixed(1)} pp/s` : "-"]))
    : el("p", { class: "empty", text: "No engine is installed yet: `blazar apply` installs the manifest's." })));
  if (data.conditions.length) {
    body.append(el("div", { class: "card" }, el("h3", { text: "Not ready" }),
      table(["resource", "type", "status", "reason", "message", "since"], data.conditions.map((c) => [
        `${c.kind}s.${c.name}`, c.type, c.status, c.reason, c.message, c.since]))));
  }
}
