// Small helpers every page uses: building elements (text only, never HTML from data) and
// formatting figures.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function ms(value) {
  if (value === null || value === undefined) return "-";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(1)} ms`;
}

export function rate(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(1)}/s`;
}

export function pct(value) {
  return value === null || value === undefined ? "-" : `${(value * 100).toFixed(0)}%`;
}

export function bytes(value) {
  if (value === null || value === undefined) return "-";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let n = value, i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

export function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 0) return "forever";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

export function badge(text, kind = "") {
  return el("span", { class: `badge ${kind}`, text });
}

// A table: headers, then rows of cells (nodes or text); a row may be {cells, attrs}.
export function table(headers, rows, attrs = {}) {
  const head = el("tr", {}, headers.map((h) => el("th", { text: h })));
  const body = rows.map((row) => {
    const { cells, attrs: rowAttrs } = Array.isArray(row) ? { cells: row, attrs: {} } : row;
    return el("tr", rowAttrs, cells.map((c) => el("td", {}, c)));
  });
  return el("table", attrs, el("thead", {}, head), el("tbody", {}, body));
}
