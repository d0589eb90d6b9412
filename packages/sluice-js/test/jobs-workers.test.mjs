// The job queue with worker processes on a real redis-server: a Node worker killed with
// SIGKILL mid-job loses no job; a group's bound held in every window across 4 workers, 2 Node
// processes and 2 Rust ones (the Rust crate's own worker, built by cargo from
// crates/sluice/tests/jobs_redis.rs); fairness between a group of 10,000 jobs and one of 10;
// weighted costs; Retry-After and rate-limit fields from a stand-in API on 127.0.0.1.
//
// The bound is checked on the time Redis admitted each job (the job's `st`, ns): for a GCRA
// bucket of capacity C and interval I, any n jobs (or n tokens) admitted between two
// admissions T apart are at most C + floor(T / I). No slack for clocks: one clock decides.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import { join } from 'node:path';

import { createClient } from 'redis';
import { JobQueue, Worker } from '../src/index.js';
import { CI, PACKAGE, ROOT, missing, startRedis, which } from './support.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(fn, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what} did not hold within ${ms} ms`);
    await sleep(20);
  }
}

/**
 * The Rust worker: the helper test `helper_jobs_bound` of crates/sluice/tests/jobs_redis.rs,
 * which runs a `sluice::jobs::Worker` (3 slots, jobs of 5 ms) on the queue `SLUICE_QUEUE`,
 * limited by gcra `SLUICE_CAPACITY` per `SLUICE_RATE` at the bucket prefix `SLUICE_BUCKETS`,
 * for `SLUICE_RUN_MS`, then prints `COMPLETED <n>`. Built once with cargo: its path, or null
 * where cargo is missing (CI=true: a failure).
 */
let rustWorker;
function rustWorkerBin() {
  if (rustWorker !== undefined) return rustWorker;
  rustWorker = null;
  if (!which('cargo')) {
    if (CI) throw new Error('cargo is missing (the Rust worker of the two-language test); CI=true, so this fails');
    return null;
  }
  const r = spawnSync('cargo', ['test', '-q', '-p', 'sluice', '--test', 'jobs_redis', '--no-run', '--message-format=json'], {
    cwd: ROOT, encoding: 'utf8', maxBuffer: 1 << 28, stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (r.status !== 0) throw new Error('cargo test -p sluice --test jobs_redis --no-run failed');
  for (const line of r.stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    const m = JSON.parse(line);
    if (m.reason === 'compiler-artifact' && m.target?.name === 'jobs_redis' && m.executable) rustWorker = m.executable;
  }
  if (rustWorker === null) throw new Error('cargo built no jobs_redis test binary');
  return rustWorker;
}

/** A Rust worker process (see rustWorkerBin), running `runMs`: { child, name, done } (done: its completed jobs). */
function startRustWorker(url, queue, name, limit, runMs) {
  const child = spawn(rustWorkerBin(), ['helper_jobs_bound', '--exact', '--nocapture', '--test-threads', '1'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: {
      ...process.env, SLUICE_HELPER: name, SLUICE_REDIS_URL: url, SLUICE_QUEUE: queue, SLUICE_BUCKETS: limit.prefix,
      SLUICE_CAPACITY: String(limit.capacity), SLUICE_RATE: limit.rate, SLUICE_RUN_MS: String(runMs),
    },
  });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const done = new Promise((resolve, reject) => child.once('exit', (code) => {
    if (code !== 0) return reject(new Error(`the Rust worker ${name} exited with ${code}`));
    resolve([...out.matchAll(/^COMPLETED (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0));
  }));
  return { child, name, done, kill: () => child.kill('SIGKILL') };
}

/**
 * A worker process ('node': test/jobs-worker.mjs; 'rust': the example), running until
 * stopped: { child, name, stop() (SIGTERM, resolves on exit), kill() (SIGKILL) }.
 */
async function startWorker(kind, url, queue, options) {
  const child = spawn(process.execPath, [join(PACKAGE, 'test', 'jobs-worker.mjs'), url, queue, JSON.stringify(options)], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((r) => child.once('exit', r));
  await new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      if (out.includes('ready')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`the ${kind} worker ${options.name} exited with ${code} before it was ready`)));
  });
  return {
    child,
    name: options.name,
    stop: () => {
      child.kill('SIGTERM');
      return exited;
    },
    kill: () => {
      child.kill('SIGKILL');
      return exited;
    },
  };
}

async function withRedis(t, fn) {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  const workers = [];
  try {
    await fn(client, redis, workers);
  } finally {
    await Promise.all(workers.map((w) => (w.child.exitCode === null && w.child.signalCode === null ? w.kill() : null)));
    await Promise.all(workers.map((w) => w.done?.catch(() => {})));
    await client.quit();
    await redis.close();
  }
}

const starts = async (client, record) => (await client.lRange(`${record}:starts`, 0, -1)).map((s) => JSON.parse(s));

/** The admission times (BigInt ns, Redis's clock) of `ids` of `group`, sorted, with costs. */
async function admissions(queue, group, ids) {
  const jobs = await Promise.all(ids.map((id) => queue.job(group, id)));
  for (const j of jobs) assert.ok(j && j.admittedAtNs !== null, 'every job was admitted and is kept');
  return jobs.map((j) => ({ at: j.admittedAtNs, cost: j.cost })).sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
}

/**
 * The worst excess over the GCRA bound, over every window between two admissions: tokens
 * admitted from the i-th to the j-th minus (capacity + floor((at_j - at_i) / interval)).
 * At most 0 when the bound held.
 */
function worstExcess(adm, capacity, intervalNs) {
  let worst = -Infinity;
  for (let i = 0; i < adm.length; i++) {
    let tokens = 0;
    for (let j = i; j < adm.length; j++) {
      tokens += adm[j].cost;
      const bound = capacity + Number((adm[j].at - adm[i].at) / intervalNs);
      worst = Math.max(worst, tokens - bound);
    }
  }
  return worst;
}

test('jobs: a Node worker killed with SIGKILL mid-job loses no job; only the jobs it held run again', (t) => withRedis(t, async (client, redis, workers) => {
  const queue = new JobQueue({ client, name: 'crash', visibilityTimeout: 1000 });
  const N = 20;
  for (let i = 0; i < N; i++) await queue.enqueue({ i }, { group: 'g', key: `k${i}` });
  // Enqueued again with the same keys: the same jobs, none added.
  for (let i = 0; i < 5; i++) assert.equal((await queue.enqueue({ i }, { group: 'g', key: `k${i}` })).added, false);
  const options = { record: 'r', visibilityTimeoutMs: 1000, concurrency: 3 };
  const doomed = await startWorker('node', redis.url, 'crash', { ...options, name: 'doomed', sleepMs: 600 });
  workers.push(doomed);
  await until(async () => (await starts(client, 'r')).length >= 3, 10000, 'three jobs running');
  await doomed.kill();
  const before = await starts(client, 'r');
  const doneBefore = new Set(await client.lRange('r:done', 0, -1));
  const held = before.filter((s) => !doneBefore.has(`g/${s.id}`)).map((s) => s.id);
  assert.ok(held.length >= 1, 'the worker was killed while it ran a job');
  assert.equal((await queue.stats('g')).active, held.length, 'their entries stay pending to the killed worker');

  const survivor = await startWorker('node', redis.url, 'crash', { ...options, name: 'survivor', sleepMs: 10 });
  workers.push(survivor);
  await until(async () => new Set(await client.lRange('r:done', 0, -1)).size === N, 20000, 'every job done');
  await survivor.stop();
  const all = await starts(client, 'r');
  const runs = new Map();
  for (const s of all) runs.set(s.id, [...(runs.get(s.id) ?? []), s]);
  assert.equal(runs.size, N, 'every job ran');
  for (const [id, r] of runs) {
    if (held.includes(id)) {
      assert.deepEqual(r.map((s) => [s.worker, s.attempt]), [['doomed', 1], ['survivor', 2]], `job ${id}, held by the killed worker, ran again once`);
    } else {
      assert.equal(r.length, 1, `job ${id} ran once`);
    }
  }
  const s = await queue.stats('g');
  assert.deepEqual([s.completed, s.reclaimed, s.active, s.waiting, s.dead], [N, held.length, 0, 0, 0]);
}));

test('jobs: a group\'s bound held in every window across 4 workers in two languages: 2 Node and 2 Rust processes', { timeout: 600000 }, (t) => withRedis(t, async (client, redis, workers) => {
  const rust = rustWorkerBin();
  if (!rust) t.diagnostic('cargo missing: 4 Node workers');
  const limit = { prefix: 'gw:embed', algorithm: 'gcra', capacity: 5, rate: '20/s' };
  const intervalNs = 50000000n;
  const queue = new JobQueue({ client, name: 'shared', limit });
  const groups = { k1: 80, k2: 40 };
  const ids = { k1: [], k2: [] };
  for (const [g, n] of Object.entries(groups)) {
    for (let i = 0; i < n; i++) ids[g].push((await queue.enqueue({ i }, { group: g })).id);
  }
  const started = performance.now();
  const rustWorkers = [];
  for (let i = 0; i < 2; i++) {
    if (rust) rustWorkers.push(startRustWorker(redis.url, 'shared', `rust-${i}`, limit, 8000));
    else workers.push(await startWorker('node', redis.url, 'shared', { record: 'b', name: `node-${i + 2}`, concurrency: 3, sleepMs: 5, limit }));
  }
  workers.push(...rustWorkers);
  for (let i = 0; i < 2; i++) {
    workers.push(await startWorker('node', redis.url, 'shared', { record: 'b', name: `node-${i}`, concurrency: 3, sleepMs: 5, limit }));
  }
  await until(async () => (await queue.stats('k1')).completed + (await queue.stats('k2')).completed === 120, 60000, 'every job done');
  const elapsed = performance.now() - started;
  const by = new Map();
  for (const s of await starts(client, 'b')) by.set(s.worker, (by.get(s.worker) ?? 0) + 1);
  for (const w of rustWorkers) by.set(w.name, await w.done);
  await Promise.all(workers.filter((w) => w.stop).map((w) => w.stop()));
  t.diagnostic(`jobs per worker: ${JSON.stringify(Object.fromEntries(by))}; ${elapsed.toFixed(0)} ms`);
  assert.equal([...by.values()].reduce((a, b) => a + b, 0), 120, 'each job ran once');
  assert.equal([...by.values()].filter((n) => n > 0).length, 4, 'every worker ran jobs');
  for (const g of Object.keys(groups)) {
    const adm = await admissions(queue, g, ids[g]);
    const excess = worstExcess(adm, limit.capacity, intervalNs);
    const span = Number(adm.at(-1).at - adm[0].at) / 1e6;
    t.diagnostic(`${g}: ${adm.length} jobs admitted over ${span.toFixed(0)} ms, worst window ${excess} against the bound`);
    assert.ok(excess <= 0, `group ${g}: a window held ${excess} more than capacity + rate x T`);
    // Not starved either: the bound is reached (80 jobs at 20/s after a burst of 5: 3.75 s).
    const least = ((groups[g] - limit.capacity) * 50);
    assert.ok(span >= least - 1 && span <= least + 1500, `group ${g} took ${span.toFixed(0)} ms, the rate allows ${least}`);
  }
}));

test('jobs: fairness: a group with 10,000 queued jobs does not delay a group with 10 beyond its own rate', { timeout: 120000 }, (t) => withRedis(t, async (client) => {
  const limit = { prefix: 'api', algorithm: 'gcra', capacity: 1, rate: '20/s' };
  const queue = new JobQueue({ client, name: 'fair', limit });
  for (let i = 0; i < 10000; i += 500) {
    await queue.enqueueMany(Array.from({ length: 500 }, (_, j) => ({ data: { i: i + j }, group: 'big' })));
  }
  assert.equal((await queue.stats('big')).waiting, 10000);
  const w = [1, 2].map((n) => new Worker(queue, async () => {}, { concurrency: 2, poll: 10, consumer: `fair-${n}` }));
  // The big group runs at its rate first; then the small group's 10 jobs arrive behind it.
  await until(async () => (await queue.stats('big')).completed >= 10, 5000, 'the big group under way');
  const enqueuedAt = BigInt(Date.now()) * 1000000n;
  const small = [];
  for (let i = 0; i < 10; i++) small.push((await queue.enqueue({ i }, { group: 'small' })).id);
  await until(async () => (await queue.stats('small')).completed === 10, 10000, 'the small group\'s jobs');
  const adm = await admissions(queue, 'small', small);
  const firstWait = Number(adm[0].at - enqueuedAt) / 1e6;
  const span = Number(adm.at(-1).at - adm[0].at) / 1e6;
  t.diagnostic(`small group: first start ${firstWait.toFixed(0)} ms after its enqueue, all 10 over ${span.toFixed(0)} ms (its own rate: 450 ms)`);
  assert.ok(firstWait < 300, `the small group's first job waited ${firstWait.toFixed(0)} ms`);
  assert.ok(span < 450 + 300, `the small group's 10 jobs took ${span.toFixed(0)} ms; at its own rate 450`);
  const big = await queue.stats('big');
  assert.ok(big.waiting > 9000, `the big group still holds ${big.waiting}`);
  await Promise.all(w.map((x) => x.close()));
  await queue.purge();
}));

test('jobs: weighted costs: tokens admitted in every window within the bucket, across workers', { timeout: 120000 }, (t) => withRedis(t, async (client, redis, workers) => {
  const limit = { prefix: 'llm', algorithm: 'gcra', capacity: 1000, rate: '4000/s' };
  const intervalNs = 250000n;
  const queue = new JobQueue({ client, name: 'weighted', limit });
  const ids = [];
  let total = 0;
  let x = 7;
  for (let i = 0; i < 40; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    const cost = 100 + (x % 801);
    total += cost;
    ids.push((await queue.enqueue({ i }, { group: 'key', cost })).id);
  }
  for (const n of [0, 1]) workers.push(await startWorker('node', redis.url, 'weighted', { record: 'w', name: `w${n}`, concurrency: 2, limit }));
  await until(async () => (await client.lLen('w:done')) === 40, 30000, 'every job done');
  await Promise.all(workers.map((w) => w.stop()));
  const adm = await admissions(queue, 'key', ids);
  const excess = worstExcess(adm, limit.capacity, intervalNs);
  const span = Number(adm.at(-1).at - adm[0].at) / 1e6;
  const least = (total - limit.capacity - adm.at(-1).cost) / 4;
  t.diagnostic(`${total} tokens in 40 jobs over ${span.toFixed(0)} ms; worst window ${excess} tokens against the bound`);
  assert.ok(excess <= 0, `a window held ${excess} tokens more than capacity + rate x T`);
  assert.ok(span >= least - 1 && span <= least + 2000, `took ${span.toFixed(0)} ms; the rate allows ${least.toFixed(0)}`);
}));

test('jobs: a failure with Retry-After or exhausted rate-limit fields from a stand-in API is retried after what it said, its group paused', { timeout: 60000 }, (t) => withRedis(t, async (client) => {
  // The stand-in: the first call of each job is refused, in the style of its group.
  const calls = [];
  const seen = new Set();
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x');
    const job = url.searchParams.get('job');
    const style = url.searchParams.get('style');
    calls.push({ job, style, at: performance.now() });
    if (!seen.has(job)) {
      seen.add(job);
      if (style === 'retry-after') res.writeHead(429, { 'retry-after': '1' });
      else res.writeHead(429, { 'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '700ms' });
      return res.end();
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${server.address().port}/`;
  try {
    const queue = new JobQueue({ client, name: 'api' });
    const retried = [];
    const worker = new Worker(queue, async (job) => {
      const res = await fetch(`${base}?job=${job.group}/${job.id}&style=${job.group}`);
      await res.arrayBuffer();
      if (!res.ok) throw Object.assign(new Error(`HTTP ${res.status}`), { response: res });
      return res.status;
    }, { poll: 5, backoff: { base: 1, cap: 1 } });
    worker.on('retried', (d) => retried.push(d));
    for (const group of ['retry-after', 'openai']) {
      for (let i = 0; i < 3; i++) await queue.enqueue({ i }, { group });
    }
    await until(async () => (await queue.stats('retry-after')).completed === 3 && (await queue.stats('openai')).completed === 3, 20000, 'every job done');
    await worker.close();
    for (const [group, waitMs] of [['retry-after', 1000], ['openai', 700]]) {
      const mine = calls.filter((c) => c.style === group);
      const refused = new Map();
      for (const c of mine) if (!refused.has(c.job)) refused.set(c.job, c.at);
      for (const [job, at] of refused) {
        const again = mine.find((c) => c.job === job && c.at > at);
        assert.ok(again, `job ${job} was called again`);
        const gap = again.at - at;
        t.diagnostic(`${group} ${job}: called again ${gap.toFixed(0)} ms after its ${waitMs} ms answer`);
        assert.ok(gap >= waitMs - 5 && gap < waitMs + 600, `${group} ${job}: called again after ${gap.toFixed(0)} ms, the server said ${waitMs}`);
        // The whole group paused: no call of the group between the refusal and its end.
        const during = mine.filter((c) => c.at > at + 5 && c.at < at + waitMs - 5);
        assert.deepEqual(during, [], `${group}: calls while the group was paused after ${job}'s refusal`);
      }
    }
    assert.equal(retried.length, 6);
    for (const r of retried) assert.equal(r.pausedMs, r.job.group === 'openai' ? 700 : 1000);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}));
