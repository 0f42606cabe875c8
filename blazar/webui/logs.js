// Logs: an instance's log file followed live (GET /api/ui/logs lists them; the stream
// /api/ui/logs/NAME sends its last lines, then new ones as the child writes them).

import { getJSON, stream } from "./api.js";
import { el, clear, bytes } from "./util.js";

export const id = "logs";
export const title = "Logs";

const MAX_LINES = 5000;
let root, ctx, picker, out, follow, controller = null, lines = [];

export function mount(node, context) {
  root = node;
  ctx = context;
  picker = el("select", { id: "log-pick", "aria-label": "log file", onchange: () => open(picker.value) });
  follow = el("input", { type: "checkbox", checked: true });
  out = el("pre", { class: "log", id: "log-lines" });
  root.append(el("div", { class: "row" }, el("h2", { text: "Logs" }), picker,
    el("button", { class: "small", text: "refresh list", onclick: list }),
    el("label", {}, follow, " follow"), el("span", { class: "spacer" })), out);
}

export function show() { list(); }
export function hide() { if (controller) controller.abort(); controller = null; }

async function list() {
  if (!ctx.isAdmin()) {
    clear(picker);
    out.textContent = "Logs need an admin key.";
    return;
  }
  try {
    const { logs } = await getJSON("/api/ui/logs");
    const current = picker.value;
    clear(picker).append(el("option", { value: "", text: logs.length ? "choose a log" : "no log yet" }),
      ...logs.map((l) => el("option", { value: l.name, text: `${l.instance ? `${l.instance}: ` : ""}${l.name} (${bytes(l.size)})` })));
    if (logs.some((l) => l.name === current)) picker.value = current;
    else if (logs.length) picker.value = logs[0].name;
    if (picker.value && !controller) open(picker.value);
  } catch (error) {
    out.textContent = error.message;
  }
}

async function open(name) {
  if (controller) controller.abort();
  lines = [];
  out.textContent = "";
  if (!name) return;
  const mine = controller = new AbortController();
  try {
    for await (const { event, data } of stream(`/api/ui/logs/${encodeURIComponent(name)}`, mine.signal)) {
      if (event !== "lines") continue;
      lines.push(...data.lines);
      if (lines.length > MAX_LINES) lines.splice(0, lines.length - MAX_LINES);
      out.textContent = lines.join("\n");
      if (follow.checked) out.scrollTop = out.scrollHeight;
    }
  } catch (error) {
    if (error.name !== "AbortError") out.textContent += `\n[${error.message}]`;
  } finally {
    if (controller === mine) controller = null;
  }
}
