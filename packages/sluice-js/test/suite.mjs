// The behaviour suite of sluice-limits, run by Node (behaviour.test.mjs) and in Chromium
// (browser.test.mjs) alike. Time is a fake clock: admissions are exact.

import {
  RateLimiter, PromisePool, limit, keyed, Keyed, retry, rateLimitHints, CircuitBreaker, ALGORITHMS,
  keyHash, ready,
  QueueFullError, TimeoutError, AbortError, InsufficientCapacityError, CircuitOpenError, ClosedError,
} from '../src/index.js';
import { sleep } from '../src/time.js';
import { fakeTime } from './fake-time.mjs';
import { equal, deepEqual, ok, rejects, throws } from './check.mjs';
import { chargeTests } from './charge.mjs';

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

function limiter(time, options) {
  return new RateLimiter({ now: time.now, timers: time.timers, ...options });
}

/** Tries once every `stepMs` for `totalMs` (the first try at 0): how many were admitted. */
function tryEvery(l, time, stepMs, totalMs) {
  let admitted = 0;
  const ns = BigInt(stepMs) * 1000000n;
  const start = time.now();
  for (let t = 0n; t <= BigInt(totalMs) * 1000000n; t += ns) {
    time.set(start + t);
    if (l.tryAcquire()) admitted++;
  }
  return admitted;
}

function settableTime() {
  let now = 0n;
  return { now: () => now, set: (t) => { now = t; }, timers: fakeTime().timers };
}

test('exact admissions: token_bucket and gcra admit capacity + rate·T, to the token', () => {
  for (const algorithm of ['token_bucket', 'gcra', 'leaky_bucket']) {
    const time = settableTime();
    const l = limiter(time, { algorithm, capacity: 20, rate: '100/s', queue: false });
    // 10 s tried every 1 ms: the burst of 20 plus one token every 10 ms (1,000 of them).
    equal(tryEvery(l, time, 1, 10000), 20 + 1000, `${algorithm}:`);
  }
});

test('exact admissions: the burst, the denial and the next token at its nanosecond', () => {
  const time = settableTime();
  const l = limiter(time, { capacity: 10, rate: '5/s', queue: false });
  for (let i = 0; i < 10; i++) ok(l.tryAcquire(), `burst ${i}`);
  equal(l.tryAcquire(), false);
  time.set(199999999n);
  equal(l.tryAcquire(), false, 'one ns early:');
  time.set(200000000n);
  equal(l.tryAcquire(), true, 'at 200 ms:');
  equal(l.available, 0);
  time.set(2200000000n);
  equal(l.available, 10);
  equal(l.tryAcquire(10), true, 'cost 10:');
});

test('window algorithms stay within capacity + rate·T', () => {
  for (const algorithm of ['sliding_window', 'fixed_window', 'sliding_log']) {
    const time = settableTime();
    const l = limiter(time, { algorithm, capacity: 20, rate: '100/s', queue: false });
    const n = tryEvery(l, time, 1, 10000);
    ok(n <= 20 + 1000 && n >= 900, `${algorithm}: ${n}`);
  }
});

test('bad options are clear errors', () => {
  throws(() => new RateLimiter({ capacity: 1, rate: 'fast' }), (e) => ok(e instanceof RangeError && /rate/.test(e.message), e.message));
  throws(() => new RateLimiter({ capacity: 0, rate: '1/s' }), (e) => ok(/capacity/.test(e.message), e.message));
  throws(() => new RateLimiter({ capacity: 1, rate: '1/s', algorithm: 'nope' }), (e) => ok(/algorithm/.test(e.message), e.message));
  throws(() => new RateLimiter({ capacity: 1, rate: '1/s', queue: { maxWait: 'soon' } }), (e) => ok(/maxWait/.test(e.message), e.message));
  throws(() => new PromisePool({ concurrency: 0 }), (e) => ok(/concurrency/.test(e.message), e.message));
  const l = new RateLimiter({ capacity: 2, rate: '1/s' });
  throws(() => l.tryAcquire(3), (e) => ok(e instanceof InsufficientCapacityError, e.message));
  throws(() => l.tryAcquire(1.5), (e) => ok(/cost/.test(e.message), e.message));
  l.close();
});

test('the queue is FIFO, each task at its turn, with one timer', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s', queue: { depth: 10, maxWait: '2s' } });
  const ran = [];
  const all = [0, 1, 2, 3, 4].map((i) => l.schedule(() => { ran.push([i, time.ms]); return i; }));
  await time.advance(0);
  deepEqual(ran, [[0, 0]]);
  equal(l.pending, 4);
  equal(time.armed, 1, 'timers armed:');
  await time.advance(1000);
  deepEqual(ran, [[0, 0], [1, 100], [2, 200], [3, 300], [4, 400]]);
  deepEqual(await Promise.all(all), [0, 1, 2, 3, 4]);
  equal(time.armed, 0);
});

test('a wait longer than a timer can take is armed in steps, not fired at once', async () => {
  const time = fakeTime();
  const delays = [];
  const timers = { setTimeout: (fn, ms) => { delays.push(ms); return time.timers.setTimeout(fn, ms); }, clearTimeout: time.timers.clearTimeout };
  const l = new RateLimiter({ capacity: 1, rate: '1 per 40d', now: time.now, timers });
  l.tryAcquire();
  let ran = false;
  const p = l.schedule(() => { ran = true; });
  await time.advance(1);
  equal(delays[0], 2147483647, 'the first timer:');
  await time.advance(2147483647);
  equal(ran, false, 'not before its turn:');
  await time.advance(40 * 86400000);
  await p;
  equal(ran, true);
  ok(delays.length <= 4, `timers armed: ${delays.length}`);
});

test('tryAcquire does not jump the queue', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s' });
  l.tryAcquire();
  const p = l.schedule(() => 'queued');
  await time.advance(150);
  equal(await p, 'queued');
  const q = l.schedule(() => 'second');
  equal(l.tryAcquire(), false, 'a waiter is ahead:');
  await time.advance(100);
  equal(await q, 'second');
});

test('queue depth: the next one is QueueFullError with retryAfterMs', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s', queue: { depth: 2, maxWait: '10s' } });
  const a = [l.schedule(() => 1), l.schedule(() => 2), l.schedule(() => 3)];
  const e = await rejects(l.schedule(() => 4), (e) => ok(e instanceof QueueFullError, String(e)));
  equal(e.retryAfterMs, 300);
  await time.advance(300);
  deepEqual(await Promise.all(a), [1, 2, 3]);
});

test('maxWait: refused at once when the predicted wait is longer', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s', queue: { depth: 100, maxWait: '250ms' } });
  const ok3 = [l.schedule(() => 1), l.schedule(() => 2), l.schedule(() => 3)];
  const e = await rejects(l.schedule(() => 4), (e) => ok(e instanceof TimeoutError, String(e)));
  equal(e.retryAfterMs, 300);
  equal(e.reason, 'timeout');
  // A task's own maxWait: 0 means never wait.
  const z = await rejects(l.schedule(() => 5, { maxWait: 0 }), (e) => ok(e instanceof TimeoutError));
  equal(z.reason, 'limited');
  await time.advance(300);
  deepEqual(await Promise.all(ok3), [1, 2, 3]);
});

test('abort cancels a queued task at once and spends nothing', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '1/s', queue: { depth: 10, maxWait: '10s' } });
  ok(l.tryAcquire());
  const ac = new AbortController();
  let ranA = false;
  const a = l.schedule(() => { ranA = true; }, { signal: ac.signal });
  const b = l.schedule(() => time.ms);
  await time.advance(100);
  ac.abort();
  const e = await rejects(a, (e) => ok(e instanceof AbortError, String(e)));
  equal(e.name, 'AbortError');
  equal(ranA, false);
  equal(l.pending, 1);
  // b takes the token a would have had: at 1 s, not 2 s.
  await time.advance(900);
  equal(await b, 1000);
  // An already aborted signal is refused before it takes anything.
  const gone = AbortSignal.abort();
  await rejects(l.schedule(() => 1, { signal: gone }), (e) => equal(e.name, 'AbortError'));
  await time.advance(1000);
  equal(l.available, 1, 'nothing spent:');
});

test('priority is opt-in: high goes before normal, FIFO within each', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s' });
  l.tryAcquire();
  const order = [];
  const ps = [
    l.schedule(() => order.push('n1')),
    l.schedule(() => order.push('n2')),
    l.schedule(() => order.push('h1'), { priority: 'high' }),
    l.schedule(() => order.push('l1'), { priority: 'low' }),
  ];
  await time.advance(1000);
  await Promise.all(ps);
  deepEqual(order, ['h1', 'n1', 'n2', 'l1']);
});

test('a task that throws rejects its promise; close rejects the waiters', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '1/s' });
  await rejects(l.schedule(() => { throw new Error('boom'); }), (e) => equal(e.message, 'boom'));
  const w = l.schedule(() => 1);
  l.close();
  await rejects(w, (e) => ok(e instanceof ClosedError, String(e)));
  await rejects(l.schedule(() => 1), (e) => ok(e instanceof ClosedError, String(e)));
});

function deferred() {
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  return { promise, resolve };
}

test('PromisePool: at most `concurrency` at once, FIFO, results in order', async () => {
  const pool = new PromisePool({ concurrency: 2 });
  let active = 0, peak = 0;
  const gates = Array.from({ length: 6 }, deferred);
  const started = [];
  const all = gates.map((g, i) => pool.run(async () => {
    started.push(i);
    active++;
    peak = Math.max(peak, active);
    await g.promise;
    active--;
    return i * 10;
  }));
  await Promise.resolve();
  deepEqual(started, [0, 1]);
  equal(pool.pending, 4);
  gates[1].resolve();
  await new Promise((r) => setTimeout(r, 0));
  deepEqual(started, [0, 1, 2]);
  for (const g of gates) g.resolve();
  deepEqual(await Promise.all(all), [0, 10, 20, 30, 40, 50]);
  equal(peak, 2);
  equal(pool.active, 0);
  const mapped = await new PromisePool({ concurrency: 3 }).map([1, 2, 3, 4], async (x, i) => x * 2 + i);
  deepEqual(mapped, [2, 5, 8, 11]);
  const ac = new AbortController();
  const hold = deferred();
  const p1 = new PromisePool({ concurrency: 1 });
  const first = p1.run(() => hold.promise);
  const second = p1.run(() => 'never', { signal: ac.signal });
  ac.abort();
  await rejects(second, (e) => equal(e.name, 'AbortError'));
  hold.resolve('x');
  equal(await first, 'x');
});

test('limit(): concurrency and rate together', async () => {
  const time = fakeTime();
  const l = limit({ concurrency: 2, capacity: 2, rate: '10/s', now: time.now, timers: time.timers });
  let active = 0, peak = 0;
  const starts = [];
  const jobs = Array.from({ length: 6 }, (_, i) => l.schedule(async () => {
    starts.push(time.ms);
    active++;
    peak = Math.max(peak, active);
    await new Promise((r) => setTimeout(r, 0));
    active--;
    return i;
  }));
  await time.advance(1000);
  deepEqual(await Promise.all(jobs), [0, 1, 2, 3, 4, 5]);
  equal(peak <= 2, true, `peak ${peak}`);
  // The burst of 2, then one every 100 ms.
  deepEqual(starts, [0, 0, 100, 200, 300, 400]);
});

test('keyed: separate buckets; maxKeys drops the least recently used key and never a key with waiters', async () => {
  const time = fakeTime();
  const k = keyed({ maxKeys: 2, capacity: 1, rate: '1/s', now: time.now, timers: time.timers });
  ok(k.tryAcquire('a'));
  ok(k.tryAcquire('b'));
  equal(k.tryAcquire('a'), false);
  const waiting = k.schedule('a', () => 'a ran');
  // 'c' needs room: 'b' has no waiter and goes; 'a' has one and stays.
  ok(k.tryAcquire('c'));
  ok(k.has('a') && k.has('c') && !k.has('b'));
  await time.advance(1000);
  equal(await waiting, 'a ran');
  // 5 s later both buckets are full again: the least recently used ('c', used at 0 s; 'a' ran
  // at 1 s) makes room for 'd'.
  await time.advance(5000);
  ok(k.tryAcquire('d'));
  ok(k.has('a') && k.has('d') && !k.has('c'), 'c was the least recently used key');
  // Every key waiting: a new key is refused.
  k.tryAcquire('a');
  const w1 = k.schedule('a', () => 1);
  const w2 = k.schedule('d', () => 2);
  await rejects(k.schedule('e', () => 3), (e) => ok(e instanceof QueueFullError, String(e)));
  await time.advance(2000);
  deepEqual(await Promise.all([w1, w2]), [1, 2]);
  k.close();
});

test('keyed: a key forgotten before its bucket is full again comes back no fuller than it left', async () => {
  const time = fakeTime();
  const k = keyed({ maxKeys: 1, capacity: 5, rate: '1/s', now: time.now, timers: time.timers });
  for (let i = 0; i < 5; i++) ok(k.tryAcquire('a'), `a ${i}`);
  equal(k.tryAcquire('a'), false, 'a is spent:');
  ok(k.tryAcquire('b'), 'b takes the only slot');
  ok(!k.has('a'));
  await time.advance(2000);
  // a refilled 2 tokens while forgotten, not 5.
  ok(k.tryAcquire('a'), 'a: 1 of 2');
  ok(k.tryAcquire('a'), 'a: 2 of 2');
  equal(k.tryAcquire('a'), false, 'a, forgotten and back:');
  // b was forgotten with 4 left (full again 1 s after it was used): back at once with 5.
  await time.advance(1000);
  for (let i = 0; i < 5; i++) ok(k.tryAcquire('b'), `b ${i}`);
  equal(k.tryAcquire('b'), false);
  k.close();
});

test('keyed: close() stops it; new Keyed(options) is keyed(options); wrap passes the key', async () => {
  const time = fakeTime();
  const k = new Keyed({ maxKeys: 10, capacity: 1, rate: '1/s', now: time.now, timers: time.timers });
  ok(k.tryAcquire('x'));
  const add = k.wrap((key, a, b) => `${key}:${a + b}`);
  const p = add('y', 1, 2);
  await time.advance(0);
  equal(await p, 'y:3');
  k.close();
  equal(k.tryAcquire('z'), false, 'closed:');
  equal(k.size, 0);
  await rejects(k.schedule('z', () => 1), (e) => ok(e instanceof ClosedError, String(e)));
  throws(() => new Keyed({ capacity: 0, rate: '1/s' }), (e) => ok(/capacity/.test(e.message), e.message));
});

test('keyed: reconfigure converts every key, none gains', async () => {
  const time = fakeTime();
  const k = keyed({ maxKeys: 10, capacity: 10, rate: '1/s', now: time.now, timers: time.timers });
  for (let i = 0; i < 7; i++) k.tryAcquire('a');
  k.reconfigure({ capacity: 100, rate: '10/s' });
  equal(k.get('a').available, 3, 'a after a raise:');
  equal(k.get('new').available, 100, 'a new key:');
  k.reconfigure({ capacity: 2 });
  equal(k.get('a').available, 2, 'a after a cut:');
  k.close();
});

test('retry: full jitter within [0, min(cap, base·2^n)]', async () => {
  for (const r of [0, 0.5, 0.999999]) {
    const waits = [];
    let calls = 0;
    await rejects(retry(() => { calls++; throw new Error('down'); }, {
      retries: 6, base: 100, cap: 1000, random: () => r, delay: async (ms) => { waits.push(ms); },
    }), (e) => equal(e.message, 'down'));
    equal(calls, 7);
    waits.forEach((w, n) => ok(w >= 0 && w <= Math.min(1000, 100 * 2 ** n), `wait ${n}: ${w}`));
    equal(waits[0], r * 100);
    equal(waits[5], r * 1000);
  }
});

test('retry: Retry-After and RateLimit headers set the wait; success ends it', async () => {
  const waits = [];
  const answers = [
    new Response(null, { status: 429, headers: { 'Retry-After': '2' } }),
    new Response(null, { status: 503, headers: { RateLimit: '"api";r=0;t=3', 'RateLimit-Policy': '"api";q=10;w=60' } }),
    new Response(null, { status: 429, headers: { 'RateLimit-Remaining': '0', 'RateLimit-Reset': '4' } }),
    new Response('ok', { status: 200 }),
  ];
  const res = await retry((attempt) => answers[attempt], {
    retries: 5, base: 10, cap: 50, random: () => 0, delay: async (ms) => { waits.push(ms); },
  });
  equal(res.status, 200);
  deepEqual(waits, [2000, 3000, 4000]);
  // respectRetryAfter: false keeps to the backoff alone.
  const own = [];
  await retry((attempt) => (attempt === 0 ? new Response(null, { status: 429, headers: { 'Retry-After': '9' } }) : 'done'), {
    respectRetryAfter: false, base: 10, random: () => 1, delay: async (ms) => { own.push(ms); },
  });
  deepEqual(own, [10]);
  // The last response is returned once the retries are spent.
  const last = await retry(() => new Response(null, { status: 500 }), { retries: 1, delay: async () => {} });
  equal(last.status, 500);
  const h = rateLimitHints(new Headers({ 'Retry-After': new Date(Date.now() + 5000).toUTCString() }));
  ok(h.retryAfterMs > 3000 && h.retryAfterMs <= 5000, `date: ${h.retryAfterMs}`);
  deepEqual(rateLimitHints({ RateLimit: '"api";r=7;t=1', 'RateLimit-Policy': '"api";q=10;w=2' }),
    { retryAfterMs: null, resetMs: 1000, remaining: 7, limit: 10, windowMs: 2000 });
  // An AbortError is not retried.
  let n = 0;
  await rejects(retry(() => { n++; throw new AbortError(); }, { delay: async () => {} }), (e) => equal(e.name, 'AbortError'));
  equal(n, 1);
});

test('CircuitBreaker: closed, open, half-open, closed again; CircuitOpenError', async () => {
  let now = 0n;
  const changes = [];
  const b = new CircuitBreaker({ failureThreshold: 3, resetTimeout: '1s', now: () => now, onStateChange: (s) => changes.push(s) });
  const fail = () => b.call(async () => { throw new Error('x'); });
  for (let i = 0; i < 2; i++) await rejects(fail(), (e) => equal(e.message, 'x'));
  equal(b.state, 'closed');
  equal(await b.call(async () => 'fine'), 'fine', 'a success resets the count:');
  for (let i = 0; i < 3; i++) await rejects(fail(), (e) => equal(e.message, 'x'));
  equal(b.state, 'open');
  now = 400000000n;
  const open = await rejects(b.call(async () => 'no'), (e) => ok(e instanceof CircuitOpenError, String(e)));
  equal(open.retryAfterMs, 600);
  now = 1000000000n;
  equal(b.state, 'half-open');
  const trial = deferred();
  const t = b.call(() => trial.promise);
  await rejects(b.call(async () => 'second trial'), (e) => ok(e instanceof CircuitOpenError));
  trial.resolve('recovered');
  equal(await t, 'recovered');
  equal(b.state, 'closed');
  for (let i = 0; i < 3; i++) await rejects(fail(), () => {});
  now = 2000000000n;
  await rejects(fail(), () => {});
  equal(b.state, 'open', 'a failed trial opens it again:');
  deepEqual(changes, ['open', 'half-open', 'closed', 'open', 'half-open', 'open']);
});

test('retry: a Unix-time RateLimit-Reset is a time, not seconds to wait; X-RateLimit-Reset too', async () => {
  const waits = [];
  const nowS = Math.floor(Date.now() / 1000);
  const answers = [
    // GitLab's form: RateLimit-Reset is the Unix time of the reset.
    new Response(null, { status: 429, headers: { 'RateLimit-Remaining': '0', 'RateLimit-Reset': String(nowS + 3) } }),
    // GitHub's.
    new Response(null, { status: 403, headers: { 'X-RateLimit-Remaining': '0', 'X-RateLimit-Reset': String(nowS + 2) } }),
    new Response('ok', { status: 200 }),
  ];
  const res = await retry((attempt) => answers[attempt], {
    retries: 5, base: 10, cap: 50, random: () => 0, delay: async (ms) => { waits.push(ms); },
    shouldRetry: (r) => r.status !== 200,
  });
  equal(res.status, 200);
  equal(waits.length, 2);
  ok(waits[0] > 1000 && waits[0] <= 3000, `GitLab reset: waited ${waits[0]} ms`);
  ok(waits[1] > 0 && waits[1] <= 2000, `GitHub reset: waited ${waits[1]} ms`);
  const h = rateLimitHints({ 'RateLimit-Reset': String(nowS + 60) });
  ok(h.resetMs > 58000 && h.resetMs <= 60000, `resetMs ${h.resetMs}`);
  equal(rateLimitHints({ 'RateLimit-Reset': '30' }).resetMs, 30000, 'delta-seconds stay seconds:');
});

test('retry: a server asking for more than maxRetryAfter is not waited for', async () => {
  const waits = [];
  let calls = 0;
  const res = await retry(() => { calls++; return new Response(null, { status: 429, headers: { 'Retry-After': '3600' } }); }, {
    retries: 5, delay: async (ms) => { waits.push(ms); },
  });
  equal(res.status, 429);
  equal(calls, 1, 'calls (default maxRetryAfter 60 s):');
  deepEqual(waits, []);
  let n = 0;
  await retry(() => (n++ === 0 ? new Response(null, { status: 429, headers: { 'Retry-After': '3600' } }) : 'done'), {
    maxRetryAfter: '2h', delay: async (ms) => { waits.push(ms); },
  });
  deepEqual(waits, [3600000], 'with maxRetryAfter 2h:');
});

test('sleep: a wait longer than a timer takes is slept in steps, never cut short', async () => {
  let now = 0;
  const armed = [];
  const clock = {
    now: () => now,
    setTimeout: (fn, ms) => { armed.push(ms); now += ms; queueMicrotask(fn); return armed.length; },
    clearTimeout: () => {},
  };
  const day = 86400000;
  await sleep(30 * day, undefined, clock);
  ok(now >= 30 * day, `woke at ${now} ms`);
  ok(armed.every((ms) => ms <= 2147483647), `timers: ${armed}`);
  equal(armed.length, 2);
});

test('limit(): priority orders the wait for a slot; maxWait bounds it', async () => {
  const time = fakeTime();
  const l = limit({ concurrency: 1, capacity: 100, rate: '100/s', now: time.now, timers: time.timers });
  const order = [];
  const job = (name, ms) => () => { order.push(name); return new Promise((r) => time.timers.setTimeout(r, ms)); };
  const jobs = [
    l.schedule(job('a', 100), { priority: 'low' }),
    l.schedule(job('b', 100), { priority: 'low' }),
    l.schedule(job('c', 100), { priority: 'low' }),
    l.schedule(job('H', 100), { priority: 'high' }),
  ];
  await time.advance(1000);
  await Promise.all(jobs);
  deepEqual(order, ['a', 'H', 'b', 'c']);
  // A task with maxWait 100 ms behind a 500 ms task is refused at 100 ms, not run at 500 ms.
  let ran = false;
  const long = l.schedule(job('long', 500));
  const t0 = time.ms;
  let at = null;
  const late = rejects(
    l.schedule(() => { ran = true; }, { maxWait: '100ms' }).catch((e) => { at = time.ms - t0; throw e; }),
    (e) => ok(e instanceof TimeoutError && e.reason === 'expired', String(e)),
  );
  await time.advance(600);
  await late;
  equal(ran, false);
  equal(at, 100, 'refused after (ms):');
  await long;
  // The queue's maxWait counts the slot and the tokens together.
  const q = limit({ concurrency: 1, capacity: 1, rate: '1/s', queue: { maxWait: '1.5s' }, now: time.now, timers: time.timers });
  const starts = [];
  const all = [1, 2, 3].map((i) => q.schedule(() => starts.push([i, time.ms - t0])).catch((e) => e));
  await time.advance(3000);
  const outcomes = await Promise.all(all);
  equal(starts.length, 2, `started: ${JSON.stringify(starts)}`);
  ok(outcomes[2] instanceof TimeoutError, String(outcomes[2]));
  // A run timeout bounds the task's run, not its wait for a slot and tokens.
  const timed = limit({ concurrency: 1, capacity: 1, rate: '1/s', timeout: 100, now: time.now, timers: time.timers });
  const quick = [1, 2].map((i) => timed.schedule(() => i));
  const stuck = timed.schedule(() => new Promise(() => {})).catch((e) => e);
  await time.advance(2500);
  deepEqual(await Promise.all(quick), [1, 2]);
  const e = await stuck;
  ok(e instanceof TimeoutError && e.reason === 'run', String(e));
});

test('PromisePool: priority, maxWait, a larger concurrency starts waiting tasks at once', async () => {
  const time = fakeTime();
  const pool = new PromisePool({ concurrency: 1, now: time.now, timers: time.timers });
  const gates = [deferred(), deferred(), deferred(), deferred()];
  const started = [];
  const run = (i, o) => pool.run(() => { started.push(i); return gates[i].promise; }, o);
  const all = [run(0), run(1, { priority: 'low' }), run(2), run(3, { priority: 'high' })];
  await time.advance(0);
  deepEqual(started, [0]);
  pool.concurrency = 3;
  await time.advance(0);
  deepEqual(started, [0, 3, 2], 'high first, then normal, at once:');
  for (const g of gates) g.resolve();
  await Promise.all(all);
  deepEqual(started, [0, 3, 2, 1]);
  const p1 = new PromisePool({ concurrency: 1, now: time.now, timers: time.timers });
  const hold = deferred();
  const first = p1.run(() => hold.promise);
  const waiter = rejects(p1.run(() => 'never', { maxWait: 50 }), (e) => ok(e instanceof TimeoutError && e.reason === 'expired', String(e)));
  await time.advance(50);
  await waiter;
  equal(p1.pending, 0);
  hold.resolve('x');
  equal(await first, 'x');
});

test('onEmpty(), onIdle() and the events (EventTarget, p-queue\'s names)', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s' });
  const events = [];
  for (const type of ['active', 'completed', 'error', 'empty', 'idle']) {
    l.addEventListener(type, (e) => events.push(e.detail == null ? type : `${type}:${e.detail instanceof Error ? e.detail.message : e.detail}`));
  }
  await l.onIdle();
  const jobs = [
    l.schedule(() => 1),
    l.schedule(() => { throw new Error('two'); }).catch(() => 'caught'),
    l.schedule(() => new Promise((r) => time.timers.setTimeout(() => r(3), 500))),
  ];
  let emptyAt = null;
  let idleAt = null;
  l.onEmpty().then(() => { emptyAt = time.ms; });
  l.onIdle().then(() => { idleAt = time.ms; });
  equal(l.pending, 2);
  await time.advance(1000);
  deepEqual(await Promise.all(jobs), [1, 'caught', 3]);
  equal(emptyAt, 200, 'empty at (ms):');
  equal(idleAt, 700, 'idle at (ms):');
  deepEqual(events, ['active', 'completed:1', 'active', 'error:two', 'active', 'empty', 'completed:3', 'idle']);
  l.close();
  const pool = new PromisePool({ concurrency: 2 });
  let idle = 0;
  pool.addEventListener('idle', () => idle++);
  await Promise.all([1, 2, 3].map((i) => pool.run(async () => i)));
  await pool.onIdle();
  equal(idle, 1);
  equal(pool.active + pool.pending, 0);
});

test('reconfigure: a live quota change converts the bucket, waiters keep their turn', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 10, rate: '1/s' });
  for (let i = 0; i < 7; i++) ok(l.tryAcquire());
  l.reconfigure({ capacity: 100, rate: '10/s' });
  equal(l.available, 3, 'raised: what was left, not 100:');
  equal(l.capacity, 100);
  l.reconfigure({ capacity: 2, algorithm: 'gcra' });
  equal(l.available, 2, 'cut to the new capacity:');
  equal(l.algorithm, 'gcra');
  // Waiters: planned with the new rate, in their order.
  l.tryAcquire(2);
  const ran = [];
  const waits = [1, 2, 3].map((i) => l.schedule(() => ran.push([i, time.ms])));
  await time.advance(0);
  l.reconfigure({ rate: '1/s' });
  await time.advance(3000);
  await Promise.all(waits);
  deepEqual(ran, [[1, 1000], [2, 2000], [3, 3000]]);
  throws(() => l.reconfigure({ rate: 'fast' }), (e) => ok(e instanceof RangeError, e.message));
  equal(l.rate, '1/s', 'a refused change changes nothing:');
  l.close();
});

test('pause(), resume(), clear(), wrap() and a run timeout', async () => {
  const time = fakeTime();
  const l = limiter(time, { capacity: 1, rate: '10/s', queue: { maxWait: '2s' } });
  const ran = [];
  const job = (i) => () => ran.push([i, time.ms]);
  l.pause();
  equal(l.tryAcquire(), false, 'paused: nothing admitted');
  const a = l.schedule(job(1));
  const b = l.schedule(job(2));
  await time.advance(500);
  deepEqual(ran, []);
  equal(l.pending, 2);
  l.resume();
  await time.advance(200);
  deepEqual(ran, [[1, 500], [2, 600]]);
  await Promise.all([a, b]);
  // A task held past its maxWait while paused is refused then.
  l.pause();
  const held = rejects(l.schedule(job(3), { maxWait: '100ms' }), (e) => ok(e instanceof TimeoutError && e.reason === 'expired', String(e)));
  await time.advance(100);
  await held;
  l.resume();
  // clear(): the waiters go (AbortError), spending nothing.
  l.tryAcquire();
  const c1 = l.schedule(job(4));
  const c2 = l.schedule(job(5));
  equal(l.clear(), 2);
  await rejects(c1, (e) => ok(e instanceof AbortError, String(e)));
  await rejects(c2, (e) => ok(e instanceof AbortError, String(e)));
  await time.advance(100);
  equal(l.available, 1, 'the cleared took nothing:');
  // wrap: the arguments go through.
  const add = l.wrap((x, y) => x + y);
  equal(await add(2, 3), 5);
  // timeout: the caller is answered at the timeout; the task's signal aborts.
  let aborted = null;
  const t0 = time.ms;
  const slow = rejects(l.schedule(({ signal }) => new Promise((resolve) => {
    signal.addEventListener('abort', () => { aborted = time.ms; resolve('late'); });
  }), { timeout: 300 }), (e) => ok(e instanceof TimeoutError && e.reason === 'run', String(e)));
  await time.advance(1000);
  await slow;
  ok(aborted !== null && aborted - t0 >= 300 && aborted - t0 <= 400, `aborted at ${aborted - t0}`);
  // The pool keeps the slot until the task settles: never more than its concurrency runs.
  const pool = new PromisePool({ concurrency: 1, timeout: 100, now: time.now, timers: time.timers });
  const stuck = deferred();
  const p1 = rejects(pool.run(() => stuck.promise), (e) => ok(e instanceof TimeoutError && e.reason === 'run', String(e)));
  const p2 = pool.run(() => 'second');
  await time.advance(150);
  await p1;
  equal(pool.active, 1, 'the timed-out task still holds its slot:');
  stuck.resolve();
  equal(await p2, 'second');
  l.close();
});

test('ALGORITHMS is frozen: the store cannot be led to the wrong script', () => {
  ok(Object.isFrozen(ALGORITHMS));
  throws(() => ALGORITHMS.sort(), (e) => ok(e instanceof TypeError, String(e)));
  deepEqual([...ALGORITHMS], ['token_bucket', 'gcra', 'leaky_bucket', 'sliding_log', 'sliding_window', 'fixed_window']);
});

test('keyHash is the gateway\'s keyed hash (HMAC-SHA256, 128 bits, hex)', async () => {
  await ready();
  // The vector crates/sluice-http/src/key_hash.rs pins (RFC 4231, test case 2, truncated).
  equal(keyHash('Jefe', 'what do ya want for nothing?'), '5bdcc146bf60754e6a042426089575c7');
  equal(keyHash(new TextEncoder().encode('Jefe'), 'what do ya want for nothing?'), '5bdcc146bf60754e6a042426089575c7');
  equal(keyHash('', ''), 'b613679a0814d9ec772f95d778c35fc5', 'the empty salt:');
  equal(keyHash('pepper', 'sk-ünïcode'), keyHash('pepper', new TextEncoder().encode('sk-ünïcode')), 'strings are UTF-8:');
});

test('the default clock and timers: real time, spaced at the rate', async () => {
  const l = new RateLimiter({ capacity: 1, rate: '20/s', queue: { maxWait: '5s' } });
  const t0 = performance.now();
  const at = await Promise.all([0, 1, 2, 3].map(() => l.schedule(() => performance.now() - t0)));
  // One at once, then one every 50 ms: the last at 150 ms at the earliest (timers fire late on
  // a loaded machine, never early).
  ok(at[0] < 50, `first at ${at[0]} ms`);
  ok(at[3] >= 149 && at[3] < 3000, `last at ${at[3]} ms`);
  l.close();
});

tests.push(...chargeTests);

export { tests };
