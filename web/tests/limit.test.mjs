// Three tabs share one bucket. Capacity 10, 1/s, queue 100 deep with a 10 s
// maximum wait; each tab fires 20 req/s for 10 s; the front itself does not limit.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, openTab, setup, sleep, testConfig, workerState } from './harness.mjs';

const CAPACITY = 10;
const PER_SECOND = 1;
const MAX_WAIT_MS = 10000;

test('three tabs at 20 req/s for 10 s: upstream sees at most capacity + rate*t (+1)', { timeout: 90000 }, async (t) => {
  const env = await setup(testConfig({ capacity: CAPACITY, rate: `${PER_SECOND}/s`, queue: { depth: 100, max_wait_ms: MAX_WAIT_MS } }));
  try {
    const tabs = [];
    for (let i = 0; i < 3; i++) tabs.push(await openTab(env.context, env.front));
    const t0 = performance.now();
    const results = await Promise.all(tabs.map((page, i) => fire(page, { path: `/api/t1/${i}/`, perSecond: 20, durationMs: 10000 })));
    const hits = env.upstream.hitsFor('/api/t1/').sort((a, b) => a.t - b.t);

    // Every upstream hit k (1-based) at time t: k <= capacity + rate * (t - t0) + 1.
    let worst = -Infinity;
    hits.forEach((h, k) => {
      const allowed = CAPACITY + (PER_SECOND * (h.t - t0)) / 1000 + 1;
      worst = Math.max(worst, k + 1 - allowed);
      assert.ok(k + 1 <= allowed, `hit ${k + 1} at ${Math.round(h.t - t0)} ms exceeds ${allowed.toFixed(2)}`);
    });
    const inWindow = hits.filter((h) => h.t - t0 <= 10000).length;
    assert.ok(inWindow <= CAPACITY + PER_SECOND * 10 + 1, `${inWindow} hits in the first 10 s`);
    // And the bucket was used, not just blocked: the burst plus most of the refill went through.
    assert.ok(inWindow >= CAPACITY + PER_SECOND * 10 - 3, `only ${inWindow} hits in the first 10 s`);

    const all = results.flat();
    assert.equal(all.length, 600);
    const ok = all.filter((r) => r.status === 200);
    const limited = all.filter((r) => r.status === 429);
    const other = all.filter((r) => r.status !== 200 && r.status !== 429);
    assert.deepEqual(other, [], 'every request got 200 or 429');
    // Answered within the maximum wait (plus a margin for the round trip and timers).
    const slowest = Math.max(...ok.map((r) => r.ms));
    assert.ok(slowest <= MAX_WAIT_MS + 1000, `slowest admitted request took ${slowest} ms`);
    for (const r of limited) {
      assert.equal(r.limiter, 'browser');
      assert.ok(['timeout', 'queue_full'].includes(r.reason), r.reason);
      assert.match(r.retryAfter, /^\d+$/);
    }
    // Each admitted request reached upstream exactly once, and nothing else did.
    assert.equal(ok.length, hits.length);
    // Every tab got a share of the admissions.
    results.forEach((tab, i) => assert.ok(tab.some((r) => r.status === 200), `tab ${i} got nothing`));

    // Telemetry batches (1 s interval here) add up, in the gateway's /metrics, to what the
    // pages saw and to the worker's own totals.
    await sleep(2500);
    const totals = await env.front.telemetryTotals();
    const worker = (await workerState(tabs[0])).totals;
    assert.equal(totals.admitted, ok.length);
    assert.equal(totals.rejected.timeout + totals.rejected.queue_full, limited.length);
    assert.ok(totals.batches >= 2, `${totals.batches} batches`);
    assert.equal(totals.admitted, worker.admitted);
    assert.equal(totals.queued, worker.queued);
    assert.deepEqual(totals.rejected, worker.rejected);
    assert.equal(totals.cancelled, worker.cancelled);
    assert.equal(totals.redispatched, worker.redispatched);
    assert.equal(totals.wait_ms_count, worker.wait_ms.count);
    assert.ok(Math.abs(totals.wait_ms_sum - worker.wait_ms.sum) <= totals.batches, `wait sum ${totals.wait_ms_sum} vs ${worker.wait_ms.sum}`);
    assert.ok(Math.abs(totals.wait_ms_max - worker.wait_ms.max) <= 1, `wait max ${totals.wait_ms_max} vs ${worker.wait_ms.max}`);

    const perTab = results.map((tab) => tab.filter((r) => r.status === 200).length);
    t.diagnostic(
      `upstream ${hits.length} (first 10 s: ${inWindow}, bound ${CAPACITY + PER_SECOND * 10 + 1}); ` +
        `200: ${ok.length} per tab ${perTab.join('/')}; 429: ${limited.length}; slowest 200: ${Math.round(slowest)} ms; ` +
        `closest to the bound: ${worst.toFixed(2)}; telemetry batches ${totals.batches}`,
    );
  } finally {
    await env.close();
  }
});
