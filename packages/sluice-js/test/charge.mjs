// Settled costs in the behaviour suite (suite.mjs, run by Node and in Chromium): charge() and
// refund() on RateLimiter, keyed() and limit(), on a fake clock. A bucket takes a charge whole,
// into debt down to maxDebt tokens beyond empty, and admits nothing until the refill has paid
// it; a window takes what it has left. Over any window of length T a bucket is then charged at
// most capacity + rate·T plus what it still owes at the window's end.

import { RateLimiter, keyed, limit, TimeoutError } from '../src/index.js';
import { fakeTime } from './fake-time.mjs';
import { equal, deepEqual, ok, rejects, throws } from './check.mjs';

const chargeTests = [];
const test = (name, fn) => chargeTests.push({ name, fn });

const BUCKETS = ['token_bucket', 'gcra', 'leaky_bucket'];
const WINDOWS = ['sliding_log', 'sliding_window', 'fixed_window'];
const MS = 1000000n;

function settableTime() {
  let now = 0n;
  return { now: () => now, set: (t) => { now = t; }, timers: fakeTime().timers };
}

/** Whole numbers below `n`, the same sequence for the same `start` (xorshift32). */
export function numbers(start) {
  let x = start >>> 0 || 1;
  return (n) => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % n;
  };
}

/**
 * The documented rules of a bucket (token_bucket, gcra and leaky_bucket admit alike), restated
 * on the moment it is full again (GCRA's "theoretical arrival time"), in BigInt ns: it holds
 * (tau - (tat - now)) / interval tokens, fewer than none when a charge put it in debt.
 */
function bucketModel(capacity, intervalNs) {
  const tau = BigInt(capacity) * intervalNs;
  let tat = 0n;
  const max = (a, b) => (a > b ? a : b);
  return {
    /** tryAcquire(cost): a key in debt refuses even a query (cost 0). */
    check(now, cost) {
      if (cost === 0) return tat - now <= tau;
      const next = max(tat, now) + BigInt(cost) * intervalNs;
      if (next - now > tau) return false;
      tat = next;
      return true;
    },
    /** charge(cost, { maxDebt }): all of it, down to maxDebt tokens beyond empty; the rest forgiven. */
    charge(now, cost, maxDebt) {
      const base = max(tat, now);
      let taken = BigInt(cost);
      if (maxDebt !== undefined) {
        const floor = now + tau + BigInt(maxDebt) * intervalNs;
        const room = floor > base ? (floor - base) / intervalNs : 0n;
        if (room < taken) taken = room;
      }
      tat = base + taken * intervalNs;
      return cost - Number(taken);
    },
    /** refund(cost): at most the capacity at once, never beyond full. */
    refund(now, cost) {
      const back = BigInt(Math.min(cost, capacity)) * intervalNs;
      tat = max(tat - back, now < tat ? now : tat);
    },
    /** ns of refill owed beyond an empty bucket. */
    owedNs(now) {
      return max(0n, tat - now - tau);
    },
  };
}

/**
 * What `l` owes beyond empty, as it tells it: the wait before a query (cost 0) is admitted,
 * rounded up to the millisecond (0 when it is admitted now).
 */
async function owedNs(l) {
  try {
    await l.schedule(() => undefined, { cost: 0, maxWait: 0 });
    return 0n;
  } catch (e) {
    if (!(e instanceof TimeoutError)) throw e;
    return BigInt(e.retryAfterMs) * MS;
  }
}

/**
 * Random tryAcquire (0 to capacity), charges (0 to 5 × capacity, maxDebt none, 0, 1, capacity
 * or 2 × capacity) and refunds on a bucket, on a settable clock. At every step, in this order:
 *   - the bound, on what the limiter reported and owes: over every window [t_i, t_j] of the
 *     steps so far, the tokens taken (admissions, charges less what was forgiven, less the
 *     refunds asked) are at most capacity + rate·(t_j - t_i) + what it owes at t_j;
 *   - the model: every decision, every forgiven part and what it owes are the documented rules'.
 * `wrap(limiter)` stands a changed limiter in (the test that shows a limiter forgiving its
 * charges is caught). Returns the counts of each kind of step.
 */
export async function chargeProperty({ algorithm, capacity, rate, intervalNs, steps, start, wrap = (l) => l }) {
  const time = settableTime();
  const real = new RateLimiter({ algorithm, capacity, rate, queue: false, now: time.now, timers: time.timers });
  const l = wrap(real);
  const model = bucketModel(capacity, intervalNs);
  const next = numbers(start);
  const tau = BigInt(capacity) * intervalNs;
  const counts = { checks: 0, charges: 0, inDebt: 0, forgiven: 0, refunds: 0 };
  let now = 0n;
  // sum: ns taken by the steps so far; best: the largest t_i - sum before step i.
  let sum = 0n;
  let best = null;
  try {
    for (let step = 0; step < steps; step++) {
      if (next(4) !== 0) now += BigInt(next(3 * Number(intervalNs)));
      time.set(now);
      const op = next(10);
      let what, got, want, taken;
      if (op < 5) {
        const cost = next(capacity + 1);
        what = `tryAcquire(${cost})`;
        got = l.tryAcquire(cost);
        want = model.check(now, cost);
        taken = got ? BigInt(cost) * intervalNs : 0n;
        counts.checks++;
      } else if (op < 8) {
        const cost = next(5 * capacity + 1);
        const maxDebt = [undefined, 0, 1, capacity, 2 * capacity][next(5)];
        what = `charge(${cost}, { maxDebt: ${maxDebt} })`;
        got = l.charge(cost, { maxDebt });
        want = model.charge(now, cost, maxDebt);
        taken = BigInt(cost - got) * intervalNs;
        counts.charges++;
        if (got > 0) counts.forgiven++;
      } else {
        const cost = next(capacity + 1);
        what = `refund(${cost})`;
        l.refund(cost);
        model.refund(now, cost);
        taken = -BigInt(cost) * intervalNs;
        counts.refunds++;
      }
      const here = `${algorithm}, ${capacity} at ${rate}, step ${step} at ${now} ns, ${what}:`;
      if (best === null || now - sum > best) best = now - sum;
      sum += taken;
      const owed = await owedNs(l);
      if (owed > 0n) counts.inDebt++;
      // max over i of (sum_j - sum_before_i) - (t_j - t_i), against capacity + what is owed.
      const beyond = sum - now + best - (tau + owed);
      ok(beyond <= 0n, `${here} ${beyond} ns taken beyond capacity + rate·T + what is owed`);
      if (what.startsWith('charge')) equal(got, want, `${here} forgiven:`);
      else if (got !== undefined) equal(got, want, `${here} admitted:`);
      const modelOwed = model.owedNs(now);
      ok(owed >= modelOwed && owed < modelOwed + MS, `${here} owes ${owed} ns, the rules ${modelOwed}`);
    }
  } finally {
    real.close();
  }
  return counts;
}

const CONFIGS = [
  { capacity: 5, rate: '10/s', intervalNs: 100000000n },
  { capacity: 1, rate: '4/s', intervalNs: 250000000n },
  { capacity: 20, rate: '100/min', intervalNs: 600000000n },
];

test('charge: random checks, charges up to 5 × capacity, maxDebt caps and refunds keep a bucket within capacity + rate·T plus what it owes, by the documented rules', async () => {
  let i = 0;
  const total = { checks: 0, charges: 0, inDebt: 0, forgiven: 0, refunds: 0 };
  for (const algorithm of BUCKETS) {
    for (const config of CONFIGS) {
      const counts = await chargeProperty({ algorithm, ...config, steps: 400, start: 1000 + i++ });
      for (const k of Object.keys(total)) total[k] += counts[k];
    }
  }
  // The steps reached every case: admissions, debt, caps forgiving, refunds.
  ok(total.checks > 1000 && total.charges > 700 && total.refunds > 400, JSON.stringify(total));
  ok(total.inDebt > 500 && total.forgiven > 50, JSON.stringify(total));
});

test('charge: the property catches a limiter that takes nothing for a charge, and one that forgives it', async () => {
  const config = { algorithm: 'gcra', ...CONFIGS[0], steps: 400, start: 7 };
  // Says it took everything, took nothing: it admits beyond the bound.
  const silent = (l) => ({
    tryAcquire: (c) => l.tryAcquire(c),
    charge: () => 0,
    refund: (c) => l.refund(c),
    schedule: (fn, o) => l.schedule(fn, o),
  });
  await rejects(chargeProperty({ ...config, wrap: silent }), (e) => ok(/beyond capacity \+ rate·T/.test(e.message), e.message));
  // Says it forgave everything: within the bound, but not the rules (no cap means no forgiving).
  const forgiving = (l) => ({ ...silent(l), charge: (c) => c });
  await rejects(chargeProperty({ ...config, wrap: forgiving }), (e) => ok(/forgiven:/.test(e.message), e.message));
});

test('charge: a bucket goes into debt, refuses even a query until the refill pays it, and maxDebt caps it', () => {
  for (const algorithm of BUCKETS) {
    const time = settableTime();
    const l = new RateLimiter({ algorithm, capacity: 10, rate: '10/s', queue: false, now: time.now, timers: time.timers });
    equal(l.charge(25), 0, `${algorithm}: no cap, nothing forgiven:`);
    equal(l.available, 0);
    equal(l.tryAcquire(0), false, `${algorithm}: a query in debt:`);
    // 15 tokens owed at 100 ms each: paid at 1.5 s, the next token at 1.6 s.
    time.set(1500n * MS - 1n);
    equal(l.tryAcquire(0), false, `${algorithm}: one ns before the debt is paid:`);
    time.set(1500n * MS);
    equal(l.tryAcquire(0), true, `${algorithm}: paid:`);
    equal(l.tryAcquire(), false);
    time.set(1600n * MS);
    equal(l.tryAcquire(), true, `${algorithm}: the first token after the debt:`);
    equal(l.isIdle(), false);
    // maxDebt: what fits (10 left, 5 beyond empty) is taken, the rest forgiven.
    time.set(10000n * MS);
    equal(l.charge(25, { maxDebt: 5 }), 10, `${algorithm}: capped:`);
    equal(l.charge(3, { maxDebt: 5 }), 3, `${algorithm}: at the cap already:`);
    equal(l.charge(0), 0);
    time.set(10600n * MS);
    equal(l.tryAcquire(), true, `${algorithm}: 5 owed, paid at 0.5 s, a token at 0.6 s:`);
    l.close();
    equal(l.charge(4), 4, `${algorithm}: closed, all forgiven:`);
  }
  const l = new RateLimiter({ capacity: 2, rate: '1/s' });
  throws(() => l.charge(1.5), (e) => ok(e instanceof RangeError && /cost/.test(e.message), e.message));
  throws(() => l.charge(1, { maxDebt: -1 }), (e) => ok(e instanceof RangeError && /maxDebt/.test(e.message), e.message));
  throws(() => l.charge(1, { maxDebt: '50%' }), (e) => ok(e instanceof RangeError && /maxDebt/.test(e.message), e.message));
  throws(() => l.refund(1, { ago: 'soon' }), (e) => ok(e instanceof RangeError && /ago/.test(e.message), e.message));
  equal(l.charge(1000, { maxDebt: Infinity }), 0, 'Infinity: no cap:');
  l.close();
});

test('charge: a window takes what it has left and forgives the rest, carrying nothing into the next', () => {
  for (const algorithm of WINDOWS) {
    const time = settableTime();
    const l = new RateLimiter({ algorithm, capacity: 10, rate: '10/s', queue: false, now: time.now, timers: time.timers });
    ok(l.tryAcquire(4));
    equal(l.charge(25), 19, `${algorithm}:`);
    equal(l.available, 0);
    equal(l.charge(3, { maxDebt: 100 }), 3, `${algorithm}: nothing left, maxDebt or not:`);
    time.set(10000n * MS);
    equal(l.available, 10, `${algorithm}: no debt carried:`);
    l.close();
  }
});

test('charge: on windows, random checks, charges and refunds take what is left, at most N (sliding_log) or 2N in any window W', async () => {
  let i = 0;
  for (const algorithm of WINDOWS) {
    for (const { capacity, rate, intervalNs } of CONFIGS) {
      const time = settableTime();
      const l = new RateLimiter({ algorithm, capacity, rate, queue: false, now: time.now, timers: time.timers });
      const next = numbers(0xa11 + i++);
      const W = BigInt(capacity) * intervalNs;
      const most = algorithm === 'sliding_log' ? capacity : 2 * capacity;
      const steps = [];
      let now = 0n;
      for (let step = 0; step < 400; step++) {
        if (next(4) !== 0) now += BigInt(next(2 * Number(intervalNs)));
        time.set(now);
        const op = next(10);
        const here = `${algorithm}, ${capacity} at ${rate}, step ${step} at ${now} ns:`;
        let taken = 0;
        if (op < 5) {
          const cost = next(capacity + 1);
          if (l.tryAcquire(cost)) taken = cost;
        } else if (op < 8) {
          const cost = next(5 * capacity + 1);
          const left = l.available;
          const forgiven = l.charge(cost, { maxDebt: [undefined, 0, capacity][next(3)] });
          taken = cost - forgiven;
          equal(taken, Math.min(cost, left), `${here} charge(${cost}) with ${left} left took`);
          equal(l.available, left - taken, `${here} left after the charge:`);
        } else {
          const cost = next(capacity + 1);
          const agoMs = next(2 * Number(W / MS) + 1);
          l.refund(cost, { ago: agoMs });
          taken = -cost;
        }
        steps.push({ at: now, taken });
        // Every window (t_j - W, t_j] ending at a step.
        let inWindow = 0;
        for (let k = steps.length - 1; k >= 0 && steps[k].at > now - W; k--) inWindow += steps[k].taken;
        ok(inWindow <= most, `${here} ${inWindow} taken in a window of ${W} ns, above ${most}`);
      }
      l.close();
    }
  }
});

test('charge: waiters queued on a bucket in debt wait for the refill that pays it, in their order', async () => {
  for (const algorithm of BUCKETS) {
    const time = fakeTime();
    const l = new RateLimiter({ algorithm, capacity: 2, rate: '10/s', queue: { maxWait: '5s' }, now: time.now, timers: time.timers });
    ok(l.tryAcquire(2));
    const ran = [];
    const a = l.schedule(() => ran.push(['a', time.ms]));
    const b = l.schedule(() => ran.push(['b', time.ms]), { priority: 'high' });
    const c = l.schedule(() => ran.push(['c', time.ms]));
    // Deadline at 300 ms: the charge puts its turn past it, so it is refused now.
    // Behind b, due at 200 ms within its 300 ms; the charge puts its turn past that: refused then.
    const late = rejects(l.schedule(() => ran.push(['late', time.ms]), { priority: 'high', maxWait: '300ms' }), (e) => ok(e instanceof TimeoutError && e.reason === 'expired' && e.retryAfterMs > 300, `${algorithm}: ${e}`));
    await time.advance(50);
    equal(l.pending, 4);
    // Half a token left at 50 ms, 5 charged: 4.5 owed beyond empty, paid at 500 ms; then a
    // token every 100 ms, from 600 ms.
    equal(l.charge(5), 0);
    await late;
    equal(l.pending, 3, `${algorithm}: the late one left:`);
    equal(time.armed, 1, `${algorithm}: one timer:`);
    await time.advance(549);
    deepEqual(ran, [], `${algorithm}: nothing before the debt is paid and a token is back:`);
    await time.advance(1000);
    deepEqual(ran, [['b', 600], ['a', 700], ['c', 800]], `${algorithm}:`);
    await Promise.all([a, b, c]);
    l.close();
  }
});

test('refund: never beyond full; a debt shrinks first; a waiter may go at once', async () => {
  for (const algorithm of BUCKETS) {
    const time = fakeTime();
    const l = new RateLimiter({ algorithm, capacity: 3, rate: '1/s', now: time.now, timers: time.timers });
    l.refund(2);
    equal(l.available, 3, `${algorithm}: a full bucket stays full:`);
    equal(l.isIdle(), true);
    equal(l.charge(5), 0);
    l.refund(1);
    equal(l.tryAcquire(0), false, `${algorithm}: 1 still owed:`);
    l.refund(2);
    equal(l.available, 1, `${algorithm}: the debt paid first, then 1 back:`);
    ok(l.tryAcquire());
    const ran = [];
    const w = l.schedule(() => ran.push(time.ms));
    await time.advance(10);
    deepEqual(ran, []);
    l.refund(1, { ago: '2s' });
    await time.advance(0);
    deepEqual(ran, [10], `${algorithm}: the waiter went on the refund:`);
    await w;
    l.refund(100);
    l.refund(100);
    equal(l.available, 3, `${algorithm}: never beyond full:`);
    l.close();
    l.refund(1);
  }
  // A window gives back only what it counted in a window it still holds.
  for (const algorithm of WINDOWS) {
    const time = settableTime();
    const l = new RateLimiter({ algorithm, capacity: 4, rate: '1/s', queue: false, now: time.now, timers: time.timers });
    ok(l.tryAcquire(4));
    time.set(500n * MS);
    l.refund(1, { ago: '500ms' });
    equal(l.available, 1, `${algorithm}: counted in this window:`);
    l.refund(9, { ago: 200 });
    ok(l.available <= 4, `${algorithm}: never beyond full`);
    l.close();
  }
});

test('keyed: charge and refund per key; a key in debt dropped for another comes back in debt', async () => {
  const time = fakeTime();
  const k = keyed({ maxKeys: 2, capacity: 5, rate: '1/s', now: time.now, timers: time.timers });
  equal(k.charge('a', 15), 0);
  equal(k.tryAcquire('a'), false, 'a in debt:');
  equal(k.charge('b', 8, { maxDebt: 1 }), 2, 'b: 5 left and 1 beyond empty taken:');
  // 'c' needs room: 'a' (least recently used) goes, remembered until its debt is paid.
  ok(k.tryAcquire('c'));
  ok(!k.has('a') && k.has('b') && k.has('c'));
  await time.advance(10999);
  equal(k.tryAcquire('a'), false, 'a, dropped and back, still in debt:');
  await time.advance(1);
  equal(k.tryAcquire('a'), true, 'a at 11 s: the debt of 10 paid and one token back:');
  // A key with waiters: charged in its limiter, its waiters planned after the debt.
  const ran = [];
  ok(k.tryAcquire('c', 4));
  const w = k.schedule('c', () => ran.push(time.ms), { cost: 2 });
  equal(k.charge('c', 3), 0);
  await time.advance(3999);
  deepEqual(ran, []);
  await time.advance(1);
  // c had 1 left at 11 s: the charge of 3 owes 2, paid at 13 s, then the waiter's 2 at 15 s.
  deepEqual(ran, [15000], 'c:');
  await w;
  // Refunds: to a key held; a key not held is not made for it.
  k.refund('c', 2);
  equal(k.get('c').available, 2);
  k.refund('nobody', 3);
  equal(k.has('nobody'), false);
  k.close();
  equal(k.charge('a', 3), 3, 'closed: all forgiven:');
  k.refund('a', 1);
});

test('limit(): charge and refund go to its rate limiter', async () => {
  const time = fakeTime();
  const l = limit({ concurrency: 1, capacity: 2, rate: '10/s', now: time.now, timers: time.timers });
  equal(l.charge(4), 0);
  equal(l.limiter.available, 0);
  l.refund(2);
  equal(l.limiter.tryAcquire(0), true, 'the debt of 2 refunded:');
  l.close();
  const pool = limit({ concurrency: 1 });
  throws(() => pool.charge(1), (e) => ok(e instanceof TypeError && /no rate/.test(e.message), e.message));
  throws(() => pool.refund(1), (e) => ok(e instanceof TypeError && /no rate/.test(e.message), e.message));
});

export { chargeTests };
