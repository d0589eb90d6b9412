// Durable jobs on Redis: sluice-limits' JobQueue and Worker beside BullMQ, in one run, on one
// redis-server (127.0.0.1, a free port, started here).
//
// Each round measures, for sluice and for BullMQ in turns (the order alternates by round), with
// Redis flushed before each:
//
//   throughput  --jobs no-op jobs queued first, then 4 worker processes (each running
//               --concurrency jobs at once) told to start together: jobs per second from that
//               moment to the last completion, and Redis commands per job (the delta of the
//               calls in INFO commandstats over the run, commands run by scripts included,
//               divided by the jobs). Three limits:
//                 none    no limit
//                 global  one limit on the whole queue, --global-rate jobs per second
//                         (BullMQ: `limiter: { max, duration: 1000 }`; sluice: a fixed window of
//                         the same size, the closest to BullMQ's counter)
//                 groups  100 groups, each limited to --group-rate jobs per second (a GCRA
//                         bucket of capacity --group-burst); jobs spread evenly. BullMQ's
//                         open-source edition has no group limits: sluice only, with the
//                         bound checked on the start times: the most starts of one group in
//                         any window of length W, against burst + rate x W
//   latency     the 4 workers idle and waiting; --latency-rate jobs per second enqueued one by
//               one for --latency-seconds: the time from each enqueue to its handler's start
//               (median, p99), measured with one wall clock (performance.timeOrigin + now())
//
//   cd benches/js && npm ci && node jobs.mjs [--rounds 5] [--jobs 20000] [--concurrency 8] [--json]

import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { Redis } from 'ioredis';
import { Queue as BullQueue, Worker as BullWorker } from 'bullmq';

import { JobQueue, Worker as SluiceWorker } from '../../packages/sluice-js/src/index.js';
import { startRedis } from '../../packages/sluice-js/test/support.mjs';

const args = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
};

const SELF = fileURLToPath(import.meta.url);
const WORKERS = 4;
const GROUPS = 100;
const QUEUE = 'bench';
const now = () => performance.timeOrigin + performance.now();

/**
 * sluice's limit of a scenario (a queue option every worker and producer shares): the global
 * limit is one group's bucket, a fixed window as BullMQ's counter; each of the 100 groups a
 * GCRA bucket.
 */
function sluiceLimit(limit, globalRate, groupRate, groupBurst) {
  if (limit === 'global') return { prefix: 'bench', algorithm: 'fixed_window', capacity: globalRate, rate: `${globalRate}/s` };
  if (limit === 'groups') return { prefix: 'bench', algorithm: 'gcra', capacity: groupBurst, rate: `${groupRate}/s` };
  return null;
}

// === A worker process: `node jobs.mjs --role worker` (forked by the main process) ===

if (flag('--role') === 'worker') {
  const port = Number(flag('--port'));
  const system = flag('--system');
  const limit = flag('--limit');
  const concurrency = Number(flag('--concurrency'));
  const globalRate = Number(flag('--global-rate'));
  const groupRate = Number(flag('--group-rate'));
  const groupBurst = Number(flag('--group-burst'));
  const timing = flag('--timing') === '1';
  let done = 0;
  let starts = [];
  const started = (job) => {
    if (timing) starts.push([job.group ?? '', job.t, now()]);
  };
  const report = setInterval(() => {
    if (done || starts.length) process.send({ done, starts });
    done = 0;
    starts = [];
  }, 20);
  let close;
  if (system === 'bullmq') {
    const connection = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
    const options = { connection, concurrency, autorun: false, removeOnComplete: { count: 0 }, removeOnFail: { count: 0 } };
    if (limit === 'global') options.limiter = { max: globalRate, duration: 1000 };
    const worker = new BullWorker(QUEUE, async (job) => {
      started({ group: job.data.g, t: job.data.t });
      done++;
    }, options);
    await worker.waitUntilReady();
    close = async () => {
      await worker.close();
      connection.disconnect();
    };
    process.on('message', (m) => {
      if (m === 'go') worker.run();
    });
  } else {
    const client = new Redis({ host: '127.0.0.1', port });
    const queue = new JobQueue({ client, name: QUEUE, limit: sluiceLimit(limit, globalRate, groupRate, groupBurst), keepCompleted: 0 });
    const worker = new SluiceWorker(queue, async (job) => {
      started({ group: job.group, t: job.data.t });
      done++;
    }, { concurrency, autorun: false });
    close = async () => {
      await worker.close();
      client.disconnect();
    };
    process.on('message', (m) => {
      if (m === 'go') worker.run();
    });
  }
  process.on('message', async (m) => {
    if (m !== 'stop') return;
    clearInterval(report);
    process.send({ done, starts, last: true });
    await close();
    process.exit(0);
  });
  process.send('ready');
} else {
  await main();
}

// === The main process ===

async function main() {
  const ROUNDS = Number(flag('--rounds', 5));
  const JOBS = Number(flag('--jobs', 20000));
  const CONCURRENCY = Number(flag('--concurrency', 8));
  const GLOBAL_RATE = Number(flag('--global-rate', 2000));
  const GROUP_RATE = Number(flag('--group-rate', 20));
  const GROUP_BURST = Number(flag('--group-burst', 5));
  const GROUP_JOBS = Number(flag('--group-jobs', 10000));
  const LATENCY_RATE = Number(flag('--latency-rate', 200));
  const LATENCY_SECONDS = Number(flag('--latency-seconds', 5));
  const JSON_OUT = args.includes('--json');
  const ONLY = flag('--only', 'none,global,groups,latency').split(',');
  const log = (...a) => {
    if (!JSON_OUT) console.log(...a);
  };

  const redis = await startRedis();
  const admin = new Redis({ host: '127.0.0.1', port: redis.port });

  /** The calls of every command so far (INFO commandstats), and of those sent by clients. */
  async function commandCalls() {
    const info = await admin.info('commandstats');
    let calls = 0;
    const by = {};
    for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
      calls += Number(m[2]);
      by[m[1]] = Number(m[2]);
    }
    return { calls, by };
  }

  /** Calls per job between two readings: all (commands run by scripts included), and the scripts. */
  function perJob(c0, c1, n) {
    const d = (k) => ((c1.by[k] ?? 0) - (c0.by[k] ?? 0)) / n;
    return { all: (c1.calls - c0.calls - 1) / n, evalsha: d('evalsha') + d('eval') };
  }

  /** Redis's CPU time so far (user + system), in ms. */
  async function redisCpuMs() {
    const info = await admin.info('cpu');
    const f = (k) => Number(new RegExp(`^${k}:([\\d.]+)`, 'm').exec(info)[1]);
    return (f('used_cpu_user') + f('used_cpu_sys')) * 1000;
  }

  /** Starts the 4 workers; resolves once each said it is ready. */
  async function workers(system, limit, timing) {
    const children = [];
    const counts = { done: 0, starts: [], last: 0 };
    for (let i = 0; i < WORKERS; i++) {
      const child = fork(SELF, [
        '--role', 'worker', '--system', system, '--limit', limit, '--port', String(redis.port),
        '--concurrency', String(CONCURRENCY), '--global-rate', String(GLOBAL_RATE),
        '--group-rate', String(GROUP_RATE), '--group-burst', String(GROUP_BURST), '--timing', timing ? '1' : '0',
      ], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      const ready = new Promise((resolve, reject) => {
        child.once('exit', (code) => reject(new Error(`a ${system} worker exited with ${code}`)));
        child.on('message', (m) => {
          if (m === 'ready') return resolve();
          counts.done += m.done;
          for (const s of m.starts) counts.starts.push(s);
          if (m.last) counts.last++;
          counts.onChange?.();
        });
      });
      children.push({ child, ready });
    }
    await Promise.all(children.map((c) => c.ready));
    return {
      counts,
      go: () => children.forEach((c) => c.child.send('go')),
      stop: async () => {
        const exited = children.map((c) => new Promise((r) => c.child.once('exit', r)));
        children.forEach((c) => c.child.send('stop'));
        await Promise.all(exited);
      },
      /** Resolves once `n` jobs are done: the moment it saw the last. */
      until: (n) => new Promise((resolve) => {
        const check = () => {
          if (counts.done >= n) {
            counts.onChange = null;
            resolve(now());
          }
        };
        counts.onChange = check;
        check();
      }),
    };
  }

  /** Queues `n` jobs (`groups` > 0: spread over that many groups) in bulk. */
  async function fill(system, n, groups) {
    const t = now();
    if (system === 'bullmq') {
      const queue = new BullQueue(QUEUE, { connection: { host: '127.0.0.1', port: redis.port } });
      for (let i = 0; i < n; i += 1000) {
        const batch = [];
        for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ name: 'j', data: { t, g: groups ? `g${j % groups}` : '' } });
        await queue.addBulk(batch);
      }
      await queue.close();
    } else {
      const client = new Redis({ host: '127.0.0.1', port: redis.port });
      const queue = new JobQueue({ client, name: QUEUE, keepCompleted: 0 });
      for (let i = 0; i < n; i += 1000) {
        const batch = [];
        for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ data: { t }, group: groups ? `g${j % groups}` : 'default' });
        await queue.enqueueMany(batch);
      }
      client.disconnect();
    }
    return now() - t;
  }

  /** The most starts of one group in any window of `windowMs` and its bound, worst over groups. */
  function worstWindow(starts, rate, burst, windowMs) {
    const byGroup = new Map();
    for (const [g, , at] of starts) {
      if (!byGroup.has(g)) byGroup.set(g, []);
      byGroup.get(g).push(at);
    }
    let over = -Infinity;
    let most = 0;
    for (const times of byGroup.values()) {
      times.sort((a, b) => a - b);
      let j = 0;
      for (let i = 0; i < times.length; i++) {
        while (times[i] - times[j] > windowMs) j++;
        const n = i - j + 1;
        most = Math.max(most, n);
        over = Math.max(over, n - (burst + Math.floor((rate * windowMs) / 1000)));
      }
    }
    return { most, over };
  }

  async function throughput(system, limit) {
    await admin.flushall();
    const n = limit === 'groups' ? GROUP_JOBS : JOBS;
    const fillMs = await fill(system, n, limit === 'groups' ? GROUPS : 0);
    const w = await workers(system, limit, limit !== 'none');
    const calls0 = await commandCalls();
    const cpu0 = await redisCpuMs();
    const t0 = now();
    w.go();
    const t1 = await w.until(n);
    const calls1 = await commandCalls();
    const cpu1 = await redisCpuMs();
    await w.stop();
    const out = {
      system, limit, jobs: n, perSecond: (n * 1000) / (t1 - t0), commandsPerJob: perJob(calls0, calls1, n).all, scriptsPerJob: perJob(calls0, calls1, n).evalsha,
      redisCpuUsPerJob: ((cpu1 - cpu0) * 1000) / n, redisBusy: (cpu1 - cpu0) / (t1 - t0), fillPerSecond: (n * 1000) / fillMs,
    };
    if (limit === 'groups') {
      // The bound of every group in windows of 1 s and of 100 ms (jitter of the clocks included).
      out.window1s = worstWindow(w.counts.starts, GROUP_RATE, GROUP_BURST, 1000);
      out.window100ms = worstWindow(w.counts.starts, GROUP_RATE, GROUP_BURST, 100);
    } else if (limit === 'global') {
      const all = w.counts.starts.map(([, t, at]) => ['', t, at]);
      out.window1s = worstWindow(all, GLOBAL_RATE, GLOBAL_RATE, 1000);
    }
    return out;
  }

  async function latency(system) {
    await admin.flushall();
    const w = await workers(system, 'none', true);
    w.go();
    let enqueue;
    let close;
    if (system === 'bullmq') {
      const queue = new BullQueue(QUEUE, { connection: { host: '127.0.0.1', port: redis.port } });
      await queue.waitUntilReady();
      enqueue = () => queue.add('j', { t: now(), g: '' }, { removeOnComplete: true });
      close = () => queue.close();
    } else {
      const client = new Redis({ host: '127.0.0.1', port: redis.port });
      const queue = new JobQueue({ client, name: QUEUE, keepCompleted: 0 });
      enqueue = () => queue.enqueue({ t: now() });
      close = () => client.disconnect();
    }
    // Idle workers first: whatever they do while waiting is part of what a job meets.
    await new Promise((r) => setTimeout(r, 300));
    const n = LATENCY_RATE * LATENCY_SECONDS;
    const start = now();
    for (let i = 0; i < n; i++) {
      const due = start + (i * 1000) / LATENCY_RATE;
      const wait = due - now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      await enqueue();
    }
    await w.until(n);
    await close();
    await w.stop();
    const lat = w.counts.starts.map(([, t, at]) => at - t).sort((a, b) => a - b);
    return { system, jobs: n, medianMs: lat[Math.floor(lat.length / 2)], p99Ms: lat[Math.floor(lat.length * 0.99)] };
  }

  const stats = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
  };

  const started = new Date().toISOString();
  const rounds = [];
  try {
    for (let r = 0; r < ROUNDS; r++) {
      const order = r % 2 === 0 ? ['sluice', 'bullmq'] : ['bullmq', 'sluice'];
      const round = [];
      for (const limit of ['none', 'global', 'groups'].filter((l) => ONLY.includes(l))) {
        for (const system of order) {
          if (limit === 'groups' && system === 'bullmq') continue;
          const x = await throughput(system, limit);
          round.push({ kind: 'throughput', ...x });
          log(`round ${r + 1} ${system} ${limit}: ${x.perSecond.toFixed(0)} jobs/s, ${x.commandsPerJob.toFixed(2)} commands/job (${x.scriptsPerJob.toFixed(2)} scripts), Redis CPU ${x.redisCpuUsPerJob.toFixed(0)} µs/job (busy ${(x.redisBusy * 100).toFixed(0)} %)`
            + (x.window1s ? `, worst 1 s window ${x.window1s.most} (over the bound by ${x.window1s.over})` : '')
            + (x.window100ms ? `, worst 100 ms window ${x.window100ms.most} (over by ${x.window100ms.over})` : ''));
        }
      }
      for (const system of ONLY.includes('latency') ? order : []) {
        const x = await latency(system);
        round.push({ kind: 'latency', ...x });
        log(`round ${r + 1} ${system} latency: median ${x.medianMs.toFixed(2)} ms, p99 ${x.p99Ms.toFixed(2)} ms`);
      }
      rounds.push(round);
    }
  } finally {
    admin.disconnect();
    await redis.close();
  }

  const summary = [];
  for (const limit of ['none', 'global', 'groups']) {
    for (const system of ['sluice', 'bullmq']) {
      const mine = rounds.map((round) => round.find((x) => x.kind === 'throughput' && x.system === system && x.limit === limit)).filter(Boolean);
      if (!mine.length) continue;
      summary.push({
        kind: 'throughput', system, limit, perSecond: stats(mine.map((x) => x.perSecond)),
        commandsPerJob: stats(mine.map((x) => x.commandsPerJob)), redisCpuUsPerJob: stats(mine.map((x) => x.redisCpuUsPerJob)),
        worstOver1s: mine[0].window1s ? Math.max(...mine.map((x) => x.window1s.over)) : null,
        worstOver100ms: mine[0].window100ms ? Math.max(...mine.map((x) => x.window100ms.over)) : null,
      });
    }
  }
  for (const system of ONLY.includes('latency') ? ['sluice', 'bullmq'] : []) {
    const mine = rounds.map((round) => round.find((x) => x.kind === 'latency' && x.system === system));
    summary.push({ kind: 'latency', system, medianMs: stats(mine.map((x) => x.medianMs)), p99Ms: stats(mine.map((x) => x.p99Ms)) });
  }
  const result = {
    started, finished: new Date().toISOString(), node: process.version, rounds: ROUNDS, jobs: JOBS, concurrency: CONCURRENCY,
    workers: WORKERS, globalRate: GLOBAL_RATE, groupRate: GROUP_RATE, groupBurst: GROUP_BURST, groupJobs: GROUP_JOBS, summary, raw: rounds,
  };
  if (JSON_OUT) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  const f = (s, d = 0) => `${s.median.toFixed(d)} (${s.min.toFixed(d)} to ${s.max.toFixed(d)})`;
  console.log(`\n${started} to ${result.finished}, Node ${process.version}, ${ROUNDS} rounds, ${WORKERS} workers x concurrency ${CONCURRENCY}`);
  for (const limit of ['none', 'global', 'groups'].filter((l) => ONLY.includes(l))) {
    const s = summary.find((x) => x.system === 'sluice' && x.limit === limit);
    const b = summary.find((x) => x.system === 'bullmq' && x.limit === limit);
    console.log(`throughput, limit ${limit}: sluice ${f(s.perSecond)} jobs/s, ${f(s.commandsPerJob, 2)} commands/job, Redis CPU ${f(s.redisCpuUsPerJob)} µs/job`
      + (b ? `; BullMQ ${f(b.perSecond)} jobs/s, ${f(b.commandsPerJob, 2)} commands/job, Redis CPU ${f(b.redisCpuUsPerJob)} µs/job; ratio ${(s.perSecond.median / b.perSecond.median).toFixed(2)}` : '; BullMQ: no group limits in its open-source edition')
      + (s.worstOver1s !== null ? `; sluice's worst window over the bound: ${s.worstOver1s} (1 s)` : '')
      + (s.worstOver100ms !== null ? `, ${s.worstOver100ms} (100 ms)` : '')
      + (b && b.worstOver1s !== null ? `; BullMQ's: ${b.worstOver1s} (1 s)` : ''));
  }
  const sl = summary.find((x) => x.kind === 'latency' && x.system === 'sluice');
  const bl = summary.find((x) => x.kind === 'latency' && x.system === 'bullmq');
  if (sl) console.log(`enqueue to start: sluice median ${f(sl.medianMs, 2)} ms, p99 ${f(sl.p99Ms, 2)} ms; BullMQ median ${f(bl.medianMs, 2)} ms, p99 ${f(bl.p99Ms, 2)} ms`);
}
