// Reserve ahead: a worker stopped at any moment (DevTools ServiceWorker.stopAllWorkers) never
// comes back with tokens it already granted. Every admission the upstream sees, over several
// stops under load, stays within capacity + rate x T in every window of length T.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, openTab, setup, sleep, stopWorkers, testConfig, workerState } from './harness.mjs';
import { worstExcess } from './workers.mjs';

test('a worker stopped right after a burst does not grant it again', { timeout: 60000 }, async (t) => {
  // 1/min: nothing refills during the test. No queue: a refusal is immediate.
  const env = await setup(testConfig({ capacity: 10, rate: '1/min', queue: { depth: 0, max_wait_ms: 0 } }));
  try {
    const page = await openTab(env.context, env.front);
    const before = await workerState(page);
    const first = await fire(page, { path: '/api/first/', perSecond: 1000, durationMs: 10 });
    await stopWorkers(page); // at once: within the 150 ms of the old debounced save
    const second = await fire(page, { path: '/api/second/', perSecond: 1000, durationMs: 10 });
    const after = await workerState(page);
    assert.notEqual(after.worker, before.worker, 'the worker restarted');
    const ok = (rs) => rs.filter((r) => r.status === 200).length;
    const hits = env.upstream.hits.filter((h) => h.path.startsWith('/api/')).length;
    t.diagnostic(`burst ${ok(first)} + after the stop ${ok(second)}; upstream saw ${hits}`);
    assert.ok(hits <= 10, `${hits} admissions from a bucket of 10 at 1/min`);
  } finally {
    await env.close();
  }
});

/** Fires at `perSecond` for `durationMs` while stopping every worker at random moments. */
async function loadWithStops(env, page, path, { perSecond, durationMs }) {
  let stops = 0;
  const load = fire(page, { path, perSecond, durationMs });
  const stopper = (async () => {
    const until = Date.now() + durationMs - 300;
    while (Date.now() < until) {
      await sleep(150 + Math.random() * 600);
      await stopWorkers(page).catch(() => {});
      stops++;
    }
  })();
  const [results] = await Promise.all([load, stopper]);
  await sleep(500);
  return { results, stops, times: env.upstream.hitsFor(path).map((h) => h.t) };
}

// Each run: a configuration, its interval in ms, and the load. With a queue, admissions come
// from the queue (sent by the worker); without one, from the fast path (sent by the browser).
const RUNS = [
  { name: 'queue', config: { capacity: 5, rate: '2/s', queue: { depth: 20, max_wait_ms: 3000 } }, intervalMs: 500, perSecond: 40 },
  { name: 'fast path', config: { capacity: 8, rate: '4/s', queue: { depth: 0, max_wait_ms: 0 } }, intervalMs: 250, perSecond: 60 },
  { name: 'gcra', config: { algorithm: 'gcra', capacity: 3, rate: '1/s', queue: { depth: 5, max_wait_ms: 2000 } }, intervalMs: 1000, perSecond: 30 },
];

for (const run of RUNS) {
  test(`workers stopped at random moments under load never exceed capacity + rate x T (${run.name})`, { timeout: 90000 }, async (t) => {
    const env = await setup(testConfig(run.config));
    try {
      const page = await openTab(env.context, env.front);
      const { results, stops, times } = await loadWithStops(env, page, '/api/load/', { perSecond: run.perSecond, durationMs: 7000 });
      const { worst, at } = worstExcess(times, run.config.capacity, run.intervalMs);
      const statuses = {};
      for (const r of results) statuses[r.status] = (statuses[r.status] || 0) + 1;
      t.diagnostic(`${stops} stops; statuses ${JSON.stringify(statuses)}; upstream saw ${times.length}; worst window ${JSON.stringify(at)} excess ${worst.toFixed(2)}`);
      assert.ok(stops >= 5);
      // Times are taken at the upstream: allow the jitter of delivery (one token's worth).
      assert.ok(worst <= 1, `a window had ${worst.toFixed(2)} admissions over capacity + rate x T: ${JSON.stringify(at)}`);
    } finally {
      await env.close();
    }
  });
}
