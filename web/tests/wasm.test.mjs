// The module and its JavaScript wrapper, in node (no browser): the ABI as sw.js uses it, the
// sw.js prefix contract, and the configuration checks.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import vm from 'node:vm';

import { buildServiceWorker } from '../build-sw.mjs';
import { wasmBytes } from './harness.mjs';

/** Values from the script's realm, as plain data (their prototypes are the other realm's). */
const plain = (x) => JSON.parse(JSON.stringify(x));

const CONFIG = JSON.parse(readFileSync(new URL('../sluice.config.json', import.meta.url), 'utf8'));

/** Evaluates the served script as a non-worker global: only the pieces, no event handlers. */
function load(config = CONFIG) {
  const script = buildServiceWorker({ wasm: wasmBytes(), config });
  const g = { atob, WebAssembly, TextEncoder, TextDecoder, console, Uint8Array, Float64Array };
  g.self = g;
  vm.createContext(g);
  vm.runInContext(script, g);
  return { g, script, ...g.__sluice_internals__ };
}

test('the prefix defines the config and the module bytes, then sw.js follows verbatim', () => {
  const { g, script } = load();
  const lines = script.split('\n');
  assert.equal(lines[0], '// sluice: generated prefix (configuration and module); web/sw.js follows');
  assert.equal(lines[1], `self.__SLUICE_CONFIG__ = ${JSON.stringify(CONFIG)};`);
  assert.match(lines[2], /^self\.__SLUICE_WASM__ = \(function \(s\) \{.*\}\)\("[A-Za-z0-9+/]+=*"\);$/);
  assert.equal(lines.slice(3).join('\n'), readFileSync(new URL('../sw.js', import.meta.url), 'utf8'));
  assert.deepEqual(Buffer.from(g.__SLUICE_WASM__), wasmBytes());
  assert.deepEqual(JSON.parse(JSON.stringify(g.__SLUICE_CONFIG__)), CONFIG);
  // A module that imports nothing: no wasm-bindgen glue.
  assert.deepEqual(WebAssembly.Module.imports(new WebAssembly.Module(wasmBytes())), []);
});

test('configuration: defaults, and every bad field named', () => {
  const { normalizeConfig } = load();
  const { config, errors } = normalizeConfig({ capacity: 5 });
  assert.deepEqual(plain(errors), []);
  assert.equal(config.capacity, 5);
  assert.equal(config.rate, '1/s');
  assert.deepEqual(plain(config.queue), { depth: 100, max_wait_ms: 10000 });
  assert.equal(normalizeConfig({ telemetry: null }).config.telemetry, null);
  assert.equal(config.fail, 'open');
  assert.equal(normalizeConfig({ fail: 'closed' }).config.fail, 'closed');
  assert.deepEqual(plain(normalizeConfig({ fail: 'ajar' }).errors), ['fail must be "open" or "closed"']);
  const bad = normalizeConfig({
    path_prefixes: ['api'],
    capacity: 0,
    rate: {},
    queue: { depth: -1, max_wait_ms: 1.5 },
    max_queued_body_bytes: 'big',
    persist: 'yes',
    telemetry: { endpoint: 'x', interval_ms: 10, sample: 2 },
  });
  assert.equal(bad.config, null);
  assert.equal(bad.errors.length, 10, bad.errors.join('\n'));
  assert.deepEqual(plain(normalizeConfig([]).errors), ['the configuration must be a JSON object']);
});

test('offer, queue, poll and outcomes through the ABI', () => {
  const { SluiceLimiter } = load();
  const module = new WebAssembly.Module(wasmBytes());
  const l = new SluiceLimiter(module, { capacity: 2, rate: '2/s', depth: 2, maxWaitMs: 5000 });
  assert.equal(l.offer(0, 1, 1).result, 'admitted');
  assert.equal(l.offer(0, 1, 1).result, 'admitted');
  const a = l.offer(0, 1, 1);
  assert.deepEqual([a.result, a.waitMs], ['queued', 500]);
  const b = l.offer(0, 1, 2);
  assert.deepEqual([b.result, b.waitMs], ['queued', 1000]);
  const full = l.offer(0, 1, 3);
  assert.deepEqual([full.result, full.waitMs], ['queue_full', 1500]);
  // May not wait (a large body): limited, with the wait it would have had.
  assert.equal(l.offer(0, 1, 3, 1, 0).result, 'queue_full');
  assert.deepEqual(plain(l.poll(0)), { wake: 500, outcomes: [] });
  assert.deepEqual(plain(l.poll(500)), { wake: 1000, outcomes: [{ ticket: a.ticket, result: 'admitted', retryAfterMs: 0 }] });
  assert.equal(l.status(500).queued, 1);
  assert.equal(l.cancel(b.ticket), true);
  assert.equal(l.cancel(b.ticket), false);
  assert.deepEqual(plain(l.poll(600)), { wake: null, outcomes: [] });
  const st = l.status(600);
  assert.deepEqual([st.tokens, st.capacity, st.queued, st.intervalNs], [0, 2, 0, 500000000]);
});

test('a rate as a number, other algorithms, and errors as messages', () => {
  const { SluiceLimiter } = load();
  const module = new WebAssembly.Module(wasmBytes());
  const l = new SluiceLimiter(module, { algorithm: 'gcra', capacity: 1, rate: 0.5, depth: 0, maxWaitMs: 0 });
  assert.equal(l.status(0).intervalNs, 2e9);
  assert.equal(l.offer(0).result, 'admitted');
  assert.deepEqual([l.offer(0).result, l.offer(0).waitMs], ['limit', 2000]);
  assert.throws(() => new SluiceLimiter(module, { capacity: 1, rate: 'fast', depth: 0, maxWaitMs: 0 }), /cannot read `fast` as a rate/);
  assert.throws(() => new SluiceLimiter(module, { capacity: 0, rate: '1/s', depth: 0, maxWaitMs: 0 }), /capacity/);
  assert.throws(() => new SluiceLimiter(module, { algorithm: 'magic', capacity: 1, rate: '1/s', depth: 0, maxWaitMs: 0 }), /unknown algorithm `magic`/);
  assert.throws(() => new SluiceLimiter(module, { capacity: 1, rate: -1, depth: 0, maxWaitMs: 0 }), /rate must be/);
  for (const algorithm of ['token_bucket', 'gcra', 'leaky_bucket', 'sliding_log', 'sliding_window', 'fixed_window']) {
    const x = new SluiceLimiter(module, { algorithm, capacity: 3, rate: '1/s', depth: 5, maxWaitMs: 60000 });
    assert.equal(x.offer(0).result, 'admitted', algorithm);
    const snap = x.snapshot(0, 1_700_000_000_000);
    const y = new SluiceLimiter(module, { algorithm, capacity: 3, rate: '1/s', depth: 5, maxWaitMs: 60000 });
    y.restore(snap, 0, 1_700_000_000_000);
  }
});

test('snapshot and restore: the empty bucket stays empty across a restart; garbage is refused', () => {
  const { SluiceLimiter } = load();
  const module = new WebAssembly.Module(wasmBytes());
  const opts = { capacity: 10, rate: '1/s', depth: 0, maxWaitMs: 0 };
  const a = new SluiceLimiter(module, opts);
  for (let i = 0; i < 10; i++) a.offer(5000);
  const snap = a.snapshot(5000, 1_700_000_000_000);
  assert.deepEqual(plain(snap), [1, 1, 0, 10, 1e9, 1_700_000_000_000, 0, 10e9]);
  const b = new SluiceLimiter(module, opts);
  assert.equal(b.status(0).tokens, 10);
  b.restore(snap, 0, 1_700_000_000_300); // a new worker, 300 ms later
  assert.deepEqual([b.status(0).tokens, b.status(0).nextTokenMs], [0, 700]);
  for (const garbage of [[], [1, 2, 3], snap.map((v, i) => (i === 7 ? -1 : v)), snap.map(String).concat(['x']), [2, ...snap.slice(1)]]) {
    const c = new SluiceLimiter(module, opts);
    assert.throws(() => c.restore(garbage, 0, 0), /./, JSON.stringify(garbage));
    c.exhaust(0);
    assert.equal(c.status(0).tokens, 0);
    assert.equal(c.status(3000).tokens, 3);
  }
});
