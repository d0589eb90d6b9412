// Request bodies are sized without being read whole: a 200 MB upload is decided after at most
// the cap plus a chunk has been read (the worker's count; and in a fraction of the time that
// reading it takes, about 1.3 s here when it was read into a Blob), the worker's memory does
// not grow by the body, and bodies still reach the upstream byte for byte, after waiting or at
// once.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import http from 'node:http';
import { test } from 'node:test';

import { openTab, serveOnFreePort, setup, testConfig, workerState } from './harness.mjs';
import { peakWorkerMemory, workerSession } from './worker-cdp.mjs';

const MiB = 1024 * 1024;

/** An upstream that records every body: { path, size, sha256 }. */
async function bodyUpstream() {
  const bodies = [];
  const server = http.createServer((req, res) => {
    const hash = createHash('sha256');
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      hash.update(c);
    });
    req.on('end', () => {
      bodies.push({ path: new URL(req.url, 'http://u').pathname, size, sha256: hash.digest('hex') });
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' });
      res.end(JSON.stringify({ ok: true, size }));
    });
  });
  return serveOnFreePort(server, { bodies });
}

// The gateway behind the worker accepts the test's largest body (its default cap is 1 MiB).
const setupBodies = async (config) => setup(config, { upstream: await bodyUpstream(), maxBody: '256MiB' });

/** The bytes the page sends: byte i is (i * 7 + 3) & 255. */
function pattern(size) {
  const b = Buffer.alloc(size);
  for (let i = 0; i < size; i++) b[i] = (i * 7 + 3) & 255;
  return b;
}
const sha256 = (b) => createHash('sha256').update(b).digest('hex');

/** Makes `window.body` in the page: a Blob of `size` pattern bytes. */
function makeBlob(page, size) {
  return page.evaluate((size) => {
    const u = new Uint8Array(size);
    for (let i = 0; i < size; i++) u[i] = (i * 7 + 3) & 255;
    window.body = new Blob([u]);
  }, size);
}

function post(page, path) {
  return page.evaluate(async (path) => {
    const start = performance.now();
    const r = await fetch(path, { method: 'POST', body: window.body, cache: 'no-store' });
    const body = await r.json();
    return { status: r.status, ms: performance.now() - start, body };
  }, path);
}

test('a 200 MB body is decided after reading at most the cap and a chunk; the worker does not hold it', { timeout: 90000 }, async (t) => {
  const cap = 64 * 1024;
  const env = await setupBodies(testConfig({ capacity: 1, rate: '6/min', max_queued_body_bytes: cap, queue: { depth: 10, max_wait_ms: 60000 } }));
  try {
    const page = await openTab(env.context, env.front);
    await page.evaluate(async () => (await fetch('/api/spend', { cache: 'no-store' })).text());
    await makeBlob(page, 200 * MiB);
    const session = await workerSession(page);
    try {
      const m = await peakWorkerMemory(session, () => post(page, '/api/big'));
      // No token, and too large to wait: refused at once.
      assert.equal(m.result.status, 429, JSON.stringify(m.result));
      assert.equal(m.result.body.reason, 'limit');
      assert.ok(m.result.ms < 1000, `the 429 took ${Math.round(m.result.ms)} ms: was the body read?`);
      assert.ok(m.samples >= 1);
      const grew = m.peak - m.base;
      t.diagnostic(`worker heap + buffers: ${m.base} -> peak ${m.peak} (${m.samples} samples); answered in ${Math.round(m.result.ms)} ms`);
      assert.ok(grew < 8 * MiB, `the worker's heap grew by ${(grew / MiB).toFixed(1)} MiB for a 200 MiB body`);
    } finally {
      await session.detach();
    }
    const state = await workerState(page);
    t.diagnostic(`body bytes read: ${state.body_bytes_read}`);
    assert.ok(state.body_bytes_read > cap, `read ${state.body_bytes_read}`);
    assert.ok(state.body_bytes_read <= cap + 1 * MiB, `read ${state.body_bytes_read} bytes of a 200 MiB body to compare it with ${cap}`);
    assert.deepEqual(env.upstream.bodies.filter((b) => b.path === '/api/big'), []);
  } finally {
    await env.close();
  }
});

test('bodies reach the upstream intact: a small one after waiting, a 50 MB one admitted at once', { timeout: 90000 }, async () => {
  const env = await setupBodies(testConfig({ capacity: 1, rate: '1/s', max_queued_body_bytes: 64 * 1024, queue: { depth: 10, max_wait_ms: 10000 } }));
  try {
    const page = await openTab(env.context, env.front);
    await page.evaluate(async () => (await fetch('/api/spend', { cache: 'no-store' })).text());
    // 10 KiB: under the cap, so it waits for the next token (about 1 s).
    await makeBlob(page, 10 * 1024);
    const small = await post(page, '/api/small');
    assert.equal(small.status, 200);
    assert.ok(small.ms > 500, `the small body did not wait: ${Math.round(small.ms)} ms`);
    const got = env.upstream.bodies.find((b) => b.path === '/api/small');
    assert.deepEqual(got, { path: '/api/small', size: 10 * 1024, sha256: sha256(pattern(10 * 1024)) });
    // After the next refill a large body is admitted at once and sent whole.
    await makeBlob(page, 50 * MiB);
    await new Promise((r) => setTimeout(r, 1100));
    const big = await post(page, '/api/big');
    assert.equal(big.status, 200, JSON.stringify(big));
    const gotBig = env.upstream.bodies.find((b) => b.path === '/api/big');
    assert.deepEqual(gotBig, { path: '/api/big', size: 50 * MiB, sha256: sha256(pattern(50 * MiB)) });
    const state = await workerState(page);
    assert.ok(state.body_bytes_read < 10 * 1024 + 2 * MiB, `read ${state.body_bytes_read}`);
  } finally {
    await env.close();
  }
});
