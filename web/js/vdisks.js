// vDisks and their version chains, with the lifecycle actions: new version, promote,
// revert, delete (newest only) and merge. Every action is one API call; its error, if any,
// is the API's message, shown in the alert.

import { all, call } from './api.js';
import { badge, bytes, fill, h, time } from './dom.js';
import { clearError, showError } from './main.js';

let current = null;

function picklist(vdisks, stores) {
  const storeName = new Map(stores.map((s) => [s.id, s.name]));
  fill(document.getElementById('vdisk-list'), vdisks.map((v) => h('li', {},
    h('a', {
      href: `#/vdisks/${v.id}`, 'aria-current': v.id === current ? 'page' : null,
    }, v.name, h('span', { class: 'muted' }, ` ${storeName.get(v.store_id) || ''}`)))));
}

async function act(what, fn) {
  clearError();
  const status = document.getElementById('action-status');
  try {
    await fn();
    await showDetail(current);
    const s = document.getElementById('action-status');
    if (s) s.textContent = `${what}: done`;
  } catch (e) {
    if (status) status.textContent = '';
    showError(e);
  }
}

function versionRow(vd, v, newest) {
  const base = `/vdisks/${vd.id}/versions/${v.number}`;
  const label = (verb) => `${verb} version ${v.number}`;
  return h('tr', { dataset: { version: String(v.number) } },
    h('th', { scope: 'row', class: 'num' }, String(v.number)),
    h('td', { class: 'mono' }, v.file_name),
    h('td', { class: 'num' }, v.parent_number ?? '—'),
    h('td', { class: 'access' }, badge(v.access)),
    h('td', {}, v.origin),
    h('td', {}, time(v.created_at_ms), h('br'), h('span', { class: 'muted' }, v.created_by)),
    h('td', {}, time(v.changed_at_ms), h('br'), h('span', { class: 'muted' }, v.changed_by)),
    h('td', { class: 'actions' },
      h('button', {
        type: 'button', disabled: v.access === 'production', 'aria-label': label('Promote'),
        onclick: () => act(`promote ${v.number}`, () => call('POST', `${base}/promote`)),
      }, 'Promote'),
      h('button', {
        type: 'button', disabled: v.access === 'maintenance', 'aria-label': label('Revert'),
        onclick: () => act(`revert ${v.number}`, () => call('POST', `${base}/revert`)),
      }, 'Revert'),
      v.number === newest ? h('button', {
        type: 'button', class: 'danger', 'aria-label': label('Delete'),
        onclick: () => {
          if (confirm(`Delete version ${v.number} (${v.file_name})?`)) {
            act(`delete ${v.number}`, () => call('DELETE', base));
          }
        },
      }, 'Delete') : null));
}

function mergeForm(vd) {
  const mode = h('select', { id: 'merge-mode' },
    h('option', { value: 'updates' }, 'merged updates'),
    h('option', { value: 'base' }, 'merged base'));
  const access = h('select', { id: 'merge-access' },
    h('option', { value: 'maintenance' }, 'maintenance'),
    h('option', { value: 'test' }, 'test'),
    h('option', { value: 'production' }, 'production'));
  return h('form', {
    class: 'inline', 'aria-label': 'Merge',
    onsubmit: (ev) => {
      ev.preventDefault();
      act('merge', () => call('POST', `/vdisks/${vd.id}/merge`,
        { mode: mode.value, access: access.value }));
    },
  }, h('label', { for: 'merge-mode' }, 'Merge'), mode,
  h('label', { for: 'merge-access' }, 'as'), access,
  h('button', { type: 'submit' }, 'Merge'));
}

async function showDetail(id) {
  const box = document.getElementById('vdisk-detail');
  if (id === null) {
    fill(box, h('p', { class: 'muted' }, 'Pick a vDisk.'));
    return;
  }
  const [vd, versions] = await Promise.all([
    call('GET', `/vdisks/${id}`), call('GET', `/vdisks/${id}/versions`),
  ]);
  const items = versions.items;
  const newest = items.length ? items[items.length - 1].number : null;
  fill(box,
    h('h2', {}, `vDisk ${vd.name}`),
    h('dl', { class: 'props' },
      h('dt', {}, 'Size'), h('dd', {}, bytes(vd.size_bytes)),
      h('dt', {}, 'Cache mode'), h('dd', {}, vd.cache_mode),
      h('dt', {}, 'RAM cache'), h('dd', {}, bytes(vd.ram_bytes)),
      h('dt', {}, 'Description'), h('dd', {}, vd.description || '—')),
    h('div', { class: 'toolbar' },
      h('button', {
        type: 'button', id: 'new-version',
        onclick: () => act('new version', () => call('POST', `/vdisks/${vd.id}/versions`)),
      }, 'New version'),
      mergeForm(vd),
      h('span', { id: 'action-status', class: 'muted', role: 'status' })),
    h('h3', {}, 'Version chain'),
    h('div', { class: 'table-wrap' }, h('table', { id: 'version-table' },
      h('caption', { class: 'sr-only' }, `Versions of ${vd.name}, oldest first`),
      h('thead', {}, h('tr', {},
        ['#', 'File', 'Parent', 'Access', 'Origin', 'Created', 'Changed', 'Actions']
          .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, items.slice().reverse().map((v) => versionRow(vd, v, newest))))));
}

export async function showVDisks(id) {
  const [vdisks, stores] = await Promise.all([all('/vdisks'), all('/stores')]);
  current = id ?? (vdisks.length ? vdisks[0].id : null);
  picklist(vdisks, stores);
  await showDetail(current);
}
