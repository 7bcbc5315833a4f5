// The console's shell: log in with an API token, switch screens by the URL's hash
// (#/farm, #/vdisks, #/vdisks/ID, #/devices), and show API errors in one alert.

import { ApiError, call, setToken, token } from './api.js';
import { showTree } from './tree.js';
import { showVDisks } from './vdisks.js';
import { startDevices, stopDevices } from './devices.js';

const $ = (id) => document.getElementById(id);

/** Shows an error (an ApiError's message is the server's `error` text) until dismissed. */
export function showError(e) {
  const box = $('alert');
  const msg = e instanceof ApiError ? e.message : String(e && e.message ? e.message : e);
  box.replaceChildren();
  const text = document.createElement('span');
  text.textContent = msg;
  const close = document.createElement('button');
  close.type = 'button';
  close.textContent = 'Dismiss';
  close.addEventListener('click', () => { box.hidden = true; });
  box.append(text, close);
  box.hidden = false;
  if (e instanceof ApiError && e.status === 401) logout();
}

export function clearError() {
  $('alert').hidden = true;
}

function screens() {
  return ['farm', 'vdisks', 'devices'];
}

function showLogin(message) {
  stopDevices();
  $('login').hidden = false;
  $('nav').hidden = true;
  $('logout').hidden = true;
  $('who').textContent = '';
  for (const s of screens()) $(`screen-${s}`).hidden = true;
  const err = $('login-error');
  err.hidden = !message;
  err.textContent = message || '';
  $('token').focus();
}

function logout() {
  setToken(null);
  showLogin();
}

async function route() {
  if (!token()) {
    showLogin();
    return;
  }
  $('login').hidden = true;
  $('nav').hidden = false;
  $('logout').hidden = false;
  const [screen, arg] = location.hash.replace(/^#\/?/, '').split('/');
  const name = screens().includes(screen) ? screen : 'farm';
  for (const s of screens()) $(`screen-${s}`).hidden = s !== name;
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.screen === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (name !== 'devices') stopDevices();
  try {
    if (name === 'farm') await showTree();
    else if (name === 'vdisks') await showVDisks(arg ? Number(arg) : null);
    else startDevices();
  } catch (e) {
    showError(e);
  }
}

async function login(ev) {
  ev.preventDefault();
  const t = $('token').value.trim();
  if (!t) return;
  setToken(t);
  try {
    const farm = await call('GET', '/farm');
    $('who').textContent = `farm ${farm.name}`;
    $('token').value = '';
    clearError();
    await route();
  } catch (e) {
    setToken(null);
    showLogin(e.message);
  }
}

async function start() {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', logout);
  window.addEventListener('hashchange', () => { clearError(); route(); });
  if (token()) {
    try {
      const farm = await call('GET', '/farm');
      $('who').textContent = `farm ${farm.name}`;
    } catch (e) {
      setToken(null);
      showLogin(e.message);
      return;
    }
  }
  await route();
}

start();
