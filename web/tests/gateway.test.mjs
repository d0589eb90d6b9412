// The gateway serves the browser contract (web/README.md, "The sw.js contract" and "What the
// gateway must implement"), checked from node against the real `sluice serve`: the served
// script is the reference generator's output for the same configuration and module, the
// files of web/ are served as they are, telemetry lands in /metrics, everything else is
// proxied once.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { prefix } from '../build-sw.mjs';
import { startFront, startUpstream, testConfig, WEB } from './harness.mjs';

const BATCH = {
  v: 1,
  worker: 'node0001',
  seq: 1,
  sample: 1,
  window_ms: 1000,
  admitted: 7,
  queued: 3,
  rejected: { queue_full: 1, timeout: 2, limit: 0 },
  cancelled: 1,
  redispatched: 0,
  wait_ms: { sum: 900, count: 3, max: 600 },
};

async function withGateway(config, body) {
  const upstream = await startUpstream();
  const front = await startFront({ upstream, config });
  try {
    await body({ upstream, front });
  } finally {
    await front.close();
    await upstream.close();
  }
}

test('/sluice/sw.js is the reference prefix (this config, the embedded module) and web/sw.js', { timeout: 60000 }, async () => {
  const config = testConfig({ capacity: 7, rate: '10 per 90s', persist: false, queue: { depth: 3, max_wait_ms: 1500 } });
  await withGateway(config, async ({ front }) => {
    const r = await fetch(`${front.url}/sluice/sw.js`);
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), 'text/javascript; charset=utf-8');
    assert.equal(r.headers.get('service-worker-allowed'), '/');
    assert.equal(r.headers.get('cache-control'), 'no-cache');
    const text = await r.text();
    const lines = text.split('\n');
    const served = JSON.parse(lines[1].replace(/^self\.__SLUICE_CONFIG__ = /, '').replace(/;$/, ''));
    assert.deepEqual(served, config, 'the configuration mirrors [browser]');
    const base64 = lines[2].match(/\("([A-Za-z0-9+/]+=*)"\);$/)[1];
    const wasm = Buffer.from(base64, 'base64');
    assert.equal(wasm.toString('base64'), base64, 'standard base64 with padding');
    // Byte for byte what web/build-sw.mjs writes for the same module and configuration.
    const reference = prefix(wasm, served).split('\n');
    assert.equal(lines[0], reference[0]);
    assert.equal(lines[2], reference[2]);
    assert.equal(lines.slice(3).join('\n'), readFileSync(join(WEB, 'sw.js'), 'utf8'));
    // The module is sluice-wasm: valid, importing nothing, ABI version 2.
    assert.ok(WebAssembly.validate(wasm));
    const module = new WebAssembly.Module(wasm);
    assert.deepEqual(WebAssembly.Module.imports(module), []);
    assert.equal(new WebAssembly.Instance(module, {}).exports.sluice_abi_version(), 2);
    // Revalidation is cheap: the same ETag gives 304.
    const again = await fetch(`${front.url}/sluice/sw.js`, { headers: { 'if-none-match': r.headers.get('etag') } });
    assert.equal(again.status, 304);

    const json = await fetch(`${front.url}/sluice/config.json`);
    assert.equal(json.headers.get('content-type'), 'application/json');
    assert.deepEqual(await json.json(), config);
  });
});

test('the files of web/ are served unchanged; other paths are proxied once', { timeout: 60000 }, async () => {
  await withGateway(testConfig(), async ({ upstream, front }) => {
    for (const [path, file, type] of [
      ['/sluice/client.js', 'client.js', 'text/javascript; charset=utf-8'],
      ['/sluice/demo.html', 'demo.html', 'text/html; charset=utf-8'],
      ['/sluice/demo.js', 'demo.js', 'text/javascript; charset=utf-8'],
    ]) {
      const r = await fetch(front.url + path);
      assert.equal(r.status, 200, path);
      assert.equal(r.headers.get('content-type'), type, path);
      assert.equal(r.headers.get('cache-control'), 'no-cache', path);
      assert.equal(await r.text(), readFileSync(join(WEB, file), 'utf8'), path);
    }
    const api = await fetch(`${front.url}/api/once`);
    assert.equal(api.status, 200);
    assert.equal(api.headers.get('ratelimit'), null, 'the gateway does not limit /api/ here');
    // /sluice/state belongs to the worker: without one, the gateway routes it like any path.
    assert.equal((await fetch(`${front.url}/sluice/state`)).status, 404);
    assert.deepEqual(upstream.hits.map((h) => h.path), ['/api/once', '/sluice/state']);
  });
});

test('POST /v1/telemetry: 204 and /metrics; 400, 405, 413; 429 when flooded', { timeout: 60000 }, async () => {
  await withGateway(testConfig(), async ({ upstream, front }) => {
    const post = (body, headers = { 'content-type': 'application/json' }) =>
      fetch(`${front.url}/v1/telemetry`, { method: 'POST', body, headers });
    assert.equal((await post(JSON.stringify(BATCH))).status, 204);
    assert.equal((await post(JSON.stringify({ ...BATCH, seq: 2 }))).status, 204);
    assert.equal((await post('{"v":1,')).status, 400);
    assert.equal((await post(JSON.stringify({ ...BATCH, v: 2 }))).status, 400);
    assert.equal((await post(JSON.stringify({ ...BATCH, admitted: -1 }))).status, 400);
    assert.equal((await post(JSON.stringify({ ...BATCH, pad: 'x'.repeat(1100) }))).status, 413);
    assert.equal((await fetch(`${front.url}/v1/telemetry`)).status, 405);
    const totals = await front.telemetryTotals();
    assert.deepEqual(totals, {
      batches: 2,
      admitted: 14,
      queued: 6,
      cancelled: 2,
      redispatched: 0,
      rejected: { queue_full: 2, timeout: 4, limit: 0 },
      wait_ms_count: 6,
      wait_ms_sum: 1800,
      wait_ms_max: 600,
    });
    // The endpoint is itself limited (50 at once, then 10/s per address by default).
    const flood = await Promise.all(
      Array.from({ length: 80 }, () =>
        post(JSON.stringify(BATCH)).then(async (r) => ({ status: r.status, retryAfter: r.headers.get('retry-after'), body: await r.text() })),
      ),
    );
    const limited = flood.filter((r) => r.status === 429);
    assert.ok(limited.length >= 10, `${limited.length} of 80 refused`);
    assert.deepEqual([...new Set(flood.map((r) => r.status))].sort(), [204, 429]);
    for (const r of limited) {
      assert.match(r.retryAfter, /^[1-9]\d*$/);
      assert.equal(JSON.parse(r.body).reason, 'limit');
    }
    const after = await front.telemetryTotals();
    assert.equal(after.batches, 2 + flood.length - limited.length, 'refused batches are not counted');
    assert.equal(upstream.hits.length, 0, 'telemetry never reaches the upstream');
  });
});
