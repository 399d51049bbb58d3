// Hand-drawn inline SVG charts: a donut for shares and a line chart for trends.
// Each chart is role="img" with a text summary; the page also shows the numbers as a table.
import { h, s } from "./dom.js";

export const PALETTE = ["#1f4fd1", "#d9480f", "#2b8a3e", "#9c36b5", "#e8590c", "#0b7285", "#c2255c", "#5f3dc4", "#5c940d", "#495057"];

export const colour = (i) => PALETTE[i % PALETTE.length];

function arc(cx, cy, r, start, end) {
  const large = end - start > Math.PI ? 1 : 0;
  const x1 = cx + r * Math.cos(start);
  const y1 = cy + r * Math.sin(start);
  const x2 = cx + r * Math.cos(end);
  const y2 = cy + r * Math.sin(end);
  return `M ${x1} ${y1} A ${r} ${r} 0 ${large} 1 ${x2} ${y2}`;
}

/** segments: [{label, value}] -> a donut with a legend. */
export function donut(segments, { label }) {
  const total = segments.reduce((sum, seg) => sum + Number(seg.value), 0);
  const size = 160;
  const c = size / 2;
  const r = 58;
  const svg = s("svg", { viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": label, class: "donut" });
  svg.append(s("title", {}, label));
  if (total <= 0) {
    svg.append(s("circle", { cx: c, cy: c, r, fill: "none", stroke: "#dee2e6", "stroke-width": 22 }));
  } else if (segments.length === 1) {
    svg.append(s("circle", { cx: c, cy: c, r, fill: "none", stroke: colour(0), "stroke-width": 22 }));
  } else {
    let angle = -Math.PI / 2;
    segments.forEach((seg, i) => {
      const sweep = (Number(seg.value) / total) * Math.PI * 2;
      if (sweep <= 0) return;
      svg.append(s("path", { d: arc(c, c, r, angle, angle + Math.min(sweep, Math.PI * 2 - 1e-4)), fill: "none", stroke: colour(i), "stroke-width": 22 }));
      angle += sweep;
    });
  }
  return svg;
}

function niceMax(max) {
  if (max <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * magnitude >= max) return step * magnitude;
  }
  return 10 * magnitude;
}

/** series: [{key, points: [{t, value}]}] sharing the same buckets -> a multi-line chart. */
const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 2 });

export function lineChart(series, { label, format = String, formatTime = (t) => t, width = 720, formatAxis = (v) => compact.format(v) }) {
  // Drawn at the container's width so labels keep a readable size on a phone.
  const height = width < 500 ? 220 : 260;
  const pad = { left: width < 500 ? 52 : 64, right: 16, top: 12, bottom: 36 };
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const times = (series.find((x) => x.points.length) || { points: [] }).points.map((p) => p.t);
  const max = niceMax(Math.max(0, ...series.flatMap((x) => x.points.map((p) => Number(p.value)))));
  const x = (i) => pad.left + (times.length <= 1 ? innerW / 2 : (i / (times.length - 1)) * innerW);
  const y = (v) => pad.top + innerH - (Number(v) / max) * innerH;

  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, class: "line-chart", preserveAspectRatio: "xMidYMid meet" });
  svg.append(s("title", {}, label));
  for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
    const v = max * frac;
    svg.append(s("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "grid" }));
    svg.append(s("text", { x: pad.left - 8, y: y(v) + 4, "text-anchor": "end", class: "axis" }, formatAxis(v)));
  }
  const tickCount = Math.min(times.length, width < 500 ? 3 : 6);
  for (let k = 0; k < tickCount; k += 1) {
    const i = tickCount === 1 ? 0 : Math.round((k / (tickCount - 1)) * (times.length - 1));
    // The outer labels hug the plot's edges so they are never clipped.
    const anchor = tickCount > 1 && k === 0 ? "start" : tickCount > 1 && k === tickCount - 1 ? "end" : "middle";
    svg.append(s("text", { x: x(i), y: height - 12, "text-anchor": anchor, class: "axis" }, formatTime(times[i])));
  }
  series.forEach((line, idx) => {
    if (!line.points.length) return; // a hidden series keeps its colour slot
    const pts = line.points.map((p, i) => `${x(i)},${y(p.value)}`).join(" ");
    svg.append(s("polyline", { points: pts, fill: "none", stroke: colour(idx), "stroke-width": 2.5, "stroke-linejoin": "round", "data-series": line.key }));
    if (line.points.length <= 48) {
      line.points.forEach((p, i) => {
        svg.append(s("circle", { cx: x(i), cy: y(p.value), r: 3, fill: colour(idx) }, s("title", {}, `${line.key} · ${formatTime(p.t)}: ${format(p.value)}`)));
      });
    }
  });
  return svg;
}

/** A legend whose swatches match the chart colours. */
export function legend(items) {
  return h(
    "ul",
    { class: "legend" },
    items.map((item, i) => h("li", {}, h("span", { class: "swatch", style: { background: colour(i) }, "aria-hidden": "true" }), item)),
  );
}
