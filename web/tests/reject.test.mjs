// A full queue and a wait beyond the maximum give 429 with Retry-After and a JSON
// reason; large bodies never wait; assets and navigations are never delayed, even while the
// queue is full.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { openTab, setup, testConfig, workerState } from './harness.mjs';

/** Starts `n` fetches at once in the page; resolves when `settled` of them have answered. */
function burst(page, { path, n, init = {}, settled = n }) {
  return page.evaluate(
    async ({ path, n, init, settled }) => {
      const results = [];
      await new Promise((done) => {
        for (let i = 0; i < n; i++) {
          const start = performance.now();
          fetch(`${path}${i}`, { cache: 'no-store', ...init })
            .then(async (r) => ({
              i,
              status: r.status,
              ms: performance.now() - start,
              retryAfter: r.headers.get('retry-after'),
              type: r.headers.get('content-type'),
              body: r.status === 429 ? await r.json() : null,
            }))
            .catch((e) => ({ i, status: 0, error: String(e) }))
            .then((r) => {
              results.push(r);
              if (results.length === settled) done();
            });
        }
      });
      return results.sort((a, b) => a.i - b.i);
    },
    { path, n, init, settled },
  );
}

/** Times one fetch from the page. */
function timed(page, path, init = {}) {
  return page.evaluate(
    async ([path, init]) => {
      const start = performance.now();
      const r = await fetch(path, { cache: 'no-store', ...init });
      await r.text();
      return { status: r.status, ms: performance.now() - start, limiter: r.headers.get('x-sluice-limiter') };
    },
    [path, init],
  );
}

test('queue full: 429 queue_full with Retry-After; assets and navigations pass at once', { timeout: 60000 }, async (t) => {
  // One token per 5 s and two places in the queue: the third waiter finds it full.
  const env = await setup(testConfig({ capacity: 1, rate: '12/min', queue: { depth: 2, max_wait_ms: 15000 } }));
  try {
    const page = await openTab(env.context, env.front);
    // 1 admitted, 2 waiting (5 s, 10 s), the 4th and 5th find the queue full.
    const results = await burst(page, { path: '/api/full/', n: 5, settled: 3 });
    const full = results.filter((r) => r.status === 429);
    assert.equal(results.filter((r) => r.status === 200).length, 1);
    assert.equal(full.length, 2);
    for (const r of full) {
      assert.equal(r.body.reason, 'queue_full');
      assert.equal(r.type, 'application/problem+json');
      // The next free moment is 15 s away: after both waiters.
      assert.ok(r.body.retry_after_ms > 14000 && r.body.retry_after_ms <= 15000, `${r.body.retry_after_ms}`);
      assert.equal(r.retryAfter, String(Math.ceil(r.body.retry_after_ms / 1000)));
    }
    assert.equal((await workerState(page)).queued, 2);

    // While the queue is full: assets, the worker's own pages and navigations are untouched.
    const timings = {
      asset: await timed(page, '/static/app.css'),
      demo: await timed(page, '/sluice/demo.html'),
      client: await timed(page, '/sluice/client.js'),
      other: await timed(page, '/elsewhere/data.json'),
    };
    for (const [name, r] of Object.entries(timings)) {
      assert.ok(r.status === 200 || (name === 'other' && r.status === 404), `${name}: ${r.status}`);
      assert.equal(r.limiter, null, `${name} went through the limiter`);
      assert.ok(r.ms < 500, `${name} took ${r.ms} ms`);
    }
    const nav = await env.context.newPage();
    const navStart = performance.now();
    const response = await nav.goto(`${env.front.url}/page/next`);
    const navMs = performance.now() - navStart;
    assert.equal(response.status(), 200);
    assert.ok(navMs < 1500, `navigation took ${navMs} ms`);
    // Also a navigation under a limited prefix is not limited (mode 'navigate').
    const apiNav = await nav.goto(`${env.front.url}/api/as-a-page`);
    assert.equal(apiNav.status(), 200);
    assert.equal((await workerState(page)).queued, 2, 'the queue was full throughout');
    assert.ok(env.upstream.hitsFor('/static/app.css').length === 1);
    t.diagnostic(
      `429 queue_full Retry-After ${full[0].retryAfter} s (${full[0].body.retry_after_ms} ms); while full: ` +
        Object.entries(timings).map(([k, v]) => `${k} ${v.ms.toFixed(1)} ms`).join(', ') +
        `, navigation ${navMs.toFixed(0)} ms`,
    );
  } finally {
    await env.close();
  }
});

test('wait beyond the maximum: 429 timeout; a large body never waits', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 1, rate: '1/s', max_queued_body_bytes: 1024, queue: { depth: 10, max_wait_ms: 1500 } }));
  try {
    const page = await openTab(env.context, env.front);
    // 1 admitted, 1 waits 1 s, the 3rd would wait 2 s > 1.5 s.
    const results = await burst(page, { path: '/api/wait/', n: 3 });
    assert.deepEqual(results.map((r) => r.status), [200, 200, 429]);
    const late = results[2];
    assert.equal(late.body.reason, 'timeout');
    assert.ok(late.body.retry_after_ms > 1900 && late.body.retry_after_ms <= 2000, `${late.body.retry_after_ms}`);
    assert.equal(late.retryAfter, '2');
    assert.ok(late.ms < 500, `refused at the door, in ${late.ms} ms`);
    assert.ok(results[1].ms >= 900 && results[1].ms < 1500 + 500, `the waiter took ${results[1].ms} ms`);

    // The bucket is empty again: a small POST waits, a large one is refused at once with
    // reason "limit" (it may not wait), and one that fits the bucket later is admitted.
    const big = 'x'.repeat(2048);
    const [small, large] = await Promise.all([
      timed(page, '/api/post/small', { method: 'POST', body: 'tiny' }),
      page.evaluate(async (big) => {
        await new Promise((r) => setTimeout(r, 20));
        const start = performance.now();
        const r = await fetch('/api/post/large', { method: 'POST', body: big });
        return { status: r.status, ms: performance.now() - start, body: await r.json(), retryAfter: r.headers.get('retry-after') };
      }, big),
    ]);
    assert.equal(small.status, 200);
    assert.ok(small.ms > 500, `the small POST waited (${small.ms} ms)`);
    assert.equal(large.status, 429);
    assert.equal(large.body.reason, 'limit');
    assert.ok(large.ms < 500, `the large POST was refused at once (${large.ms} ms)`);
    assert.match(large.retryAfter, /^[12]$/);
    await page.waitForTimeout(1100);
    const later = await timed(page, '/api/post/large2', { method: 'POST', body: big });
    assert.equal(later.status, 200, 'a large body is admitted when a token is there');
    assert.ok(later.ms < 500);
    t.diagnostic(`429 timeout Retry-After ${late.retryAfter} (${late.body.retry_after_ms} ms); large POST refused in ${large.ms.toFixed(1)} ms`);
  } finally {
    await env.close();
  }
});
