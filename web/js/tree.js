// The farm tree: sites → servers and device collections → devices; stores → vDisks. A
// server shows its rating and whether it drains, with a button that drains it (logins name
// it last and it moves its devices to their next servers) or ends the drain; a silent
// server (no heartbeat for a minute) has a button that removes it from the farm, and so
// from every device's server list (the farm refuses to remove a running one).

import { all, call } from './api.js';
import { badge, h, fill } from './dom.js';
import { clearError, showError } from './main.js';

/** Drains the server `s` or ends its drain, then draws the tree again. */
async function toggleDrain(s) {
  clearError();
  try {
    await call('PATCH', `/servers/${s.id}`, { draining: !s.draining });
    await showTree();
  } catch (e) {
    showError(e);
  }
}

/** Removes the silent server `s` from the farm, then draws the tree again. */
async function removeServer(s) {
  clearError();
  try {
    await call('DELETE', `/servers/${s.id}`);
    await showTree();
  } catch (e) {
    showError(e);
  }
}

function serverLabel(s, now) {
  const silent = now - s.heartbeat_at_ms >= 60000;
  return h('span', {},
    kind('server'), s.name, ' ', h('span', { class: 'muted' }, s.address), ' ',
    silent ? badge('silent', 'bad') : badge('alive', 'ok'), ' ',
    h('span', { class: 'muted' }, `rating ${s.rating}`), ' ',
    s.draining ? badge('draining', 'bad') : null, ' ',
    h('button', {
      type: 'button', class: s.draining ? null : 'danger',
      'aria-label': `${s.draining ? 'Undrain' : 'Drain'} server ${s.name}`,
      onclick: () => toggleDrain(s),
    }, s.draining ? 'Undrain' : 'Drain'),
    silent ? ' ' : null,
    silent ? h('button', {
      type: 'button', class: 'danger',
      'aria-label': `Remove server ${s.name}`,
      onclick: () => removeServer(s),
    }, 'Remove') : null);
}

function node(label, children, open = true) {
  const kids = children.filter(Boolean);
  if (kids.length === 0) return h('li', { role: 'treeitem' }, label);
  return h('li', { role: 'treeitem', 'aria-expanded': String(open) },
    h('details', { open }, h('summary', {}, label), h('ul', { role: 'group' }, kids)));
}

function kind(k) {
  return h('span', { class: 'kind' }, k);
}

export async function showTree() {
  const [farm, sites, servers, stores, collections, devices, vdisks] = await Promise.all([
    call('GET', '/farm'), all('/sites'), all('/servers'), all('/stores'),
    all('/collections'), all('/devices'), all('/vdisks'),
  ]);
  const now = Date.now();
  const vdiskName = new Map(vdisks.map((v) => [v.id, v.name]));
  const siteNodes = sites.map((site) => node(h('span', {}, kind('site'), site.name), [
    node(h('span', {}, kind('servers'), `${servers.filter((s) => s.site_id === site.id).length}`),
      servers.filter((s) => s.site_id === site.id).map((s) => node(serverLabel(s, now), []))),
    ...collections.filter((c) => c.site_id === site.id).map((c) => node(
      h('span', {}, kind('collection'), c.name, c.auto_add ? ' (auto-add)' : ''),
      devices.filter((d) => d.collection_id === c.id).map((d) => node(h('span', {},
        kind('device'), d.name, ' ', h('span', { class: 'muted mono' }, d.mac), ' ',
        badge(d.device_type), ' → ',
        d.vdisk_id ? h('a', { href: `#/vdisks/${d.vdisk_id}` }, vdiskName.get(d.vdisk_id) || d.vdisk_id)
          : h('span', { class: 'muted' }, 'no vDisk')), [])))),
  ]));
  const storeNodes = stores.map((st) => node(h('span', {}, kind('store'), st.name, ' ',
    h('span', { class: 'muted mono' }, st.path)),
  vdisks.filter((v) => v.store_id === st.id).map((v) => node(h('span', {}, kind('vDisk'),
    h('a', { href: `#/vdisks/${v.id}` }, v.name)), []))));
  fill(document.getElementById('farm-tree'),
    h('ul', { role: 'tree', 'aria-label': 'Farm tree' },
      node(h('span', {}, kind('farm'), farm.name), [
        node(h('span', {}, kind('sites'), String(sites.length)), siteNodes),
        node(h('span', {}, kind('stores'), String(stores.length)), storeNodes),
      ])));
}
