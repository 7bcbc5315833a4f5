// The console end to end in Debian's headless Chromium, driven by playwright-core. Run by
// crates/api/tests/console_e2e.rs, which starts the API on a temporary farm, logs a device in
// and reports its counters, then passes what it made in the environment:
//
//   FERRY_URL          the server, e.g. https://127.0.0.1:PORT
//   FERRY_TOKEN        an admin API token
//   FERRY_VDISK        the demo vDisk's name (version 0, production)
//   FERRY_DEVICE_MAC   the MAC of the device that logged in
//   FERRY_SERVER       the name of the server its counters name
//   FERRY_SITE         the site's name; FERRY_COLLECTION the collection's
//   FERRY_OUT          where screenshots go (one per screen; failure.png on failure)
//   FERRY_CHROMIUM     the browser (default /usr/bin/chromium)
//   FERRY_SPKI         over HTTPS: base64 SHA-256 of the server certificate's
//                      SubjectPublicKeyInfo (--ignore-certificate-errors-spki-list)
//
// Exits 0 when every check passed, 1 with the failed check on stderr otherwise.

import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const env = (k, d) => {
  const v = process.env[k] ?? d;
  if (v === undefined) throw new Error(`${k} is not set`);
  return v;
};
const URL = env('FERRY_URL');
const TOKEN = env('FERRY_TOKEN');
const VDISK = env('FERRY_VDISK');
const MAC = env('FERRY_DEVICE_MAC');
const SERVER = env('FERRY_SERVER');
const GONE_SERVER = env('FERRY_GONE_SERVER');
const SITE = env('FERRY_SITE');
const COLLECTION = env('FERRY_COLLECTION');
const OUT = env('FERRY_OUT');
// Over HTTPS: the base64 SHA-256 of the server key's SubjectPublicKeyInfo, the one
// certificate key Chromium accepts without a trusted chain (not every certificate).
const SPKI = process.env.FERRY_SPKI;
const TIMEOUT_MS = 15000;

mkdirSync(OUT, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), 'ferry-chromium-'));
// A persistent context is how playwright takes a fresh --user-data-dir (`profile`).
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: env('FERRY_CHROMIUM', '/usr/bin/chromium'),
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ...(SPKI ? [`--ignore-certificate-errors-spki-list=${SPKI}`] : [])],
  viewport: { width: 1280, height: 860 },
  timeout: 60000,
});
const page = browser.pages()[0] ?? await browser.newPage();
page.setDefaultTimeout(TIMEOUT_MS);

// Every request the page makes must go to the server under test (no CDN, no other host).
const foreign = [];
page.on('request', (r) => {
  if (!r.url().startsWith(URL) && !r.url().startsWith('data:')) foreign.push(r.url());
});
const consoleErrors = [];
page.on('pageerror', (e) => consoleErrors.push(String(e)));

let step = 'start';
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}
async function text(sel) {
  return (await page.locator(sel).innerText()).trim();
}
async function shot(name) {
  await page.screenshot({ path: join(OUT, `${name}.png`), fullPage: true });
}

try {
  step = 'login screen';
  await page.goto(`${URL}/`);
  await page.locator('#login').waitFor({ state: 'visible' });
  check(await page.locator('#nav').isHidden(), 'the screens are hidden before login');

  step = 'wrong token is refused with the API message';
  await page.fill('#token', 'not-a-token');
  await page.click('#login-form button[type=submit]');
  await page.locator('#login-error').waitFor({ state: 'visible' });
  check((await text('#login-error')).includes('unknown token'),
    `login error shows the API's message, got ${await text('#login-error')}`);
  await shot('login-error');

  step = 'log in';
  await page.fill('#token', TOKEN);
  await page.click('#login-form button[type=submit]');
  await page.locator('#screen-farm').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('ferry.token')) === TOKEN,
    'the token is kept in session storage');

  step = 'farm tree';
  const tree = page.locator('#farm-tree');
  for (const name of [SITE, SERVER, COLLECTION, MAC, VDISK]) {
    await tree.getByText(name, { exact: false }).first().waitFor();
  }
  check((await tree.innerText()).includes('alive'), 'the heartbeating server is alive');
  await shot('farm');

  step = 'vdisk with its base version';
  await page.click('#nav a[data-screen=vdisks]');
  await page.locator('#vdisk-detail h2', { hasText: VDISK }).waitFor();
  const row = (n) => page.locator(`#version-table tr[data-version="${n}"]`);
  await row(0).waitFor();
  check((await row(0).locator('td.access').innerText()).trim() === 'production',
    'version 0 is in production');

  step = 'new version';
  await page.click('#new-version');
  await row(1).waitFor();
  check((await row(1).locator('td.access').innerText()).trim() === 'maintenance',
    'the new version 1 is in maintenance');
  check((await row(1).innerText()).includes(`${VDISK}.1.avhdx`), 'version 1 file name');
  check((await row(1).innerText()).includes('console-e2e'), 'version 1 names who made it');

  step = 'merge refused while a maintenance version exists: the API error is shown';
  await page.click('form[aria-label=Merge] button[type=submit]');
  await page.locator('#alert').waitFor({ state: 'visible' });
  check((await text('#alert')).toLowerCase().includes('maintenance'),
    `merge error names the maintenance version, got ${await text('#alert')}`);
  await shot('merge-refused');
  await page.click('#alert button');

  step = 'promote to test';
  await row(1).getByRole('button', { name: 'Promote version 1' }).click();
  await row(1).locator('td.access', { hasText: 'test' }).waitFor();
  step = 'promote to production';
  await row(1).getByRole('button', { name: 'Promote version 1' }).click();
  await row(1).locator('td.access', { hasText: 'production' }).waitFor();
  check(await row(1).getByRole('button', { name: 'Promote version 1' }).isDisabled(),
    'a production version cannot be promoted further');
  check((await text('#action-status')).includes('promote 1: done'), 'the action is reported');

  step = 'revert one step (no production device boots version 1) and promote again';
  await row(1).getByRole('button', { name: 'Revert version 1' }).click();
  await row(1).locator('td.access', { hasText: 'test' }).waitFor();
  await row(1).getByRole('button', { name: 'Promote version 1' }).click();
  await row(1).locator('td.access', { hasText: 'production' }).waitFor();
  await shot('vdisks');

  step = 'devices: the connected device with its counters';
  await page.click('#nav a[data-screen=devices]');
  const dev = page.locator(`#device-rows tr[data-device="${MAC}"]`);
  await dev.waitFor();
  check((await dev.locator('td.state').innerText()).trim() === 'connected', 'device connected');
  const server = (await dev.locator('td.server').innerText()).trim();
  check(server === SERVER, `the connected device names its server ${SERVER} (shown: ${server})`);
  check((await dev.locator('td.version').innerText()).includes('0'), 'device boots version 0');
  check((await dev.locator('td.cache').innerText()).trim() === 'ram_overflow',
    'device cache mode');
  check(/ (KiB|MiB|GiB)$/.test((await dev.locator('td.bytes-read').innerText()).trim()),
    'bytes read shown with a unit');
  const readCache = (await dev.locator('td.read-cache').innerText()).trim();
  check(readCache === '5.0 MiB / 2.0 MiB',
    `the read cache's hit and fetched bytes are shown (shown: ${readCache})`);

  step = 'live polling: counters grow and the chart draws them';
  const before = (await dev.locator('td.bytes-read').innerText()).trim();
  await page.waitForFunction(([mac, was]) => {
    const c = document.querySelector(`#device-rows tr[data-device="${mac}"] td.bytes-read`);
    const path = document.querySelector('#chart path[data-series=read]');
    return c && c.textContent.trim() !== was && path &&
      Number(path.getAttribute('data-points')) >= 2;
  }, [MAC, before], { timeout: TIMEOUT_MS });
  const after = (await page.locator(`#device-rows tr[data-device="${MAC}"] td.bytes-read`)
    .innerText()).trim();
  check(after !== before, `bytes read changes between polls (${before} → ${after})`);
  check((await text('#chart-legend')).includes('/s'), 'the chart legend shows a rate');
  await shot('devices');

  step = 'farm tree: drain the server and end the drain';
  await page.click('#nav a[data-screen=farm]');
  const tree2 = page.locator('#farm-tree');
  check((await tree2.innerText()).includes('rating 100'), 'the server shows its rating');
  await tree2.getByRole('button', { name: `Drain server ${SERVER}`, exact: true }).click();
  await tree2.getByRole('button', { name: `Undrain server ${SERVER}`, exact: true }).waitFor();
  check((await tree2.innerText()).includes('draining'), 'a drained server shows it');
  const drained = await page.evaluate(async (name) => {
    const r = await fetch('/api/v1/servers', {
      headers: { Authorization: `Bearer ${sessionStorage.getItem('ferry.token')}` },
    });
    return (await r.json()).items.find((x) => x.name === name).draining;
  }, SERVER);
  check(drained === true, 'the farm records the drain');
  await tree2.getByRole('button', { name: `Undrain server ${SERVER}`, exact: true }).click();
  await tree2.getByRole('button', { name: `Drain server ${SERVER}`, exact: true }).waitFor();
  check(!(await tree2.innerText()).includes('draining'), 'the drain ended');
  await shot('farm-drain');

  step = 'farm tree: remove a gone server';
  check((await tree2.innerText()).includes(GONE_SERVER), 'the gone server is in the tree');
  check(await tree2.getByRole('button', { name: `Remove server ${SERVER}`, exact: true })
    .count() === 0, 'a running server has no Remove button');
  await tree2.getByRole('button', { name: `Remove server ${GONE_SERVER}`, exact: true }).click();
  await page.waitForFunction((name) => !document.getElementById('farm-tree').innerText
    .includes(name), GONE_SERVER, { timeout: TIMEOUT_MS });
  const left = await page.evaluate(async () => {
    const r = await fetch('/api/v1/servers', {
      headers: { Authorization: `Bearer ${sessionStorage.getItem('ferry.token')}` },
    });
    return (await r.json()).items.map((x) => x.name);
  });
  check(!left.includes(GONE_SERVER) && left.includes(SERVER),
    `the farm removed the gone server and kept the running one (left: ${left.join(', ')})`);

  step = 'log out';
  await page.click('#logout');
  await page.locator('#login').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('ferry.token')) === null,
    'log out forgets the token');

  check(foreign.length === 0, `requests to other hosts: ${foreign.join(', ')}`);
  check(consoleErrors.length === 0, `page errors: ${consoleErrors.join('; ')}`);
  console.log('console e2e: all checks passed');
} catch (e) {
  console.error(`console e2e failed at step "${step}": ${e.message}`);
  try {
    await page.screenshot({ path: join(OUT, 'failure.png'), fullPage: true });
    console.error(`screenshot: ${join(OUT, 'failure.png')}`);
  } catch (s) {
    console.error(`no screenshot: ${s.message}`);
  }
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
