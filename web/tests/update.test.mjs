// A new sluice-sw.js (the gateway's [browser] changed, SIGHUP, registration.update()) takes
// over the stored bucket: a tightened limit grants no burst, a loosened one applies without a
// reset, and requests queued in the old worker are neither lost nor admitted twice.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, openTab, setup, sleep, testConfig, workerState } from './harness.mjs';
import { updateWorker } from './workers.mjs';

test('a tightened config converts the stored bucket: no burst after the update', { timeout: 60000 }, async (t) => {
  const config = testConfig({ capacity: 10, rate: '1/s', queue: { depth: 0, max_wait_ms: 0 } });
  const env = await setup(config);
  try {
    const page = await openTab(env.context, env.front);
    const spent = await fire(page, { path: '/api/spend/', perSecond: 1000, durationMs: 8 });
    assert.deepEqual(spent.map((r) => r.status), Array(8).fill(200));
    await sleep(400); // every write of the old worker is done
    await env.front.reload({ ...config, rate: '1/h' });
    const state = await updateWorker(page, (s) => s.config && s.config.rate === '1/h');
    t.diagnostic(`new worker: restored_from ${state.restored_from}, tokens ${state.tokens}`);
    const t0 = performance.now();
    const after = await fire(page, { path: '/api/after/', perSecond: 1000, durationMs: 10 });
    const admitted = after.filter((r) => r.status === 200).length;
    const hits = env.upstream.hitsFor('/api/after/').filter((h) => h.t >= t0).length;
    t.diagnostic(`after tightening 1/s -> 1/h with about 2 tokens left: ${admitted} of 10 admitted, upstream saw ${hits}`);
    // About 2 tokens were left (plus what 1/s refilled before the old worker's last write, and
    // less than one token of 1/h since): never the 10 of a fresh or re-scaled bucket.
    assert.ok(admitted <= 3, `${admitted} admitted after the limit was tightened`);
    assert.equal(hits, admitted);
    assert.ok(state.tokens <= 3, `tokens ${state.tokens}`);
  } finally {
    await env.close();
  }
});

test('a loosened config applies at once, without a reset to a full bucket', { timeout: 60000 }, async (t) => {
  const config = testConfig({ capacity: 10, rate: '1/h', queue: { depth: 0, max_wait_ms: 0 } });
  const env = await setup(config);
  try {
    const page = await openTab(env.context, env.front);
    const spent = await fire(page, { path: '/api/spend/', perSecond: 1000, durationMs: 8 });
    assert.deepEqual(spent.map((r) => r.status), Array(8).fill(200));
    await sleep(400);
    await env.front.reload({ ...config, capacity: 20, rate: '5/s' });
    const state = await updateWorker(page, (s) => s.config && s.config.rate === '5/s');
    t.diagnostic(`new worker: restored_from ${state.restored_from}, tokens ${state.tokens}, capacity ${state.capacity}`);
    assert.equal(state.capacity, 20);
    assert.ok(state.tokens < 20, `reset to a full bucket: ${state.tokens}`);
    // The new rate refills: 5 tokens per second.
    await sleep(2000);
    const later = await workerState(page);
    assert.ok(later.tokens >= state.tokens + 8, `refilled from ${state.tokens} to ${later.tokens} in 2 s at 5/s`);
  } finally {
    await env.close();
  }
});
