// The bucket survives a worker restart (CDP ServiceWorker.stopAllWorkers); a
// missing or corrupt store gives an empty bucket that refills; a request the browser
// dispatches again to the restarted worker is not sent upstream twice.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, openTab, setup, sleep, stopWorkers, testConfig, workerState } from './harness.mjs';

/** Empties the bucket, restarts the worker, then fires 10 at once: how many got through. */
async function burstAfterRestart(persist) {
  // No queue: whatever is not admitted at once is a 429, so the count is immediate.
  const env = await setup(testConfig({ capacity: 10, rate: '1/s', persist, queue: { depth: 0, max_wait_ms: 0 } }));
  try {
    const page = await openTab(env.context, env.front);
    const before = await workerState(page);
    const spent = await fire(page, { path: '/api/spend/', perSecond: 1000, durationMs: 10 });
    assert.deepEqual(spent.map((r) => r.status), Array(10).fill(200));
    assert.equal((await workerState(page)).tokens, 0);
    await sleep(400); // past the 150 ms save debounce
    await stopWorkers(page);
    const t0 = performance.now();
    const after = await fire(page, { path: '/api/after/', perSecond: 1000, durationMs: 10 });
    const state = await workerState(page);
    assert.notEqual(state.worker, before.worker, 'the worker restarted');
    const hits = env.upstream.hitsFor('/api/after/').filter((h) => h.t - t0 < 1000).length;
    return { hits, admitted: after.filter((r) => r.status === 200).length, restoredFrom: state.restored_from };
  } finally {
    await env.close();
  }
}

test('a stopped worker restores the empty bucket: no burst; without persistence, a burst', { timeout: 60000 }, async (t) => {
  const kept = await burstAfterRestart(true);
  const lost = await burstAfterRestart(false);
  t.diagnostic(`upstream hits in the first second after the restart: persist ${kept.hits}, no persist ${lost.hits}`);
  assert.equal(kept.restoredFrom, 'record');
  assert.equal(lost.restoredFrom, 'disabled');
  // About 0.5 s passed since the bucket was emptied: at most one token came back (+1 margin).
  assert.ok(kept.hits <= 2, `persisted: ${kept.hits} hits`);
  assert.equal(kept.admitted, kept.hits);
  // The same test without persistence shows the burst it exists to prevent.
  assert.ok(lost.hits >= 9, `not persisted: only ${lost.hits} hits`);
});

/** Writes `value` (or deletes, for undefined) the worker's record, from the page. */
function setRecord(page, value) {
  return page.evaluate(
    (value) =>
      new Promise((resolve, reject) => {
        const open = indexedDB.open('sluice');
        open.onerror = () => reject(open.error);
        open.onsuccess = () => {
          const db = open.result;
          const tx = db.transaction('state', 'readwrite');
          const store = tx.objectStore('state');
          if (value === undefined) store.delete('bucket');
          else store.put(value, 'bucket');
          tx.oncomplete = () => {
            db.close();
            resolve();
          };
          tx.onerror = () => reject(tx.error);
        };
      }),
    value,
  );
}

test('a corrupt or missing record gives an empty bucket that refills, never a full one', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 10, rate: '1/s', queue: { depth: 0, max_wait_ms: 0 } }));
  try {
    const page = await openTab(env.context, env.front);
    const first = await workerState(page);
    assert.equal(first.restored_from, 'install', 'a fresh install starts from its install record');
    assert.equal(first.tokens, 10);
    const cases = [
      ['corrupt', { v: 1, kind: 'save', snapshot: [1, 1, 0, 10, 1e9, 'x', 0, -5] }],
      ['corrupt', 'not a record'],
      ['corrupt', { v: 1, kind: 'save', snapshot: [1, 1, 3, 10, 1e9, Date.now(), 0, 0] }], // another algorithm
      ['missing', undefined],
    ];
    for (const [expected, value] of cases) {
      await sleep(300);
      await stopWorkers(page);
      await setRecord(page, value);
      const t0 = performance.now();
      const burst = await fire(page, { path: `/api/${expected}/`, perSecond: 1000, durationMs: 10 });
      const state = await workerState(page);
      assert.equal(state.restored_from, expected, JSON.stringify(value));
      const admitted = burst.filter((r) => r.status === 200).length;
      assert.ok(admitted <= 1, `${expected}: ${admitted} admitted right after the restart`);
      assert.ok(state.tokens <= 1);
      t.diagnostic(`${expected} ${JSON.stringify(value)}: admitted ${admitted} of 10 at ${Math.round(performance.now() - t0)} ms`);
    }
    // It refills at the rate: about 2 tokens 2 s later.
    await sleep(2000);
    const later = await workerState(page);
    assert.ok(later.tokens >= 1 && later.tokens <= 3, `tokens ${later.tokens}`);
  } finally {
    await env.close();
  }
});

test('a request in flight when the worker stops is not sent upstream twice', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 10, rate: '1/s' }));
  try {
    const page = await openTab(env.context, env.front);
    const call = (path, init) =>
      page.evaluate(
        async ([path, init]) => {
          try {
            const r = await fetch(path, init);
            return { status: r.status, body: await r.text() };
          } catch (e) {
            return { status: 0, error: String(e) };
          }
        },
        [path, init],
      );
    const cases = [
      // Admitted at once, a GET is not answered by the worker: the browser sends it itself, so
      // a stopped worker cannot make it go twice, and the page gets its answer.
      { name: 'get-at-once', init: {}, sentBy: 'browser' },
      // After waiting in the queue the worker sends it: the browser dispatches it again to the
      // restarted worker, which recognises the copy from its journal.
      { name: 'get-after-wait', init: {}, sentBy: 'worker', drain: true },
      // A request with a body is always sent by the worker (its size decides whether it may wait).
      { name: 'post', init: { method: 'POST', body: JSON.stringify({ order: 42 }), headers: { 'content-type': 'application/json' } }, sentBy: 'worker' },
    ];
    // The fast path needs the worker restored and its reserved block on disk: one admitted GET
    // starts the block's write, which a moment then finishes.
    await workerState(page);
    await call('/api/warm/', {});
    await sleep(300);
    for (const { name, init, sentBy, drain } of cases) {
      if (drain) await fire(page, { path: `/api/drain-${name}/`, perSecond: 1000, durationMs: 20 });
      const path = `/api/slow/${name}?ms=1500`;
      const pending = call(path, init);
      // Wait until upstream has it, then stop the worker.
      const deadline = Date.now() + 5000;
      while (env.upstream.hitsFor(`/api/slow/${name}`).length === 0 && Date.now() < deadline) await sleep(20);
      await sleep(100);
      await stopWorkers(page);
      const result = await pending;
      await sleep(2500); // long enough for a second copy to have arrived
      const hits = env.upstream.hitsFor(`/api/slow/${name}`).length;
      const state = await workerState(page);
      const copies = state.totals.redispatched; // counted by the restarted worker
      t.diagnostic(`${name}: page saw ${JSON.stringify(result).slice(0, 80)}; upstream hits ${hits}; copies dispatched again and refused: ${copies}`);
      assert.equal(hits, 1, `${name} reached upstream ${hits} times`);
      if (sentBy === 'browser' && copies === 0) {
        assert.equal(result.status, 200);
      } else {
        // Sent by the worker: a GET admitted at once is too, when the block that covers it is
        // not on disk yet (a write slowed by a loaded machine). Once only, all the same.
        // Its answer is lost with the worker: a network error, not a second upstream request.
        assert.equal(result.status, 0);
        assert.equal(copies, 1, 'the browser dispatched the copy again (the journal caught it)');
      }
    }

    // A request still waiting in the queue was never sent: the new worker decides it again.
    await fire(page, { path: '/api/drain/', perSecond: 1000, durationMs: 20 });
    const waiting = call('/api/queued/1', {});
    await sleep(300);
    assert.equal((await workerState(page)).queued, 1);
    await stopWorkers(page);
    const result = await waiting;
    await sleep(1500);
    assert.equal(result.status, 200);
    assert.equal(env.upstream.hitsFor('/api/queued/').length, 1);
  } finally {
    await env.close();
  }
});
