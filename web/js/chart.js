// A small SVG line chart drawn by hand: throughput (bytes/s) over the last samples, one line
// per series, with a y axis labelled in bytes/s. No library: the console loads nothing from
// outside the server.

import { rate } from './dom.js';

const NS = 'http://www.w3.org/2000/svg';
const W = 640;
const H = 200;
const PAD = { left: 84, right: 12, top: 12, bottom: 24 };

function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

/** A round upper bound for the y axis: 1, 2 or 5 times a power of ten of a binary unit. */
export function niceMax(v) {
  if (!(v > 0)) return 1024;
  const unit = 1024 ** Math.min(4, Math.floor(Math.log(v) / Math.log(1024)));
  const m = v / unit;
  for (const n of [1, 2, 5, 10, 20, 50, 100, 200, 500]) if (n >= m) return n * unit;
  return 1024 * unit;
}

/**
 * Draws `series` ([{name, cls, points: [{t, v}]}], t in ms, v in bytes/s) into `box`,
 * spanning `spanMs` up to `nowMs`.
 */
export function drawChart(box, series, nowMs, spanMs) {
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.points.map((p) => p.v))));
  const x = (t) => PAD.left + ((t - (nowMs - spanMs)) / spanMs) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / max) * (H - PAD.top - PAD.bottom);
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart-svg', 'aria-hidden': 'true' });
  for (const f of [0, 0.5, 1]) {
    svg.append(el('line', { x1: PAD.left, x2: W - PAD.right, y1: y(max * f), y2: y(max * f),
      class: 'grid' }));
    svg.append(el('text', { x: PAD.left - 6, y: y(max * f) + 4, 'text-anchor': 'end',
      class: 'axis' }, rate(max * f)));
  }
  svg.append(el('text', { x: PAD.left, y: H - 6, class: 'axis' }, `-${spanMs / 1000} s`));
  svg.append(el('text', { x: W - PAD.right, y: H - 6, 'text-anchor': 'end', class: 'axis' },
    'now'));
  for (const s of series) {
    const pts = s.points.filter((p) => p.t >= nowMs - spanMs);
    if (pts.length === 0) continue;
    const d = pts.map((p, i) => `${i ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
    svg.append(el('path', { d: d.join(' '), class: `line ${s.cls}`,
      'data-series': s.name, 'data-points': pts.length }));
  }
  box.replaceChildren(svg);
}
