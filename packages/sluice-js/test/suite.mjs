// The behaviour suite of sluice-limits, run by Node (behaviour.test.mjs) and in Chromium
// (browser.test.mjs) alike. Time is a fake clock: admissions are exact.

import {
  RateLimiter, PromisePool, limit, keyed, retry, rateLimitHints, CircuitBreaker,
  QueueFullError, TimeoutError, AbortError, InsufficientCapacityError, CircuitOpenError, ClosedError,
} from '../src/index.js';
import { fakeTime } from './fake-time.mjs';
import { equal, deepEqual, ok, rejects, throws } from './check.mjs';

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

test('keyed: separate buckets, maxKeys drops idle keys first and never a key with waiters', async () => {
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
  // 5 s later both buckets are full again: the least recently used ('a', touched before 'c')
  // makes room for 'd'.
  await time.advance(5000);
  ok(k.tryAcquire('d'));
  ok(k.has('c') && k.has('d') && !k.has('a'), 'a was the least recently used idle key');
  // Every key waiting: a new key is refused.
  k.tryAcquire('c');
  const w1 = k.schedule('c', () => 1);
  const w2 = k.schedule('d', () => 2);
  await rejects(k.schedule('e', () => 3), (e) => ok(e instanceof QueueFullError, String(e)));
  await time.advance(2000);
  deepEqual(await Promise.all([w1, w2]), [1, 2]);
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

export { tests };
