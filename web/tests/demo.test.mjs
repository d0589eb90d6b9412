// The demo page works: two tabs fire through the worker and both show the shared bucket.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';

import { launchBrowser, setup, sleep, sluiceBinary, startGateway, testConfig, workerState } from './harness.mjs';

test('demo page: two tabs fire and see the same bucket', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 5, rate: '2/s', queue: { depth: 5, max_wait_ms: 2000 } }));
  try {
    const tabs = [];
    for (let i = 0; i < 2; i++) {
      const page = i === 0 ? env.context.pages()[0] || (await env.context.newPage()) : await env.context.newPage();
      await page.goto(`${env.front.url}/sluice/demo.html`);
      await page.waitForFunction(() => !document.getElementById('toggle').disabled, null, { timeout: 15000 });
      await page.fill('#rate', '10');
      tabs.push(page);
    }
    for (const page of tabs) await page.click('#toggle');
    await sleep(3000);
    for (const page of tabs) await page.click('#toggle');
    await sleep(2500); // the last waiters settle (max wait 2 s) and the view refreshes
    const views = [];
    for (const page of tabs) {
      views.push(
        await page.evaluate(() => {
          const text = (id) => document.getElementById(id).textContent;
          return { sent: +text('sent'), ok: +text('ok'), limited: +text('limited'), tabs: text('tabs'), admitted: +text('admitted'), tokens: text('tokens'), error: text('error') };
        }),
      );
    }
    t.diagnostic(JSON.stringify(views));
    for (const v of views) {
      assert.equal(v.error, '');
      assert.ok(v.sent >= 20, `sent ${v.sent}`);
      assert.ok(v.ok >= 1 && v.limited >= 1, JSON.stringify(v));
      assert.equal(v.tabs, '2');
      assert.match(v.tokens, /^\d+ \/ 5/);
    }
    // Both tabs show the worker's totals: the same bucket.
    assert.equal(views[0].admitted, views[1].admitted);
    assert.equal(views[0].admitted, views[0].ok + views[1].ok);
    assert.equal(env.upstream.hitsFor('/api/demo/').length, views[0].admitted);
  } finally {
    await env.close();
  }
});

test('the embedded defaults of sluice serve: / links to the demo, whose tabs share 10 then 1/s', { timeout: 60000 }, async (t) => {
  // `sluice default-config` on free ports, with its built-in demo upstream: what
  // `sluice serve` runs without --config.
  const defaults = spawnSync(sluiceBinary(), ['default-config'], { encoding: 'utf8' });
  assert.equal(defaults.status, 0, defaults.stderr);
  assert.match(defaults.stdout, /^\[browser\]$/m);
  const gateway = await startGateway({
    toml: ({ listen, adminListen }) =>
      defaults.stdout.replace('"127.0.0.1:8080"', JSON.stringify(listen)).replace('"127.0.0.1:8081"', JSON.stringify(adminListen)),
  });
  const browser = await launchBrowser();
  try {
    const first = browser.context.pages()[0] || (await browser.context.newPage());
    await first.goto(`${gateway.url}/`);
    await first.click('a[href="/sluice/demo.html"]');
    await first.waitForURL('**/sluice/demo.html');
    const second = await browser.context.newPage();
    await second.goto(`${gateway.url}/sluice/demo.html`);
    const tabs = [first, second];
    for (const page of tabs) {
      await page.waitForFunction(() => !document.getElementById('toggle').disabled, null, { timeout: 15000 });
      await page.fill('#rate', '10');
    }
    const t0 = performance.now();
    for (const page of tabs) await page.click('#toggle');
    await sleep(3000);
    for (const page of tabs) await page.click('#toggle');
    await sleep(500);
    const view = (page) =>
      page.evaluate(() => {
        const text = (id) => document.getElementById(id).textContent;
        return { ok: +text('ok'), limited: +text('limited'), tabs: text('tabs'), tokens: text('tokens'), rate: text('ratecfg'), error: text('error') };
      });
    const views = [await view(first), await view(second)];
    t.diagnostic(JSON.stringify(views));
    for (const v of views) {
      assert.equal(v.error, '');
      assert.equal(v.tabs, '2');
      assert.equal(v.rate, '1/s, capacity 10');
      assert.match(v.tokens, /^\d+ \/ 10/);
      assert.ok(v.ok >= 1 && v.limited >= 1, JSON.stringify(v));
    }
    // One bucket: read the worker's total from each tab, the first tab twice around the second.
    const [a1, b, a2] = [await workerState(first), await workerState(second), await workerState(first)];
    assert.equal(a1.worker, b.worker);
    assert.ok(a1.totals.admitted <= b.totals.admitted && b.totals.admitted <= a2.totals.admitted);
    // Two tabs at 10 req/s each, capacity 10 then 1/s: the burst, then one a second (the
    // queue keeps the bucket busy until these reads).
    const bound = 10 + Math.ceil((performance.now() - t0) / 1000) + 1;
    assert.ok(a2.totals.admitted >= 12 && a2.totals.admitted <= bound, `admitted ${a2.totals.admitted}, bound ${bound}`);
  } finally {
    await browser.close();
    await gateway.close();
  }
});
