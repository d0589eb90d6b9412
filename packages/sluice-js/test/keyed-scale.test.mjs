// keyed(): a new key while maxKeys is full costs the same at 1,000 and at 100,000 keys (O(1)),
// and the event loop is never held for long. Real time, so the bound has a wide margin: the
// code before took about 100 times longer at 100,000 keys than at 1,000.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { keyed } from '../src/index.js';

/** Median ns of one new key (each a miss that drops another), keyed() full at `maxKeys`. */
function newKeyCost(maxKeys) {
  const k = keyed({ maxKeys, capacity: 10, rate: '1/h' });
  // Full, every bucket spent a little and none full again within the test: no key is idle,
  // so each new key drops a busy one (and remembers it).
  for (let i = 0; i < maxKeys; i++) k.tryAcquire(`warm-${i}`);
  const rounds = [];
  let next = 0;
  for (let r = 0; r < 15; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < 200; i++) k.tryAcquire(`new-${next++}`);
    rounds.push(Number(process.hrtime.bigint() - t0) / 200);
  }
  assert.equal(k.size, maxKeys);
  k.close();
  rounds.sort((a, b) => a - b);
  return rounds[Math.floor(rounds.length / 2)];
}

test('keyed: a new key at maxKeys costs the same at 1,000 and 100,000 keys', { timeout: 120000 }, (t) => {
  const small = newKeyCost(1000);
  const large = newKeyCost(100000);
  t.diagnostic(`a new key: ${small.toFixed(0)} ns at maxKeys 1,000, ${large.toFixed(0)} ns at 100,000`);
  assert.ok(large < small * 5, `O(1): ${large.toFixed(0)} ns at 100,000 against ${small.toFixed(0)} ns at 1,000`);
  assert.ok(large < 1e6, `under a millisecond: ${large.toFixed(0)} ns`);
});
