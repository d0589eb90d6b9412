// sluice-limits beside Bottleneck, p-limit, p-queue and rate-limiter-flexible, in one run:
//
//   overhead  ns per scheduled task, 100,000 no-op async tasks submitted at once through a
//             limiter that does not limit them (so only the bookkeeping is timed); Bottleneck
//             takes about 3 ms per task here (a timer per job), so it runs 2,000 tasks
//   memory    bytes per queued task, 100,000 tasks waiting (heap + external, after a GC)
//   accuracy  10 s of real time at 100/s with a burst of 20, each limiter flooded in turn:
//             admitted against the exact bound capacity + rate·T (T from the window's start to
//             its last admission)
//   newkey    ns per new key while the key table is full (maxKeys 1,000 / 20,000 / 100,000):
//             keyed() beside rate-limiter-flexible's memory limiter and Bottleneck's Group,
//             each round in a child process of its own
//   lateness  10 s at 100/s with capacity 1 (then 2), a queue kept full: the rate reached,
//             against Bottleneck's minTime, and the bound checked over every window
//
//   node --expose-gc bench.mjs [--rounds N] [--only overhead,memory,accuracy,newkey,lateness] [--json]
//
// Each figure is the median of N rounds (default 5; 3 for accuracy), with min and max.

import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import Bottleneck from 'bottleneck';
import pLimit from 'p-limit';
import PQueue from 'p-queue';
import { RateLimiterMemory, RateLimiterQueue } from 'rate-limiter-flexible';

import { RateLimiter, PromisePool, limit, keyed } from '../../packages/sluice-js/src/index.js';

const args = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
};
const ROUNDS = Number(flag('--rounds', 5));
const ONLY = new Set(flag('--only', 'overhead,memory,accuracy,newkey,lateness').split(','));
const JSON_OUT = args.includes('--json');
const NEWKEY_CHILD = args.includes('--newkey-child');
const N = 100000;

if (typeof globalThis.gc !== 'function') {
  console.error('run with node --expose-gc (memory figures need a GC before each reading)');
  process.exit(2);
}

const noop = async () => {};
const never = () => new Promise(() => {});
const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
};
const settle = () => new Promise((r) => setImmediate(r));

// === overhead ===

/** Each entry: () => a function that schedules one no-op task and returns its promise. */
const OVERHEAD = {
  'sluice RateLimiter.schedule': () => {
    const l = new RateLimiter({ capacity: 1000000, rate: '1000000000/s' });
    return () => l.schedule(noop);
  },
  'sluice PromisePool.run': () => {
    const p = new PromisePool({ concurrency: 1000000 });
    return () => p.run(noop);
  },
  'sluice limit() (pool + rate)': () => {
    const l = limit({ concurrency: 1000000, capacity: 1000000, rate: '1000000000/s' });
    return () => l.schedule(noop);
  },
  'Bottleneck.schedule': () => {
    const b = new Bottleneck({ maxConcurrent: null, minTime: 0 });
    return () => b.schedule(noop);
  },
  'p-limit': () => {
    const l = pLimit(1000000);
    return () => l(noop);
  },
  'p-queue.add': () => {
    const q = new PQueue({ concurrency: 1000000 });
    return () => q.add(noop);
  },
  'rate-limiter-flexible consume+run': () => {
    const r = new RateLimiterMemory({ points: 1000000000, duration: 1 });
    return () => r.consume('k').then(noop);
  },
};

/** Tasks per overhead round: N, except where a peer would take minutes. */
const OVERHEAD_N = { 'Bottleneck.schedule': 2000 };

async function overheadRound(make, n = N) {
  const submit = make();
  global.gc();
  await settle();
  const t0 = process.hrtime.bigint();
  const all = new Array(n);
  for (let i = 0; i < n; i++) all[i] = submit();
  await Promise.all(all);
  return Number(process.hrtime.bigint() - t0) / n;
}

// === memory ===

/** Each entry: () => { enqueue(): queues one task that will not run soon, close() }. */
const MEMORY = {
  'sluice RateLimiter (queued)': () => {
    const l = new RateLimiter({ capacity: 1, rate: '1/h' });
    l.tryAcquire();
    return { enqueue: () => l.schedule(noop).catch(() => {}), close: () => l.close() };
  },
  'sluice PromisePool (queued)': () => {
    const p = new PromisePool({ concurrency: 1 });
    p.run(never);
    return { enqueue: () => p.run(noop), close: () => {} };
  },
  'Bottleneck': () => {
    const b = new Bottleneck({ maxConcurrent: 1 });
    b.schedule(never);
    // stop() rejects every dropped job: caught, as for the sluice limiter above.
    return { enqueue: () => b.schedule(noop).catch(() => {}), close: () => b.stop({ dropWaitingJobs: true }).catch(() => {}) };
  },
  'p-limit': () => {
    const l = pLimit(1);
    l(never);
    return { enqueue: () => l(noop), close: () => l.clearQueue() };
  },
  'p-queue': () => {
    const q = new PQueue({ concurrency: 1 });
    q.add(never);
    return { enqueue: () => q.add(noop), close: () => q.clear() };
  },
  'rate-limiter-flexible RateLimiterQueue': () => {
    const r = new RateLimiterQueue(new RateLimiterMemory({ points: 1, duration: 3600 }), { maxQueueSize: N + 10 });
    r.removeTokens(1);
    return { enqueue: () => r.removeTokens(1).catch(() => {}), close: () => {} };
  },
};

function used() {
  const m = process.memoryUsage();
  return m.heapUsed + m.external;
}

async function memoryRound(make) {
  global.gc();
  await settle();
  global.gc();
  const before = used();
  const q = make();
  const keep = new Array(N);
  for (let i = 0; i < N; i++) keep[i] = q.enqueue();
  await settle();
  global.gc();
  await settle();
  global.gc();
  const bytes = (used() - before) / N;
  q.close();
  keep.length = 0;
  return bytes;
}

// === accuracy ===

const CAPACITY = 20;
const PER_SECOND = 100;
const SECONDS = 10;

/**
 * Each entry: () => { attempt(): Promise<boolean> | boolean } trying one admission; a flood loop
 * calls it back to back (yielding to timers) for SECONDS, counting admissions.
 */
const ACCURACY = {
  'sluice RateLimiter.tryAcquire (gcra)': () => {
    const l = new RateLimiter({ algorithm: 'gcra', capacity: CAPACITY, rate: `${PER_SECOND}/s`, queue: false });
    return { attempt: () => l.tryAcquire() };
  },
  'sluice RateLimiter.schedule (queued)': () => {
    const l = new RateLimiter({ algorithm: 'gcra', capacity: CAPACITY, rate: `${PER_SECOND}/s` });
    return { queued: (fn) => l.schedule(fn), close: () => l.close() };
  },
  'Bottleneck reservoir (queued)': () => {
    const b = new Bottleneck({
      reservoir: CAPACITY,
      reservoirIncreaseAmount: 1,
      reservoirIncreaseInterval: 1000 / PER_SECOND,
      reservoirIncreaseMaximum: CAPACITY,
      // Its default heartbeat (250 ms) would add one token per beat: 1 in 25 of the rate.
      heartbeatInterval: 1000 / PER_SECOND,
    });
    return { queued: (fn) => b.schedule(async () => fn()), close: () => b.stop({ dropWaitingJobs: true }).catch(() => {}) };
  },
  'p-queue intervalCap 20 / 200 ms (queued)': () => {
    const q = new PQueue({ intervalCap: CAPACITY, interval: (1000 * CAPACITY) / PER_SECOND });
    return { queued: (fn) => q.add(fn), close: () => q.clear() };
  },
  'rate-limiter-flexible 20 / 0.2 s consume': () => {
    const r = new RateLimiterMemory({ points: CAPACITY, duration: CAPACITY / PER_SECOND });
    return { attempt: () => r.consume('k').then(() => true, () => false) };
  },
};

/** One limiter at a time, alone in the process, so that no peer's work stalls its loop. */
async function accuracyRound() {
  const results = {};
  for (const [name, make] of Object.entries(ACCURACY)) {
    global.gc();
    await settle();
    const l = make();
    let admitted = 0;
    const t0 = performance.now();
    const end = t0 + SECONDS * 1000;
    let last = t0;
    if (l.attempt) {
      while (performance.now() < end) {
        if (await l.attempt()) {
          admitted++;
          last = performance.now();
        }
        await settle();
      }
    } else {
      // Queue far more than can run: count the tasks that start within the window.
      const total = CAPACITY + PER_SECOND * SECONDS * 2;
      for (let i = 0; i < total; i++) {
        l.queued(() => {
          const now = performance.now();
          if (now < end) {
            admitted++;
            last = now;
          }
        }).catch(() => {});
      }
      await new Promise((r) => setTimeout(r, end - performance.now() + 5));
      l.close();
    }
    const T = (last - t0) / 1000;
    const bound = CAPACITY + Math.floor(PER_SECOND * T);
    results[name] = { admitted, T, bound, excess: admitted - bound };
  }
  return results;
}

// === newkey ===

const MAX_KEYS = [1000, 20000, 100000];
const NEW_KEYS = 2000;

/**
 * Each entry: (maxKeys) => { fill(i): Promise|void, batch(keys): Promise|void, close() }. The
 * table is filled with maxKeys keys, each spent once (1 of 10 per minute: none full again
 * during the run, so every key sluice drops is remembered); then batches of new keys are
 * timed, each key a first decision. rate-limiter-flexible keeps every key until it expires
 * (it has no cap); Bottleneck's Group makes a Bottleneck per key.
 */
const NEWKEY = {
  'sluice keyed().tryAcquire': (maxKeys) => {
    const k = keyed({ maxKeys, capacity: 10, rate: '10/min' });
    return {
      fill: (key) => k.tryAcquire(key),
      batch: (keys) => { for (const key of keys) k.tryAcquire(key); },
      close: () => k.close(),
    };
  },
  'rate-limiter-flexible RateLimiterMemory.consume': () => {
    const r = new RateLimiterMemory({ points: 10, duration: 60 });
    const consume = (key) => r.consume(key).then(() => true, () => false);
    return {
      fill: consume,
      batch: (keys) => Promise.all(keys.map(consume)),
      close: () => {},
    };
  },
  'Bottleneck.Group key().check': () => {
    const g = new Bottleneck.Group({ reservoir: 10, reservoirRefreshAmount: 10, reservoirRefreshInterval: 60000 });
    const check = (key) => g.key(key).check();
    return {
      fill: check,
      batch: (keys) => Promise.all(keys.map(check)),
      close: () => Promise.all(g.limiters().map(({ limiter }) => limiter.disconnect())).catch(() => {}),
    };
  },
};

/**
 * One newkey round in a process of its own: a table of 100,000 Bottlenecks, or of keys whose
 * expiry timers stay armed (rate-limiter-flexible), would otherwise tax whatever is measured
 * after it in the same heap.
 */
function newKeyRoundApart(name, maxKeys, round) {
  return new Promise((resolve, reject) => {
    const child = fork(fileURLToPath(import.meta.url), ['--newkey-child', name, String(maxKeys), String(round)], {
      execArgv: ['--expose-gc'],
    });
    child.once('message', (m) => resolve(m));
    child.once('error', reject);
    child.once('exit', (code) => code !== 0 && reject(new Error(`newkey ${name} ${maxKeys}: exit ${code}`)));
  });
}

async function newKeyRound(make, maxKeys, round) {
  const t = make(maxKeys);
  const fills = [];
  for (let i = 0; i < maxKeys; i++) {
    fills.push(t.fill(`k${i}`));
    if (fills.length === 1000) await Promise.all(fills.splice(0));
  }
  await Promise.all(fills);
  // 10,000 new keys untimed first, so that each peer's code is compiled and warm.
  for (let b = 0; b < 100; b++) await t.batch(Array.from({ length: 100 }, (_, i) => `w${round}-n${b * 100 + i}`));
  global.gc();
  await settle();
  const batches = [];
  for (let b = 0; b < NEW_KEYS / 100; b++) {
    const keys = Array.from({ length: 100 }, (_, i) => `r${round}-n${b * 100 + i}`);
    const t0 = process.hrtime.bigint();
    await t.batch(keys);
    batches.push(Number(process.hrtime.bigint() - t0) / 100);
  }
  await t.close();
  return stats(batches).median;
}

// === lateness ===

/**
 * Each entry: () => { queued(fn) } at 100/s; the queue holds far more than can run in
 * LATE_SECONDS, and the start times of the tasks are kept.
 */
const LATE_SECONDS = 10;
/**
 * sluice's limiters read their clock through this: a task records the moment the limiter
 * admitted it (the last reading), so that the bound is checked on the limiter's own clock,
 * whatever delays the task's start (a process stalled by the machine's load between the
 * admission and the task).
 */
const clock = { last: 0n, now: () => (clock.last = process.hrtime.bigint()) };
const admittedAt = () => Number(clock.last) / 1e6;
const LATENESS = {
  'sluice token_bucket, capacity 1': () => {
    const l = new RateLimiter({ algorithm: 'token_bucket', capacity: 1, rate: '100/s', now: clock.now });
    return { capacity: 1, at: admittedAt, queued: (fn) => l.schedule(fn), close: () => l.close() };
  },
  'sluice gcra, capacity 1': () => {
    const l = new RateLimiter({ algorithm: 'gcra', capacity: 1, rate: '100/s', now: clock.now });
    return { capacity: 1, at: admittedAt, queued: (fn) => l.schedule(fn), close: () => l.close() };
  },
  'sluice token_bucket, capacity 2': () => {
    const l = new RateLimiter({ algorithm: 'token_bucket', capacity: 2, rate: '100/s', now: clock.now });
    return { capacity: 2, at: admittedAt, queued: (fn) => l.schedule(fn), close: () => l.close() };
  },
  // Bottleneck has no clock to read: the moment its task starts.
  'Bottleneck minTime 10 ms': () => {
    const b = new Bottleneck({ minTime: 10, maxConcurrent: null });
    return { capacity: 1, at: () => performance.now(), queued: (fn) => b.schedule(async () => fn()), close: () => b.stop({ dropWaitingJobs: true }).catch(() => {}) };
  },
};

/**
 * The largest excess over capacity + floor(rate·(t_j - t_i)) among all windows [t_i, t_j].
 * SLACK_MS widens each window for the times read after the admission (Bottleneck's) and for
 * the rounding of nanoseconds to float milliseconds.
 */
const SLACK_MS = 0.1;
function worstWindow(times, capacity, perSecond) {
  let worst = -Infinity;
  for (let i = 0; i < times.length; i++) {
    for (let j = i; j < times.length; j++) {
      const excess = (j - i + 1) - (capacity + Math.floor((perSecond * (times[j] - times[i] + SLACK_MS)) / 1000));
      if (excess > worst) worst = excess;
    }
  }
  return worst;
}

async function latenessRound() {
  const results = {};
  for (const [name, make] of Object.entries(LATENESS)) {
    global.gc();
    await settle();
    const l = make();
    const times = [];
    const t0 = performance.now();
    const end = t0 + LATE_SECONDS * 1000;
    for (let i = 0; i < PER_SECOND * LATE_SECONDS * 2; i++) {
      l.queued(() => {
        if (performance.now() < end) times.push(l.at());
      }).catch(() => {});
    }
    await new Promise((r) => setTimeout(r, end - performance.now() + 5));
    l.close();
    const T = (times[times.length - 1] - times[0]) / 1000;
    results[name] = {
      perSecond: (times.length - 1) / T,
      admitted: times.length,
      worst: worstWindow(times, l.capacity, PER_SECOND),
    };
  }
  return results;
}

// === main ===

if (NEWKEY_CHILD) {
  const [name, maxKeys, round] = args.slice(args.indexOf('--newkey-child') + 1);
  process.send(await newKeyRound(NEWKEY[name], Number(maxKeys), Number(round)), () => process.exit(0));
  await new Promise(() => {});
}

const report = { node: process.version, rounds: ROUNDS, overhead: {}, memory: {}, accuracy: {}, newkey: {}, lateness: {} };

if (ONLY.has('overhead')) {
  const samples = Object.fromEntries(Object.keys(OVERHEAD).map((k) => [k, []]));
  await overheadRound(OVERHEAD['sluice RateLimiter.schedule']); // warm-up of the shared paths
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, make] of Object.entries(OVERHEAD)) samples[name].push(await overheadRound(make, OVERHEAD_N[name]));
  }
  for (const [name, xs] of Object.entries(samples)) report.overhead[name] = stats(xs);
}

if (ONLY.has('memory')) {
  const samples = Object.fromEntries(Object.keys(MEMORY).map((k) => [k, []]));
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, make] of Object.entries(MEMORY)) samples[name].push(await memoryRound(make));
  }
  for (const [name, xs] of Object.entries(samples)) report.memory[name] = stats(xs);
}

if (ONLY.has('accuracy')) {
  const rounds = Math.min(ROUNDS, 3);
  const samples = {};
  for (let r = 0; r < rounds; r++) {
    for (const [name, res] of Object.entries(await accuracyRound())) (samples[name] ??= []).push(res);
  }
  for (const [name, rs] of Object.entries(samples)) {
    report.accuracy[name] = { ...stats(rs.map((x) => x.excess)), rounds: rs };
  }
}

if (ONLY.has('newkey')) {
  const rounds = Math.min(ROUNDS, 3);
  for (const maxKeys of MAX_KEYS) {
    const samples = Object.fromEntries(Object.keys(NEWKEY).map((k) => [k, []]));
    for (let r = 0; r < rounds; r++) {
      for (const name of Object.keys(NEWKEY)) samples[name].push(await newKeyRoundApart(name, maxKeys, r));
    }
    report.newkey[maxKeys] = Object.fromEntries(Object.entries(samples).map(([k, xs]) => [k, stats(xs)]));
  }
}

if (ONLY.has('lateness')) {
  const rounds = Math.min(ROUNDS, 3);
  const samples = {};
  for (let r = 0; r < rounds; r++) {
    for (const [name, res] of Object.entries(await latenessRound())) (samples[name] ??= []).push(res);
  }
  for (const [name, rs] of Object.entries(samples)) {
    report.lateness[name] = { ...stats(rs.map((x) => x.perSecond)), worst: Math.max(...rs.map((x) => x.worst)), rounds: rs };
  }
}

if (JSON_OUT) {
  console.log(JSON.stringify(report, null, 2));
} else {
  console.log(`node ${report.node}, ${ROUNDS} rounds (median [min, max])`);
  if (ONLY.has('overhead')) {
    console.log(`\noverhead: ns per scheduled task (${N} no-op tasks at once)`);
    for (const [k, s] of Object.entries(report.overhead)) console.log(`  ${k.padEnd(40)} ${s.median.toFixed(0).padStart(7)}  [${s.min.toFixed(0)}, ${s.max.toFixed(0)}]${OVERHEAD_N[k] ? `  (${OVERHEAD_N[k]} tasks)` : ''}`);
  }
  if (ONLY.has('memory')) {
    console.log(`\nmemory: bytes per queued task (${N} waiting)`);
    for (const [k, s] of Object.entries(report.memory)) console.log(`  ${k.padEnd(40)} ${s.median.toFixed(0).padStart(7)}  [${s.min.toFixed(0)}, ${s.max.toFixed(0)}]`);
  }
  if (ONLY.has('accuracy')) {
    console.log(`\naccuracy: admitted in ${SECONDS} s at ${PER_SECOND}/s, burst ${CAPACITY}, minus the bound ${CAPACITY} + ${PER_SECOND}·T (> 0: over the limit)`);
    for (const [k, s] of Object.entries(report.accuracy)) {
      const detail = s.rounds.map((x) => `${x.admitted}/${x.bound}`).join(' ');
      console.log(`  ${k.padEnd(40)} ${String(s.median).padStart(5)}  [${s.min}, ${s.max}]  admitted/bound: ${detail}`);
    }
  }
  if (ONLY.has('newkey')) {
    console.log(`\nnewkey: ns per new key with the table full (median of ${NEW_KEYS / 100} batches of 100 per round; median of rounds [min, max])`);
    for (const [maxKeys, row] of Object.entries(report.newkey)) {
      for (const [k, s] of Object.entries(row)) console.log(`  maxKeys ${String(maxKeys).padStart(6)}  ${k.padEnd(46)} ${s.median.toFixed(0).padStart(7)}  [${s.min.toFixed(0)}, ${s.max.toFixed(0)}]`);
    }
  }
  if (ONLY.has('lateness')) {
    console.log(`\nlateness: tasks started per second over ${LATE_SECONDS} s at ${PER_SECOND}/s, a queue kept full (worst window: admissions above capacity + rate·(t + ${SLACK_MS} ms) in any window, on sluice's clock; > 0 is over the bound)`);
    for (const [k, s] of Object.entries(report.lateness)) {
      console.log(`  ${k.padEnd(40)} ${s.median.toFixed(1).padStart(6)}/s  [${s.min.toFixed(1)}, ${s.max.toFixed(1)}]  worst window ${s.worst}`);
    }
  }
}
process.exit(0);
