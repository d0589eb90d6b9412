#!/usr/bin/env node
// Cold start of the sluice Service Worker: fresh browser profiles, side by side with a page
// that has no worker.
//
//   node web/bench/coldstart.mjs [--profiles 20]
//
// Each round launches headless Chromium on a new, empty profile and opens two origins in front
// of one upstream (127.0.0.1): one without a worker and one that registers the sluice worker
// (the dev front serves the same /sluice/sw.js bytes as `sluice serve`, uncompressed). The
// order of the two alternates between rounds. Measured in the page, with performance.now():
//   no worker: first request   the first fetch of /api/ on the profile's first page
//   register -> controlled     navigator.serviceWorker.register() until the page is controlled
//                              (script download, wasm compile, install record, activate, claim)
//   controlled -> first answer the first /api/ fetch once controlled: the worker restores the
//                              bucket from IndexedDB and decides (admitted at once)
//   register -> first answer   the two above: from install to the first decided request
// Prints the median and p95 of each over the profiles.

import { launchBrowser, median, startDevFront, startUpstream } from '../tests/harness.mjs';

const args = { profiles: 20 };
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const PROFILES = Number(args.profiles);
if (!Number.isInteger(PROFILES) || PROFILES < 1) throw new Error(`--profiles must be a positive whole number, got ${args.profiles}`);

const CONFIG = {
  path_prefixes: ['/api/'],
  algorithm: 'token_bucket',
  capacity: 1000,
  rate: '1000/s',
  queue: { depth: 100, max_wait_ms: 10000 },
  max_queued_body_bytes: 65536,
  persist: true,
  telemetry: null,
};

async function withoutWorker(context, front) {
  const page = await context.newPage();
  await page.goto(front.url + '/');
  const ms = await page.evaluate(async () => {
    const start = performance.now();
    const r = await fetch('/api/first', { cache: 'no-store' });
    await r.text();
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    return performance.now() - start;
  });
  await page.close();
  return ms;
}

async function withWorker(context, front) {
  const page = await context.newPage();
  await page.goto(front.url + '/');
  const m = await page.evaluate(async () => {
    const t0 = performance.now();
    const controlled = new Promise((resolve) => navigator.serviceWorker.addEventListener('controllerchange', resolve, { once: true }));
    await navigator.serviceWorker.register('/sluice/sw.js', { scope: '/' });
    await controlled;
    const t1 = performance.now();
    const r = await fetch('/api/first', { cache: 'no-store' });
    await r.text();
    const t2 = performance.now();
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    const state = await (await fetch('/sluice/state', { cache: 'no-store' })).json();
    return { controlled: t1 - t0, first: t2 - t1, total: t2 - t0, admitted: state.totals.admitted, restored: state.restored_from };
  });
  await page.close();
  if (m.admitted < 1) throw new Error('the worker did not decide the first request');
  return m;
}

const upstream = await startUpstream();
const plain = await startDevFront({ upstream, config: CONFIG });
const limited = await startDevFront({ upstream, config: CONFIG });
const series = { 'no worker: first request': [], 'register -> controlled': [], 'controlled -> first answer': [], 'register -> first answer': [] };
const restoredFrom = {};
try {
  for (let p = 0; p < PROFILES; p++) {
    const browser = await launchBrowser(); // a new, empty profile
    try {
      const run = async (which) => {
        if (which === 'plain') {
          series['no worker: first request'].push(await withoutWorker(browser.context, plain));
        } else {
          const m = await withWorker(browser.context, limited);
          series['register -> controlled'].push(m.controlled);
          series['controlled -> first answer'].push(m.first);
          series['register -> first answer'].push(m.total);
          restoredFrom[m.restored] = (restoredFrom[m.restored] || 0) + 1;
        }
      };
      const order = p % 2 === 0 ? ['plain', 'sluice'] : ['sluice', 'plain'];
      for (const which of order) await run(which);
    } finally {
      await browser.close();
    }
  }
} finally {
  await plain.close();
  await limited.close();
  await upstream.close();
}

const p95 = (v) => [...v].sort((a, b) => a - b)[Math.min(v.length - 1, Math.ceil(v.length * 0.95) - 1)];
console.log(`| series (${PROFILES} fresh profiles) | median ms | p95 ms | min ms | max ms |`);
console.log('|---|---|---|---|---|');
for (const [name, v] of Object.entries(series)) {
  console.log(`| ${name} | ${median(v).toFixed(1)} | ${p95(v).toFixed(1)} | ${Math.min(...v).toFixed(1)} | ${Math.max(...v).toFixed(1)} |`);
}
const added = median(series['controlled -> first answer']) - median(series['no worker: first request']);
console.log(`\nfirst request once controlled, sluice vs no worker (difference of medians): ${added.toFixed(1)} ms`);
console.log(`restored_from at the first request: ${JSON.stringify(restoredFrom)}`);
