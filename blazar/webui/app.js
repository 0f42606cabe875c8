// The dashboard's shell: the pages, the key prompt, and the one event stream
// (/api/ui/events) whose events keep `state` current. Pages read `state` and re-render on
// the events they care about; nothing here polls.

import { auth, onUnauthorized, stream } from "./api.js";
import { el, clear } from "./util.js";
import * as models from "./models.js";
import * as requests from "./requests.js";
import * as metrics from "./metrics.js";
import * as playground from "./playground.js";
import * as health from "./health.js";
import * as logs from "./logs.js";

const PAGES = [models, requests, metrics, playground, health, logs];
const MAX_REQUESTS = 500;

export const state = {
  hello: null,        // {version, keyed, key, scope}
  models: [],         // the models view
  memory: [],         // a bar per device: budget, each model's bytes, warm pegs
  modelsAt: 0,        // performance.now() when it came (for the keep-alive countdown)
  requests: new Map(),// key -> row (running or finished), newest last
  series: { every: 2, points: [] },
  connected: false,
};
const bus = new EventTarget();

export function on(name, handler) { bus.addEventListener(name, () => handler()); }
function emit(name) { bus.dispatchEvent(new Event(name)); }

export function isAdmin() { return !state.hello || state.hello.scope === "admin"; }

export function toast(text, kind = "") {
  const node = el("div", { class: `toast ${kind}`, text });
  document.getElementById("toasts").append(node);
  setTimeout(() => node.remove(), kind === "error" ? 8000 : 4000);
}

// -- the key prompt ------------------------------------------------------------------------

let reconnect = () => {};

function askForKey(message) {
  const box = document.getElementById("keybox");
  document.getElementById("keymsg").textContent = message || "This gateway needs an API key.";
  box.hidden = false;
  document.getElementById("keyinput").focus();
}

function setupKeyPrompt() {
  onUnauthorized((message) => askForKey(auth.key ? `That key was refused: ${message}` : message));
  document.getElementById("keyform").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("keyinput");
    const key = input.value.trim();
    if (!key) return;
    auth.set(key);
    input.value = "";
    document.getElementById("keybox").hidden = true;
    reconnect();
  });
  document.getElementById("forget").addEventListener("click", () => {
    auth.clear();
    location.reload();
  });
}

// -- the event stream ----------------------------------------------------------------------

function addRequest(row) {
  const old = state.requests.get(row.key);
  if (old && old.done && !row.done) return; // a late "started" for a finished one
  state.requests.delete(row.key);
  state.requests.set(row.key, old ? { ...old, ...row } : row);
  while (state.requests.size > MAX_REQUESTS) {
    state.requests.delete(state.requests.keys().next().value);
  }
}

const HANDLERS = {
  hello(data) {
    state.hello = data;
    document.body.classList.toggle("inference", data.scope !== "admin");
    document.getElementById("who").textContent =
      data.keyed ? `key ${data.key} (${data.scope})` : "no keys declared";
    document.getElementById("forget").hidden = !data.keyed;
    emit("hello");
  },
  models(data) {
    state.models = data.models;
    state.memory = data.memory || [];
    state.modelsAt = performance.now();
    emit("models");
  },
  requests(data) {
    state.requests.clear();
    for (const row of data.finished) addRequest(row);
    for (const row of data.running) addRequest(row);
    emit("requests");
  },
  request(data) { addRequest(data); emit("requests"); },
  running(rows) {
    for (const row of rows) addRequest(row);
    emit("requests");
  },
  series(data) { state.series = data; emit("series"); },
  sample(point) {
    const points = state.series.points;
    points.push(point);
    const keep = Math.round((state.series.window || 3600) / (state.series.every || 2));
    if (points.length > keep) points.splice(0, points.length - keep);
    emit("series");
  },
};

function setLink(up, text) {
  state.connected = up;
  const link = document.getElementById("link");
  link.textContent = text;
  link.classList.toggle("down", !up);
}

async function connect() {
  let wait = 500;
  let controller = null;
  reconnect = () => { if (controller) controller.abort(); wait = 0; };
  for (;;) {
    controller = new AbortController();
    try {
      setLink(false, "connecting");
      for await (const { event, data } of stream("/api/ui/events", controller.signal)) {
        if (event === "hello") { setLink(true, "live"); wait = 500; }
        const handler = HANDLERS[event];
        if (handler) handler(data);
      }
      setLink(false, "reconnecting");
    } catch (error) {
      if (error.status === 401 || error.status === 403) {
        setLink(false, "needs a key");
        await new Promise((resolve) => { reconnect = resolve; });
        continue;
      }
      setLink(false, "disconnected");
    }
    await new Promise((resolve) => { reconnect = resolve; setTimeout(resolve, wait); });
    wait = Math.min(10000, Math.max(500, wait * 2));
  }
}

// -- pages ---------------------------------------------------------------------------------

const ctx = { state, on, isAdmin, toast };
const mounted = new Map();

function show() {
  const wanted = location.hash.slice(1) || "models";
  const page = PAGES.find((p) => p.id === wanted) || PAGES[0];
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === page.id);
  }
  for (const [id, entry] of mounted) {
    entry.root.hidden = id !== page.id;
    if (id !== page.id && entry.page.hide) entry.page.hide();
  }
  if (!mounted.has(page.id)) {
    const root = el("section", { class: "page", id: `page-${page.id}` });
    document.getElementById("main").append(root);
    mounted.set(page.id, { page, root });
    page.mount(root, ctx);
  }
  const entry = mounted.get(page.id);
  entry.root.hidden = false;
  if (page.show) page.show();
}

function start() {
  const nav = clear(document.getElementById("nav"));
  for (const page of PAGES) {
    nav.append(el("a", { href: `#${page.id}`, dataset: { page: page.id }, text: page.title }));
  }
  setupKeyPrompt();
  window.addEventListener("hashchange", show);
  show();
  connect();
}

start();
