// A tab firing 100 req/s cannot starve one firing 1 req/s: tabs take turns in the
// queue, so the quiet tab waits about one turn, not behind the busy tab's whole queue.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fire, median, openTab, setup, sleep, testConfig } from './harness.mjs';

const TURN_MS = 100; // 10/s

test('a tab at 1 req/s gets its share while another fires 100 req/s', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 5, rate: '10/s', queue: { depth: 1000, max_wait_ms: 10000 } }));
  try {
    const busy = await openTab(env.context, env.front);
    const quiet = await openTab(env.context, env.front);
    const busyRun = fire(busy, { path: '/api/busy/', perSecond: 100, durationMs: 7000 });
    await sleep(1000); // let the busy tab build its queue first
    const quietRun = fire(quiet, { path: '/api/quiet/', perSecond: 1, durationMs: 5000 });
    const [b, q] = await Promise.all([busyRun, quietRun]);

    const quietOk = q.filter((r) => r.status === 200);
    assert.equal(quietOk.length, q.length, `quiet tab: ${JSON.stringify(q.map((r) => r.status))}`);
    const quietWorst = Math.max(...quietOk.map((r) => r.ms));
    // One turn of the busy tab, then its own: about 2 turns, plus a margin for timers.
    assert.ok(quietWorst <= 2 * TURN_MS + 300, `quiet tab waited up to ${quietWorst} ms`);

    const busyOk = b.filter((r) => r.status === 200);
    const busyLate = busyOk.filter((r) => r.start >= 1000);
    const busyMedian = median(busyLate.map((r) => r.ms));
    // Without turns, the quiet tab would have queued behind this.
    assert.ok(busyMedian > 10 * quietWorst, `busy tab median wait ${busyMedian} ms`);
    assert.ok(b.some((r) => r.status === 429), 'the busy tab was refused at the door');
    t.diagnostic(
      `quiet tab: ${quietOk.length}/${q.length} admitted, waits ${quietOk.map((r) => Math.round(r.ms)).join('/')} ms; ` +
        `busy tab: ${busyOk.length} admitted, ${b.length - busyOk.length} refused, median wait ${Math.round(busyMedian)} ms`,
    );
  } finally {
    await env.close();
  }
});
