// The stored bucket through the ABI, in node (no browser): a snapshot of another configuration
// is converted on restore (no client gains tokens), and reserve ahead (`reserve`, `written`,
// `covered`) as sw.js uses it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import vm from 'node:vm';

import { buildServiceWorker } from '../build-sw.mjs';
import { testConfig, wasmBytes } from './harness.mjs';

function limiterClass() {
  const script = buildServiceWorker({ wasm: wasmBytes(), config: testConfig() });
  const g = { atob, WebAssembly, TextEncoder, TextDecoder, console, Uint8Array, Float64Array };
  g.self = g;
  vm.createContext(g);
  vm.runInContext(script, g);
  return g.__sluice_internals__.SluiceLimiter;
}

const SluiceLimiter = limiterClass();
const module = new WebAssembly.Module(wasmBytes());
const make = (capacity, rate) => new SluiceLimiter(module, { capacity, rate, depth: 0, maxWaitMs: 0 });

test('restore converts a snapshot of another capacity or rate: tokens after = min(before, new capacity)', () => {
  const a = make(10, '1/s');
  for (let i = 0; i < 8; i++) assert.equal(a.offer(0).result, 'admitted');
  const snap = a.snapshot(0, 1_000_000);
  const tightened = make(10, '1/h');
  tightened.restore(snap, 0, 1_000_000);
  assert.equal(tightened.status(0).tokens, 2, 'not the 9 of a debt capped at the new window');
  tightened.restore(snap, 0, 1_000_000 + 3_600_000);
  assert.equal(tightened.status(0).tokens, 3, 'the time since refills at the new rate');
  const smaller = make(1, '1/s');
  smaller.restore(snap, 0, 1_000_000);
  assert.equal(smaller.status(0).tokens, 1);
  const loosened = make(20, '5/s');
  loosened.restore(snap, 0, 1_000_000);
  assert.equal(loosened.status(0).tokens, 2, 'no reset to a full bucket');
  assert.equal(loosened.status(1000).tokens, 7);
});

test('reserve ahead: the stored bucket counts the next block before it is granted', () => {
  const l = make(10, '1/min');
  assert.equal(l.covered(0), false, 'no record yet');
  const record = l.reserve(0, 1_000_000, 3);
  assert.equal(l.covered(0), false, 'not written yet');
  l.written(true);
  assert.equal(l.covered(0, 3), true);
  assert.equal(l.covered(0, 4), false);
  // A worker restarted from that record has the block already spent.
  const restarted = make(10, '1/min');
  restarted.restore(record, 0, 1_000_000);
  assert.equal(restarted.status(0).tokens, 7);
  for (let i = 0; i < 3; i++) {
    assert.equal(l.offer(0).result, 'admitted');
    assert.equal(l.covered(0), true, `admission ${i + 1} of the block`);
  }
  assert.equal(l.offer(0).result, 'admitted');
  assert.equal(l.covered(0), false, 'the fourth needs a write');
  l.reserve(0, 1_000_000, 3);
  l.written(false);
  assert.equal(l.covered(0), false, 'a failed write covers nothing');
  l.reserve(0, 1_000_000, 3);
  l.written(true);
  assert.equal(l.covered(0), true);
});
