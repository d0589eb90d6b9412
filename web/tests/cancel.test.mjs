// Requests that leave the queue without spending a token: the waiters of a tab that closed,
// and a politeFetch aborted by its page. Chromium does not abort the worker's request.signal
// in either case (web/README.md, "Pages that go away").
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { openTab, setup, sleep, testConfig, workerState } from './harness.mjs';
import { workerSession } from './worker-cdp.mjs';

test('a closed tab leaves the queue: the next tab gets the refilled token at once', { timeout: 60000 }, async () => {
  const env = await setup(testConfig({ capacity: 1, rate: '1/s', queue: { depth: 20, max_wait_ms: 20000 } }));
  try {
    const a = await openTab(env.context, env.front);
    const b = await openTab(env.context, env.front);
    // A spends the token and queues 10 more (due at 1 s, 2 s, ... after it), then closes.
    await a.evaluate(async () => {
      await (await fetch('/api/a/first', { cache: 'no-store' })).text();
      for (let i = 0; i < 10; i++) fetch(`/api/a/q${i}`, { cache: 'no-store' }).catch(() => {});
    });
    const spent = performance.now();
    await sleep(150);
    assert.equal((await workerState(b)).queued, 10);
    await a.close();
    // After the refill: B's request finds the token the closed tab's first waiter would have taken.
    await sleep(Math.max(0, spent + 1300 - performance.now()));
    const r = await b.evaluate(async () => {
      const start = performance.now();
      const res = await fetch('/api/b/1', { cache: 'no-store' });
      await res.text();
      return { status: res.status, ms: performance.now() - start };
    });
    assert.equal(r.status, 200);
    assert.ok(r.ms < 300, `B waited ${Math.round(r.ms)} ms for a token a closed tab took`);
    const state = await workerState(b);
    assert.equal(state.queued, 0);
    assert.equal(state.totals.cancelled, 10);
    await sleep(500);
    assert.deepEqual(env.upstream.hitsFor('/api/a/q'), [], 'a closed tab\'s request went upstream');
  } finally {
    await env.close();
  }
});

test('two tabs that close before a wake-up both leave the queue: the open tab takes the token', { timeout: 60000 }, async () => {
  const env = await setup(testConfig({ capacity: 1, rate: '1/s', queue: { depth: 20, max_wait_ms: 20000 } }));
  try {
    const a = await openTab(env.context, env.front);
    const b = await openTab(env.context, env.front);
    const c = await openTab(env.context, env.front);
    // B spends the token; then B, C and A queue one request each, in that order (due at 1 s,
    // 2 s and 3 s after the spend).
    await b.evaluate(async () => {
      await (await fetch('/api/b/first', { cache: 'no-store' })).text();
    });
    const spent = performance.now();
    const queue = async (page, path, n) => {
      await page.evaluate((p) => void fetch(p, { cache: 'no-store' }).catch(() => {}), path);
      for (let i = 0; (await workerState(a)).queued < n; i++) {
        assert.ok(i < 100, `${path} never queued`);
        await sleep(10);
      }
    };
    await queue(b, '/api/b/w', 1);
    await queue(c, '/api/c/w', 2);
    const answered = a
      .evaluate(async () => {
        const res = await fetch('/api/a/w', { cache: 'no-store' });
        await res.text();
        return res.status;
      })
      .then((status) => ({ status, at: performance.now() - spent }));
    for (let i = 0; (await workerState(a)).queued < 3; i++) {
      assert.ok(i < 100, '/api/a/w never queued');
      await sleep(10);
    }
    // B and C close while the worker is busy (a loop run in it through DevTools) until past the
    // first token's time: the first sweep that finds them closed is the one before that
    // wake-up, with the token due. Both waiters must be gone before the token is handed out.
    const worker = await workerSession(a);
    const busyMs = Math.max(0, spent + 1400 - performance.now());
    const busy = worker.send('Runtime.evaluate', {
      expression: `{ const until = performance.now() + ${busyMs}; while (performance.now() < until) {} }`,
    });
    await Promise.all([b.close(), c.close()]);
    await busy;
    await worker.detach();
    const r = await answered;
    assert.equal(r.status, 200);
    assert.ok(r.at < 1900, `the open tab's waiter was answered ${Math.round(r.at)} ms after the spend: it waited for the second token while a closed tab's waiter took the first`);
    const state = await workerState(a);
    assert.equal(state.queued, 0);
    assert.equal(state.totals.cancelled, 2);
    await sleep(300);
    assert.deepEqual(env.upstream.hitsFor('/api/b/w'), [], 'a closed tab\'s request went upstream');
    assert.deepEqual(env.upstream.hitsFor('/api/c/w'), [], 'a closed tab\'s request went upstream');
  } finally {
    await env.close();
  }
});

test('an aborted politeFetch leaves the queue: the next waiter takes its turn', { timeout: 60000 }, async () => {
  const env = await setup(testConfig({ capacity: 1, rate: '1/s', queue: { depth: 20, max_wait_ms: 20000 } }));
  try {
    const page = await openTab(env.context, env.front);
    const r = await page.evaluate(async () => {
      const { politeFetch } = await import('/sluice/client.js');
      await (await fetch('/api/abort/first', { cache: 'no-store' })).text();
      const ac = new AbortController();
      const start = performance.now();
      const first = politeFetch('/api/abort/w1', { cache: 'no-store' }, { signal: ac.signal }).then(
        (res) => `answered ${res.status}`,
        (e) => e.name,
      );
      const second = fetch('/api/abort/w2', { cache: 'no-store' }).then(async (res) => {
        await res.text();
        return { status: res.status, ms: performance.now() - start };
      });
      setTimeout(() => ac.abort(), 200);
      return { first: await first, second: await second };
    });
    assert.equal(r.first, 'AbortError');
    assert.equal(r.second.status, 200);
    // Due at the first refill (1 s), not the second (2 s).
    assert.ok(r.second.ms < 1600, `the waiter behind an aborted request waited ${Math.round(r.second.ms)} ms`);
    const state = await workerState(page);
    assert.equal(state.totals.cancelled, 1);
    assert.deepEqual(env.upstream.hitsFor('/api/abort/w1'), [], 'the aborted request went upstream');
  } finally {
    await env.close();
  }
});
