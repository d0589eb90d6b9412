// politeFetch in Chromium, through the worker: X-Sluice-Priority only when the page asks for
// it (and then it moves the request ahead in the worker's queue); POST is not sent again on a
// 503 unless retryNonIdempotent; a sluice 429 (never processed) is retried for POST.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { openTab, serveOnFreePort, setup, sleep, testConfig } from './harness.mjs';

/** Records { method, path, priority }; /api/busy/... answers 503 (Retry-After: 0), the rest 200. */
async function recordingUpstream() {
  const hits = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = new URL(req.url, 'http://u').pathname;
      hits.push({ method: req.method, path, priority: req.headers['x-sluice-priority'] ?? null });
      const busy = path.startsWith('/api/busy/');
      res.writeHead(busy ? 503 : 200, { 'content-type': 'application/json', 'cache-control': 'no-store', ...(busy ? { 'retry-after': '0' } : {}) });
      res.end(JSON.stringify({ ok: !busy }));
    });
  });
  return serveOnFreePort(server, { hits });
}

const setupPolite = async (config) => setup(config, { upstream: await recordingUpstream() });

test('X-Sluice-Priority only when asked for; a high one goes ahead of the waiting normal ones', { timeout: 60000 }, async () => {
  const env = await setupPolite(testConfig({ capacity: 1, rate: '4/s', queue: { depth: 10, max_wait_ms: 10000 } }));
  try {
    const page = await openTab(env.context, env.front);
    await page.evaluate(async () => {
      const { politeFetch } = await import('/sluice/client.js');
      await (await politeFetch('/api/p/first', { cache: 'no-store' })).text(); // spends the token
      const normal = [1, 2, 3].map((i) => politeFetch(`/api/p/n${i}`, { cache: 'no-store' }));
      await new Promise((r) => setTimeout(r, 50));
      const high = politeFetch('/api/p/high', { cache: 'no-store' }, { priority: 'high' });
      await Promise.all([...normal, high]);
    });
    const hits = env.upstream.hits.filter((h) => h.path.startsWith('/api/p/'));
    assert.deepEqual(
      hits.map((h) => [h.path, h.priority]),
      [
        ['/api/p/first', null],
        ['/api/p/high', 'high'],
        ['/api/p/n1', null],
        ['/api/p/n2', null],
        ['/api/p/n3', null],
      ],
    );
  } finally {
    await env.close();
  }
});

test('POST: a 503 is not sent again unless retryNonIdempotent; a sluice 429 is retried', { timeout: 60000 }, async () => {
  // No queue: a request without a token gets 429 `limit` from the worker at once. Two tokens,
  // refilled within 600 ms: enough for each request and its one retry below.
  const env = await setupPolite(testConfig({ capacity: 2, rate: '4/s', queue: { depth: 0, max_wait_ms: 0 } }));
  try {
    const page = await openTab(env.context, env.front);
    const r = await page.evaluate(async () => {
      const { politeFetch } = await import('/sluice/client.js');
      const statuses = {};
      statuses.post503 = (await politeFetch('/api/busy/post', { method: 'POST', body: 'x' }, { baseDelayMs: 10 })).status;
      await new Promise((r) => setTimeout(r, 600)); // the tokens again
      statuses.put503 = (await politeFetch('/api/busy/put', { method: 'PUT', body: 'x' }, { baseDelayMs: 10, maxAttempts: 2 })).status;
      await new Promise((r) => setTimeout(r, 600));
      statuses.opted = (await politeFetch('/api/busy/opted', { method: 'POST', body: 'x' }, { baseDelayMs: 10, maxAttempts: 2, retryNonIdempotent: true })).status;
      await new Promise((r) => setTimeout(r, 600));
      // Three at once with two tokens: the third gets the worker's 429 and is sent again later.
      const retried = [];
      const both = await Promise.all(
        ['/api/ok/a', '/api/ok/b', '/api/ok/c'].map((p) => politeFetch(p, { method: 'POST', body: 'x' }, { baseDelayMs: 10, onRetry: (x) => retried.push(x.response.status) })),
      );
      statuses.post429 = both.map((res) => res.status);
      statuses.retried = retried;
      return statuses;
    });
    assert.equal(r.post503, 503);
    assert.equal(r.put503, 503);
    assert.equal(r.opted, 503);
    assert.deepEqual(r.post429, [200, 200, 200]);
    assert.ok(r.retried.length >= 1 && r.retried.every((s) => s === 429), JSON.stringify(r.retried));
    await sleep(100);
    const count = (p) => env.upstream.hits.filter((h) => h.path === p).length;
    assert.equal(count('/api/busy/post'), 1, 'POST sent again after a 503');
    assert.equal(count('/api/busy/put'), 2, 'PUT is idempotent: retried');
    assert.equal(count('/api/busy/opted'), 2, 'retryNonIdempotent: retried');
    assert.equal(count('/api/ok/a'), 1);
    assert.equal(count('/api/ok/b'), 1);
    assert.equal(count('/api/ok/c'), 1);
  } finally {
    await env.close();
  }
});
