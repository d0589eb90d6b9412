// The demo page works: two tabs fire through the worker and both show the shared bucket.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { setup, sleep, testConfig } from './harness.mjs';

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
