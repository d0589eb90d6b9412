// A new sluice-sw.js (the gateway's [browser] changed, SIGHUP, registration.update()) takes
// over the stored bucket: a tightened limit grants no burst, a loosened one applies without a
// reset, and requests queued in the old worker are neither lost nor admitted twice.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, openTab, setup, sleep, testConfig, workerState } from './harness.mjs';
import { updateWorker, worstExcess } from './workers.mjs';

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
    // 2 tokens left. At the new 2/s the bucket takes 9 s to fill, so a slow update on a loaded
    // machine is told from a reset by the time it took.
    const reloaded = performance.now();
    await env.front.reload({ ...config, capacity: 20, rate: '2/s' });
    const state = await updateWorker(page, (s) => s.config && s.config.rate === '2/s');
    const took = (performance.now() - reloaded) / 1000;
    t.diagnostic(`new worker after ${took.toFixed(2)} s: restored_from ${state.restored_from}, tokens ${state.tokens}, capacity ${state.capacity}`);
    assert.equal(state.capacity, 20);
    assert.ok(state.tokens <= 2 + 2 * took + 1, `reset to a full bucket: ${state.tokens} after ${took.toFixed(2)} s`);
    // The new rate refills: 2 tokens per second.
    await sleep(2000);
    const later = await workerState(page);
    assert.ok(later.tokens >= Math.min(20, state.tokens + 3), `refilled from ${state.tokens} to ${later.tokens} in 2 s at 2/s`);
  } finally {
    await env.close();
  }
});

test('an update while requests wait: none lost, none admitted twice, the bucket carries over', { timeout: 90000 }, async (t) => {
  const capacity = 5;
  const config = testConfig({ capacity, rate: '2/s', queue: { depth: 50, max_wait_ms: 20000 } });
  const env = await setup(config);
  try {
    const page = await openTab(env.context, env.front);
    const before = await workerState(page);
    // 5 admitted at once, 10 wait in version A's queue (the last one about 5 s).
    const burst = fire(page, { path: '/api/queued/', perSecond: 1000, durationMs: 15 });
    await sleep(300);
    const queuedAtUpdate = (await workerState(page)).queued;
    // Version B: the rate tightened to 1/s.
    await env.front.reload({ ...config, rate: '1/s' });
    const t0 = performance.now();
    const state = await updateWorker(page, (s) => s.config && s.config.rate === '1/s');
    const tookOver = performance.now() - t0;
    const results = await burst;
    const statuses = results.map((r) => r.status);
    const hits = env.upstream.hitsFor('/api/queued/');
    const perPath = {};
    for (const h of hits) perPath[h.path] = (perPath[h.path] || 0) + 1;
    t.diagnostic(`queued at the update: ${queuedAtUpdate}; B took over after ${Math.round(tookOver)} ms (restored_from ${state.restored_from}, tokens ${state.tokens}, worker ${before.worker} -> ${state.worker}); statuses ${JSON.stringify(statuses)}; upstream ${hits.length}`);
    assert.ok(queuedAtUpdate >= 8, `only ${queuedAtUpdate} waiting when B was deployed`);
    assert.notEqual(state.worker, before.worker);
    assert.deepEqual(statuses, Array(15).fill(200), 'every waiting request was answered');
    assert.equal(hits.length, 15, 'each reached upstream');
    assert.ok(Object.values(perPath).every((n) => n === 1), `a request went twice: ${JSON.stringify(perPath)}`);
    // The bucket carried over: B starts from A's spent bucket, converted to 1/s, not a full one.
    assert.ok(state.tokens <= 1, `B started with ${state.tokens} tokens`);
    const t1 = performance.now();
    const after = await fire(page, { path: '/api/after/', perSecond: 1000, durationMs: 5, init: { headers: { 'x-sluice-priority': 'high' } } });
    const fast = after.filter((r) => r.status === 200 && r.ms < 500).length;
    t.diagnostic(`after the update: ${fast} of 5 admitted within 500 ms`);
    assert.ok(fast <= 2, `${fast} admitted at once after the update`);
    const lateHits = env.upstream.hitsFor('/api/after/').filter((h) => h.t >= t1);
    assert.equal(lateHits.length, after.filter((r) => r.status === 200).length);
    // Across both versions, every window stays within capacity + rate x T (at A's 2/s, the
    // looser rate; one token of margin for delivery jitter).
    const times = env.upstream.hits.filter((h) => h.path.startsWith('/api/')).map((h) => h.t);
    const { worst, at } = worstExcess(times, capacity, 500);
    t.diagnostic(`worst window ${JSON.stringify(at)}, excess ${worst.toFixed(2)}`);
    assert.ok(worst <= 1, `a window exceeded the limit: ${JSON.stringify(at)}`);
  } finally {
    await env.close();
  }
});
