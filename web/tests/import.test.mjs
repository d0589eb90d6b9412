// The import forms of the worker inside an app's own Service Worker, from the files of
// `sluice bundle` on a plain static host: a Workbox worker (workbox-sw with its modules served
// locally) that precaches its page and routes /api/* through `self.sluice.handle(event)`;
// and an ES module worker that imports `sluice-sw.mjs`. The app's caching works (the page
// loads from the precache with the host gone) and the limits hold (a burst gets 429s).
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'node:test';

import { fire, launchBrowser, WEB, workerState } from './harness.mjs';
import { bundleFrom, startStaticHost, tempDir } from './static-host.mjs';

const TOML = `
[browser]
path_prefixes = ["/api/"]
capacity = 3
rate = "1/s"
queue = { depth = 0, max_wait = "0s" }
telemetry = false
`;

/** workbox-sw and the modules it loads, copied from node_modules to `dir/workbox/`. */
function copyWorkbox(dir) {
  const to = join(dir, 'workbox');
  mkdirSync(to, { recursive: true });
  copyFileSync(join(WEB, 'node_modules', 'workbox-sw', 'build', 'workbox-sw.js'), join(to, 'workbox-sw.js'));
  for (const m of ['core', 'precaching', 'routing', 'strategies']) {
    const file = `workbox-${m}.prod.js`;
    copyFileSync(join(WEB, 'node_modules', `workbox-${m}`, 'build', file), join(to, file));
  }
}

// The app's own worker: Workbox owns the lifecycle and the caching; sluice decides /api/*.
const WORKBOX_SW = `
importScripts('/workbox/workbox-sw.js');
workbox.setConfig({ modulePathPrefix: '/workbox/', debug: false });
importScripts('/sluice-sw-import.js');

workbox.core.skipWaiting();
workbox.core.clientsClaim();
workbox.precaching.precacheAndRoute([
  { url: '/app.html', revision: '1' },
  { url: '/sluice-client.js', revision: '1' },
]);
// sluice answers what it limits (a wait, a 429, /sluice/state); what it admits at once
// (undefined) this route fetches itself.
workbox.routing.registerRoute(
  ({ url }) => url.pathname.startsWith('/api/') || url.pathname === '/sluice/state',
  async ({ event, request }) => (await self.sluice.handle(event)) || fetch(request),
);
self.addEventListener('message', (event) => self.sluice.message(event));
`;

const APP = `<!doctype html>
<meta charset="utf-8">
<title>app</title>
<p id="app">the precached app page</p>
<script type="module">
  import { register } from './sluice-client.js';
  window.ready = register({ url: '/app-sw.js' }).then(() => true);
</script>
`;

test('a Workbox worker precaches its page and routes /api/* through self.sluice.handle', { timeout: 60000 }, async (t) => {
  const tmp = await tempDir();
  const out = await bundleFrom(tmp.dir, TOML);
  copyWorkbox(out);
  await writeFile(join(out, 'app-sw.js'), WORKBOX_SW);
  await writeFile(join(out, 'app.html'), APP);
  const host = await startStaticHost(out);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const errors = [];
    // Script errors (a Workbox module that did not load, ...); a 404 or 429 is logged too.
    page.on('console', (m) => m.type() === 'error' && !m.text().startsWith('Failed to load resource') && errors.push(m.text()));
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(host.url + '/app.html');
    assert.equal(await page.evaluate(() => window.ready), true);
    const state = await workerState(page);
    assert.equal(state.disabled, null);
    assert.equal(state.capacity, 3);
    assert.equal(state.restored_from, 'install', 'the import form writes the install record of a fresh registration');
    const cached = await page.evaluate(async () => {
      const urls = [];
      for (const name of await caches.keys()) {
        for (const req of await (await caches.open(name)).keys()) urls.push(new URL(req.url).pathname);
      }
      return urls;
    });
    assert.ok(cached.some((u) => u.startsWith('/app.html')), `precached: ${cached}`);

    // No queue: 3 at once, then 429 limit.
    const burst = await fire(page, { path: '/api/burst/', perSecond: 1000, durationMs: 8 });
    const admitted = burst.filter((r) => r.status !== 429);
    const refused = burst.filter((r) => r.status === 429);
    t.diagnostic(`admitted ${admitted.length} (${admitted.map((r) => r.status)}), refused ${refused.length}`);
    assert.ok(admitted.length >= 3 && admitted.length <= 4, `${admitted.length} admitted`);
    assert.ok(admitted.every((r) => r.status === 404), 'admitted ones reached the host (404)');
    assert.ok(refused.length >= 4 && refused.every((r) => r.limiter === 'browser' && r.reason === 'limit'));
    assert.equal(host.requests('/api/burst/').length, admitted.length);
    assert.deepEqual(errors, []);

    // The host is gone: the page still loads, from Workbox's precache.
    await host.close();
    await page.reload();
    assert.equal(await page.textContent('#app'), 'the precached app page');
    assert.equal(await page.evaluate(() => window.ready), true);
  } finally {
    await browser.close();
    await host.close();
    await tmp.remove();
  }
});

// An ES module worker: `import { sluice } from './sluice-sw.mjs'`, its own fetch listener, no
// lifecycle listeners at all (so nothing claims the first page: it is controlled from its next
// load), and one path under /api/ it chooses not to hand to sluice.
const MODULE_SW = `
import { sluice } from './sluice-sw.mjs';
self.addEventListener('fetch', (event) => {
  if (new URL(event.request.url).pathname.startsWith('/api/free/')) return;
  const answer = sluice.handle(event);
  if (answer) event.respondWith(answer);
});
`;

const MODULE_PAGE = `<!doctype html>
<meta charset="utf-8">
<title>module worker</title>
<script type="module">
  window.ready = (async () => {
    await navigator.serviceWorker.register('/module-sw.js', { type: 'module', scope: '/' });
    await navigator.serviceWorker.ready;
    return { controlled: navigator.serviceWorker.controller !== null };
  })();
</script>
`;

test('an ES module worker imports sluice-sw.mjs: it owns the lifecycle and the routing, the limits hold', { timeout: 60000 }, async (t) => {
  const tmp = await tempDir();
  const out = await bundleFrom(tmp.dir, TOML);
  await writeFile(join(out, 'module-sw.js'), MODULE_SW);
  await writeFile(join(out, 'index.html'), MODULE_PAGE);
  const host = await startStaticHost(out);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(host.url + '/index.html');
    // Active, but sluice claimed no client: the first page stays uncontrolled.
    assert.deepEqual(await page.evaluate(() => window.ready), { controlled: false });
    await page.reload();
    assert.deepEqual(await page.evaluate(() => window.ready), { controlled: true });
    const state = await workerState(page);
    assert.equal(state.disabled, null);
    assert.equal(state.restored_from, 'install');
    const burst = await fire(page, { path: '/api/m/', perSecond: 1000, durationMs: 8 });
    const admitted = burst.filter((r) => r.status !== 429).length;
    // sluice registered no fetch listener of its own: what the app does not hand it is not limited.
    const free = await fire(page, { path: '/api/free/', perSecond: 1000, durationMs: 8 });
    t.diagnostic(`admitted ${admitted} of 8; /api/free/: ${free.filter((r) => r.status === 404).length} of 8 reached the host`);
    assert.ok(admitted >= 3 && admitted <= 4, `${admitted} admitted`);
    assert.ok(burst.filter((r) => r.status === 429).every((r) => r.limiter === 'browser' && r.reason === 'limit'));
    assert.deepEqual(free.map((r) => r.status), Array(8).fill(404));
  } finally {
    await browser.close();
    await host.close();
    await tmp.remove();
  }
});
