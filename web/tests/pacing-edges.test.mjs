// `pace_from_server` where the server says little: without limit fields the configured limit
// alone decides (nothing slower, nothing faster); a 429 with Retry-After holds the requests of
// every tab for as long as it says.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { openTab, serveOnFreePort, setup, testConfig, workerState } from './harness.mjs';

/** Records { path, t }; the first request under /api/held/ answers `first` (status, headers), the rest 200. */
async function recording(first = null) {
  const hits = [];
  let held = false;
  const server = http.createServer((req, res) => {
    req.resume();
    const path = new URL(req.url, 'http://u').pathname;
    if (!path.startsWith('/api/')) {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end('<!doctype html><meta charset="utf-8"><title>pacing</title>\n');
    }
    hits.push({ path, t: performance.now() });
    if (first && path.startsWith('/api/held/') && !held) {
      held = true;
      res.writeHead(first.status, { 'content-type': 'application/json', 'cache-control': 'no-store', ...first.headers });
      return res.end('{"error":"rate limited"}');
    }
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' });
    res.end('{"ok":true}');
  });
  return serveOnFreePort(server, { hits });
}

const burst = (page, path, n) =>
  page.evaluate(
    async ({ path, n }) => Promise.all(Array.from({ length: n }, (_, i) => fetch(`${path}${i}`, { cache: 'no-store' }).then((r) => r.status))),
    { path, n },
  );

test('no limit fields: the configured limit stands', { timeout: 60000 }, async () => {
  const upstream = await recording();
  const env = await setup(testConfig({ capacity: 5, rate: '5/s', queue: { depth: 100, max_wait_ms: 20000 }, pace_from_server: true }), { upstream });
  try {
    const page = await openTab(env.context, env.front, '/page/silent');
    const statuses = await burst(page, '/api/silent/', 20);
    assert.deepEqual(statuses, Array(20).fill(200));
    const t = upstream.hits.filter((h) => h.path.startsWith('/api/silent/')).map((h) => h.t);
    const span = Math.max(...t) - Math.min(...t);
    const state = await workerState(page);
    console.log(`20 requests at capacity 5, 5/s, no limit fields: ${t.length} sent over ${span.toFixed(0)} ms; the worker knows ${JSON.stringify(state.pacing)}`);
    // 15 beyond the burst at 5/s: 3 s by the configured limit; the fields would have said nothing.
    assert.equal(t.length, 20);
    assert.ok(span >= 2700, `sent faster than the configured limit: ${span} ms`);
    assert.ok(span <= 6000, `slower than the configured limit: ${span} ms`);
    assert.deepEqual(state.pacing.limits, {});
  } finally {
    await env.close();
  }
});

test('a 429 with Retry-After holds every tab for as long as it says', { timeout: 60000 }, async () => {
  const upstream = await recording({ status: 429, headers: { 'retry-after': '2' } });
  const env = await setup(testConfig({ capacity: 100, rate: '100/s', queue: { depth: 100, max_wait_ms: 20000 }, pace_from_server: true }), { upstream });
  try {
    const a = await openTab(env.context, env.front, '/page/a');
    const b = await openTab(env.context, env.front, '/page/b');
    assert.deepEqual(await burst(a, '/api/held/first', 1), [429]);
    const refusedAt = upstream.hits[upstream.hits.length - 1].t;
    const state = await workerState(a);
    const [sa, sb] = await Promise.all([burst(a, '/api/held/a', 3), burst(b, '/api/held/b', 3)]);
    const later = upstream.hits.filter((h) => /^\/api\/held\/[ab]/.test(h.path)).map((h) => h.t - refusedAt);
    console.log(`after a 429 with Retry-After: 2, blocked_for_ms ${state.pacing.blocked_for_ms.toFixed(0)}; the next 6 requests of two tabs sent ${later.map((x) => x.toFixed(0)).join(', ')} ms after it`);
    assert.deepEqual([...sa, ...sb], Array(6).fill(200));
    assert.ok(state.pacing.blocked_for_ms > 1000, JSON.stringify(state.pacing));
    assert.equal(later.length, 6);
    // Retry-After is whole seconds: none may go before 2 s have passed (less what the 429 took back).
    assert.ok(Math.min(...later) >= 1900, `sent ${Math.min(...later)} ms after the 429`);
  } finally {
    await env.close();
  }
});
