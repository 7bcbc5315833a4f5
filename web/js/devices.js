// Devices with live status, polled every 2 s from GET /api/v1/status: connected or not, the
// server and version they boot, cache mode and use, bytes read and written, retries, the
// read cache's hits (the host cache of `ferry target --host-cache`, or the boot agent's). The
// throughput chart is drawn from the differences of the polled byte counters.

import { call } from './api.js';
import { badge, bytes, fill, h, rate, time } from './dom.js';
import { drawChart } from './chart.js';
import { showError } from './main.js';

/** How often the status is polled. */
export const POLL_MS = 2000;
/** The chart's time span. */
const SPAN_MS = 60000;
/** Samples kept per series. */
const SAMPLES_MAX = 120;

let timer = null;
let last = null; // { t, read, written } of the previous poll, summed over devices.
const samples = { read: [], written: [] };

/**
 * The server a device streams from, as its counters name it: the registered server's name,
 * else the NBD address the device reported (a server the farm does not know by that
 * address), else '—' (no counters yet).
 */
function serverOf(c) {
  if (c && c.server_name) return c.server_name;
  if (c && c.server_address) return c.server_address;
  return '—';
}

function row(d) {
  const s = d.session;
  const c = d.counters;
  return h('tr', { dataset: { device: d.mac, connected: s ? 'yes' : 'no' } },
    h('th', { scope: 'row' }, d.name),
    h('td', { class: 'mono' }, d.mac),
    h('td', {}, badge(d.device_type)),
    h('td', { class: 'state' }, s ? badge('connected', 'ok') : badge('offline', 'off')),
    h('td', { class: 'server' }, serverOf(c)),
    h('td', {}, d.vdisk_name || '—'),
    h('td', { class: 'version' }, s ? h('span', {}, String(s.version), ' ', badge(s.access)) : '—'),
    h('td', { class: 'cache' }, d.cache_mode),
    h('td', { class: 'num cache-use' }, c ? `${bytes(c.cache_used_bytes)} / ${bytes(d.ram_bytes)}`
      : '—'),
    h('td', { class: 'num bytes-read' }, c ? bytes(c.bytes_read) : '—'),
    h('td', { class: 'num bytes-written' }, c ? bytes(c.bytes_written) : '—'),
    h('td', { class: 'num retries' }, c ? String(c.retries) : '—'),
    h('td', { class: 'num read-cache' }, readCache(c)));
}

/**
 * The host read cache's (or the prefetch cache's) share of a device's reads: bytes it
 * answered / bytes it fetched from the servers; '—' for a device without one.
 */
function readCache(c) {
  if (!c || (!c.host_cache_hit_bytes && !c.host_cache_server_bytes)) return '—';
  return `${bytes(c.host_cache_hit_bytes || 0)} / ${bytes(c.host_cache_server_bytes || 0)}`;
}

function push(list, p) {
  list.push(p);
  while (list.length > SAMPLES_MAX) list.shift();
}

function sample(st) {
  let read = 0;
  let written = 0;
  for (const d of st.devices) {
    if (d.counters) {
      read += d.counters.bytes_read;
      written += d.counters.bytes_written;
    }
  }
  const now = st.now_ms;
  if (last && now > last.t) {
    const dt = (now - last.t) / 1000;
    // A counter that went down belongs to a new session: count from zero.
    push(samples.read, { t: now, v: Math.max(0, read - last.read) / dt });
    push(samples.written, { t: now, v: Math.max(0, written - last.written) / dt });
  }
  last = { t: now, read, written };
  const r = samples.read.at(-1);
  const w = samples.written.at(-1);
  document.getElementById('chart-legend').textContent = r
    ? `All devices — read ${rate(r.v)} (blue), written ${rate(w.v)} (orange)`
    : 'All devices — waiting for a second sample';
  drawChart(document.getElementById('chart'), [
    { name: 'read', cls: 'read', points: samples.read },
    { name: 'written', cls: 'written', points: samples.written },
  ], now, SPAN_MS);
}

async function poll() {
  try {
    const st = await call('GET', '/status');
    fill(document.getElementById('device-rows'), st.devices.length
      ? st.devices.map(row)
      : h('tr', {}, h('td', { colspan: 13, class: 'muted' }, 'No devices.')));
    document.getElementById('status-time').textContent =
      `Last update ${time(st.now_ms)}; ${st.devices.filter((d) => d.session).length} of ` +
      `${st.total} connected.`;
    sample(st);
  } catch (e) {
    showError(e);
    if (e.status === 401) stopDevices();
  }
}

export function startDevices() {
  if (timer !== null) return;
  poll();
  timer = setInterval(poll, POLL_MS);
}

export function stopDevices() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}
