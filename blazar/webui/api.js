// Talking to the gateway: every call carries the tab's key (session storage only) the way
// any client sends one, and a 401 asks for a key instead of leaving a blank page.
// Streams (the event stream, a log, a chat answer) are read with fetch, so the key stays
// in a header and never goes into a URL.

const KEY = "blazar.key";
let unauthorized = () => {};

export const auth = {
  get key() { return sessionStorage.getItem(KEY); },
  set(key) { sessionStorage.setItem(KEY, key); },
  clear() { sessionStorage.removeItem(KEY); },
};

export function onUnauthorized(handler) { unauthorized = handler; }

export class HTTPError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export function headers(extra = {}) {
  const out = { ...extra };
  if (auth.key) out.Authorization = `Bearer ${auth.key}`;
  return out;
}

async function failure(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    const error = body.error;
    message = typeof error === "string" ? error : (error && error.message) || JSON.stringify(body);
  } catch (_) { /* not JSON: keep the status line */ }
  if (resp.status === 401) unauthorized(message);
  return new HTTPError(resp.status, message);
}

// fetch with the key; a non-2xx answer is thrown as an HTTPError with the gateway's message.
export async function call(method, path, { json, body, signal, accept } = {}) {
  const init = { method, headers: headers(accept ? { Accept: accept } : {}), signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body;
  }
  const resp = await fetch(path, init);
  if (!resp.ok) throw await failure(resp);
  return resp;
}

export async function getJSON(path) { return (await call("GET", path)).json(); }
export async function postJSON(path, json) { return (await call("POST", path, { json })).json(); }

// The server-sent events of a response, as {event, data} (data parsed as JSON when it is).
export async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    pending += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = pending.indexOf("\n\n")) >= 0) {
      const block = pending.slice(0, cut);
      pending = pending.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue;
      const text = data.join("\n");
      let parsed = text;
      try { parsed = JSON.parse(text); } catch (_) { /* [DONE] and the like */ }
      yield { event, data: parsed };
    }
  }
}

// A GET stream of events (the dashboard's, a log's).
export async function* stream(path, signal) {
  const resp = await call("GET", path, { signal, accept: "text/event-stream" });
  yield* events(resp);
}
