// A line chart drawn by hand in SVG: a time axis, one polyline per series, the scale's top
// and bottom, a legend. Gaps (null values) break a line.

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 170, LEFT = 56, RIGHT = 8, TOP = 10, BOTTOM = 22;

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false, hour: "2-digit", minute: "2-digit" });
}

// lines: [{label, values: [number|null]}], times: [seconds]; format: value -> text; `max`:
// the scale's top when the values stay under it (a ratio's 100%).
export function lineChart({ title, times, lines, format = (v) => String(v), min = 0, max = null }) {
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
  const all = lines.flatMap((l) => l.values).filter((v) => v !== null && v !== undefined);
  let top = all.length ? Math.max(...all) : 1;
  let bottom = Math.min(min, all.length ? Math.min(...all) : 0);
  if (top === bottom) top = bottom + 1;
  top = max !== null && top <= max ? max : top + (top - bottom) * 0.08;
  const t0 = times.length ? times[0] : 0;
  const t1 = times.length > 1 ? times[times.length - 1] : t0 + 1;
  const x = (t) => LEFT + ((t - t0) / (t1 - t0 || 1)) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - (v - bottom) / (top - bottom)) * (H - TOP - BOTTOM);
  root.append(svg("rect", { x: LEFT, y: TOP, width: W - LEFT - RIGHT, height: H - TOP - BOTTOM, class: "plot" }));
  root.append(svg("text", { x: LEFT - 4, y: TOP + 10, class: "tick end" }, format(top)));
  root.append(svg("text", { x: LEFT - 4, y: H - BOTTOM, class: "tick end" }, format(bottom)));
  if (times.length) {
    root.append(svg("text", { x: LEFT, y: H - 6, class: "tick" }, clock(t0)));
    root.append(svg("text", { x: W - RIGHT, y: H - 6, class: "tick end" }, clock(t1)));
  }
  lines.forEach((line, index) => {
    let run = [];
    const flush = () => {
      if (run.length) {
        root.append(svg("polyline", { points: run.join(" "), class: `line c${index}`, "data-series": line.label }));
      }
      if (run.length === 1) { // a lone point between gaps: a dot, or it would not show
        const [cx, cy] = run[0].split(",");
        root.append(svg("circle", { cx, cy, r: 2, class: `dot c${index}` }));
      }
      run = [];
    };
    line.values.forEach((v, i) => {
      if (v === null || v === undefined) flush();
      else run.push(`${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`);
    });
    flush();
    root.append(svg("text", { x: LEFT + 90 + index * 160, y: H - 6, class: `legend c${index}` }, `— ${line.label}`));
  });
  if (!times.length) {
    root.append(svg("text", { x: W / 2, y: H / 2, class: "tick middle" }, "no points yet"));
  }
  return root;
}
