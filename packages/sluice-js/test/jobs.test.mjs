// The job queue (src/jobs.js) against a real redis-server, in this process: the layout of
// docs/jobs.md, idempotency keys, priorities, delays, the group's bucket shared with
// RedisStore, settled costs, backoff, dead letters, retryDead, purge, the breaker, events and
// metrics. The tests with worker processes are in jobs-workers.test.mjs.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { JobQueue, Worker, failureWaitMs } from '../src/index.js';
import { RedisStore } from '../src/redis.js';
import { JOB_ENQUEUE } from '../src/redis-scripts.generated.js';
import { missing, redisCli, startRedis, startRedisCluster, which } from './support.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Resolves once `fn()` is truthy (polled every 10 ms), or rejects after `ms`. */
async function until(fn, ms = 10000, what = 'the condition') {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what} did not hold within ${ms} ms`);
    await sleep(10);
  }
}

async function withRedis(t, fn) {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    await fn(client, redis);
  } finally {
    await client.quit();
    await redis.close();
  }
}

test('jobs: the keys of docs/jobs.md, idempotency keys, priorities within a group, delays', (t) => withRedis(t, async (client) => {
  const queue = new JobQueue({ client, name: 'mail', limit: { prefix: 'api', algorithm: 'gcra', capacity: 100, rate: '100/s' } });
  assert.deepEqual(queue.groupKeys('k7'), [
    'api:{k7}', 'sluice:jobs:mail:{k7}:jobs', 'sluice:jobs:mail:{k7}:wait', 'sluice:jobs:mail:{k7}:delayed',
    'sluice:jobs:mail:{k7}:active', 'sluice:jobs:mail:{k7}:dead', 'sluice:jobs:mail:{k7}:meta', 'sluice:jobs:mail:{k7}:done',
    'sluice:jobs:mail:{k7}:idem',
  ]);
  assert.deepEqual(queue.queueKeys(), ['ready', 'later', 'marks', 'turn', 'groups', 'sweep'].map((k) => `sluice:jobs:{mail}:${k}`));
  // Without a limit, key 1 is a key no script touches, in the group's slot.
  assert.equal(new JobQueue({ client, name: 'mail' }).groupKeys('k7')[0], 'sluice:jobs:mail:nolimit:{k7}');
  assert.throws(() => queue.groupKeys('a{b}'), /brace/);
  await assert.rejects(queue.enqueue({}, { group: 'k7', priority: 1001 }), RangeError);
  await assert.rejects(queue.enqueue({}, { group: 'k7', maxAttempts: 0 }), RangeError);

  const first = await queue.enqueue({ to: 'a@example.com' }, { group: 'k7', key: 'welcome-a' });
  const again = await queue.enqueue({ to: 'a@example.com' }, { group: 'k7', key: 'welcome-a' });
  assert.deepEqual([first.added, again.added, again.id], [true, false, first.id]);
  await queue.enqueue({ n: 'low' }, { group: 'k7', priority: 0 });
  await queue.enqueue({ n: 'high' }, { group: 'k7', priority: 10 });
  await queue.enqueue({ n: 'later' }, { group: 'k7', delay: 300, priority: 1000 });
  const stats = await queue.stats('k7');
  assert.equal(stats.waiting, 3);
  assert.equal(stats.delayed, 1);
  assert.equal(stats.enqueued, 4);
  assert.deepEqual(await queue.groups(), ['k7']);
  assert.equal((await queue.job('k7', first.id)).state, 'waiting');
  assert.deepEqual(JSON.parse((await queue.job('k7', first.id)).payload), { to: 'a@example.com' });

  const order = [];
  const t0 = Date.now();
  const worker = new Worker(queue, async (job) => {
    order.push([job.data.n ?? job.data.to, Date.now() - t0]);
  }, { poll: 10 });
  await until(async () => (await queue.stats('k7')).completed === 4, 5000, 'four completions');
  await worker.close();
  assert.deepEqual(order.map(([n]) => n), ['high', 'a@example.com', 'low', 'later'], 'priority first, then enqueue order; the delayed job last');
  assert.ok(order[3][1] >= 250, `the delayed job started after ${order[3][1]} ms`);
  // Completed jobs are kept (a day by default) with their idempotency keys.
  assert.equal((await queue.enqueue({}, { group: 'k7', key: 'welcome-a' })).added, false);
  assert.equal((await queue.job('k7', first.id)).state, 'done');
  assert.deepEqual(worker.metrics().k7, { active: 0, completed: 4, failed: 0, retried: 0, dead: 0, reclaimed: 0, lost: 0 });
}));

test('jobs: the group\'s limit is RedisStore\'s bucket for the same prefix and key, its cost weighed and settled', (t) => withRedis(t, async (client) => {
  const limit = { prefix: 'llm', algorithm: 'gcra', capacity: 1000, rate: '1000/s' };
  const queue = new JobQueue({ client, name: 'embed', limit, maxDebt: 5000 });
  const store = new RedisStore({ client, prefix: 'llm', algorithm: 'gcra', capacity: 1000, rate: '1000/s' });
  // The store spends 900 of key k's 1000 tokens: a job costing 500 waits for 400 of refill.
  assert.equal((await store.check('k', 900)).allowed, true);
  await queue.enqueue({ text: 'x' }, { group: 'k', cost: 500 });
  const starts = [];
  const t0 = performance.now();
  const worker = new Worker(queue, async (job) => {
    starts.push(performance.now() - t0);
    // It used 3,000 tokens, not the 500 it was admitted with: the bucket owes 2,500.
    job.settle(3000);
  }, { poll: 5 });
  await until(async () => (await queue.stats('k')).completed === 1, 5000, 'the first job');
  assert.ok(starts[0] >= 330, `started ${starts[0].toFixed(0)} ms after the store spent 900 of 1000 (400 to refill at 1/ms)`);
  const d = await store.check('k', 0);
  assert.equal(d.allowed, false, 'the bucket is in debt after the settled charge');
  assert.ok(d.retryAfterMs > 2000 && d.retryAfterMs <= 2600, `the store waits ${d.retryAfterMs} ms for the debt`);
  // A job above the capacity can never be admitted: dead-lettered at its claim.
  const dead = [];
  worker.on('dead', ({ job }) => dead.push(job.id));
  const huge = await queue.enqueue({}, { group: 'k', cost: 1001 });
  await until(() => dead.length === 1, 5000, 'the costly job dead-lettered');
  assert.equal(dead[0], huge.id);
  assert.match((await queue.deadLetters('k'))[0].error, /above the limit's capacity 1000/);
  await worker.close();
}));

test('jobs: backoff with jitter, dead letters after the last attempt, retryDead, purge, the breaker, events', (t) => withRedis(t, async (client) => {
  const queue = new JobQueue({ client, name: 'q' });
  let fail = true;
  const attempts = [];
  const events = [];
  const worker = new Worker(queue, async (job) => {
    attempts.push([job.id, job.attempt, performance.now()]);
    if (fail) throw new Error(`down (attempt ${job.attempt})`);
  }, { poll: 5, backoff: { base: 200, cap: 1000 }, breaker: { failureThreshold: 100 } });
  for (const type of ['active', 'completed', 'failed', 'retried', 'dead']) worker.on(type, () => events.push(type));
  const { id } = await queue.enqueue({}, { group: 'g', maxAttempts: 3 });
  await until(async () => (await queue.stats('g')).dead === 1, 8000, 'the dead letter');
  assert.deepEqual(attempts.map(([, a]) => a), [1, 2, 3]);
  // Full jitter: waits in [0, 200] then [0, 400] ms (plus the poll).
  const waits = [attempts[1][2] - attempts[0][2], attempts[2][2] - attempts[1][2]];
  assert.ok(waits[0] <= 200 + 150 && waits[1] <= 400 + 150, `waits ${waits.map((w) => w.toFixed(0))}`);
  const [letter] = await queue.deadLetters('g');
  assert.deepEqual([letter.id, letter.attempts], [id, 3]);
  assert.match(letter.error, /after 3 attempts: down \(attempt 3\)/);
  assert.deepEqual(events.filter((e) => e !== 'active'), ['failed', 'retried', 'failed', 'retried', 'failed', 'dead']);
  const s = await queue.stats('g');
  assert.deepEqual([s.failed, s.retried, s.deadLettered, s.dead], [3, 2, 1, 1]);

  // retryDead: back to wait, attempts afresh; it completes now.
  fail = false;
  assert.equal(await queue.retryDead('g'), 1);
  await until(async () => (await queue.stats('g')).completed === 1, 5000, 'the retried job');
  assert.equal(attempts.at(-1)[1], 1);
  await worker.close();

  // A permanent error goes to the dead letters at once.
  const w2 = new Worker(queue, async () => {
    throw Object.assign(new Error('bad input'), { permanent: true });
  }, { poll: 5 });
  await queue.enqueue({}, { group: 'p', maxAttempts: 5 });
  await until(async () => (await queue.stats('p')).dead === 1, 5000, 'the permanent failure');
  assert.equal((await queue.stats('p')).retried, 0);
  await w2.close();

  // The breaker: 2 failures in a row open it; this worker takes none of the group's jobs
  // while it is open, and jobs of other groups still run.
  const ran = [];
  const w3 = new Worker(queue, async (job) => {
    ran.push([job.group, performance.now()]);
    if (job.group === 'flaky') throw new Error('503');
  }, { poll: 5, backoff: { base: 1, cap: 1 }, breaker: { failureThreshold: 2, resetTimeout: 800 } });
  const states = [];
  w3.on('breaker', ({ group, state }) => states.push(`${group}:${state}`));
  for (let i = 0; i < 4; i++) await queue.enqueue({}, { group: 'flaky', maxAttempts: 10 });
  await until(() => states.includes('flaky:open'), 5000, 'the breaker opening');
  const opened = performance.now();
  await queue.enqueue({}, { group: 'fine' });
  await until(() => ran.some(([g]) => g === 'fine'), 2000, 'the other group\'s job');
  await until(() => ran.filter(([g]) => g === 'flaky').length > 2, 5000, 'a trial after the reset');
  const trial = ran.filter(([g]) => g === 'flaky')[2][1];
  assert.ok(trial - opened >= 700, `the third flaky attempt ran ${(trial - opened).toFixed(0)} ms after the breaker opened`);
  await w3.close();

  // purge: every job of every group, and the groups off the queue's lists.
  assert.ok(await queue.purge() >= 1);
  assert.deepEqual(await queue.groups(), []);
  assert.equal((await queue.stats('flaky')).waiting, 0);
}));

test('jobs: failureWaitMs reads Retry-After and exhausted limits in every family the package parses', () => {
  const res = (status, headers) => new Response(null, { status, headers });
  assert.equal(failureWaitMs(res(429, { 'retry-after': '3' })), 3000);
  assert.equal(failureWaitMs(Object.assign(new Error('x'), { response: res(429, { 'retry-after': '2' }) })), 2000);
  assert.equal(failureWaitMs(res(429, { 'ratelimit-policy': '"d";q=10;w=60', ratelimit: '"d";r=0;t=7' })), 7000);
  assert.equal(failureWaitMs(res(429, { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '1.5s', 'x-ratelimit-remaining-requests': '5', 'x-ratelimit-reset-requests': '10s' })), 1500);
  assert.equal(failureWaitMs(res(500, {})), null);
  assert.equal(failureWaitMs(new Error('plain')), null);
  assert.equal(failureWaitMs(Object.assign(new Error('own'), { retryAfterMs: 250 })), 250);
});

test('jobs: ioredis as the client, and a job run by a worker that lost it is refused', (t) => withRedis(t, async (_client, redis) => {
  const io = new Redis({ host: '127.0.0.1', port: redis.port });
  try {
    const queue = new JobQueue({ client: io, name: 'io', visibilityTimeout: 300 });
    await queue.enqueue({ n: 1 }, { group: 'g' });
    // The first worker's heartbeat is slower than the visibility timeout (it is stuck): a
    // second worker claims the job back, and the first one's result is refused ('lost').
    const lost = [];
    let release;
    const stuck = new Promise((r) => { release = r; });
    const w1 = new Worker(queue, async (job) => {
      await stuck;
      return job.id;
    }, { poll: 5, consumer: 'stuck' });
    w1.on('lost', ({ job }) => lost.push(job.id));
    await until(async () => (await queue.stats('g')).active === 1, 3000, 'the first claim');
    // Stop the first worker's heartbeat from reaching Redis: its entry goes idle.
    const keys = queue.groupKeys('g');
    const w2Runs = [];
    const w2 = new Worker(queue, async (job) => { w2Runs.push(job); }, { poll: 5, consumer: 'second' });
    // The first worker heartbeats every 100 ms: pause it by making its touches fail.
    const run = queue.run.bind(queue);
    queue.run = (source, k, args) => (args[0] === 'stuck' && args.length === 3 ? Promise.resolve(0) : run(source, k, args));
    await until(() => w2Runs.length === 1, 5000, 'the claim back');
    assert.equal(w2Runs[0].reclaimed, true);
    assert.equal(w2Runs[0].attempt, 2);
    release();
    await until(() => lost.length === 1, 3000, 'the lost result');
    const s = await queue.stats('g');
    assert.deepEqual([s.completed, s.reclaimed, s.active], [1, 1, 0]);
    assert.equal(Number(await io.call('XLEN', keys[4])), 0);
    await w1.close();
    await w2.close();
  } finally {
    io.disconnect();
  }
}));

test('jobs: on a Redis Cluster (node-redis createCluster and ioredis Cluster), each group\'s keys in its bucket\'s slot', { timeout: 180000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  if (!which('redis-cli')) return missing(t, 'redis-cli (redis-cli --cluster create)');
  const { createCluster } = await import('redis');
  const { Cluster } = await import('ioredis');
  const cluster = await startRedisCluster();
  const slotOf = (port, key) => Number(redisCli(port, 'CLUSTER', 'KEYSLOT', key).trim());
  try {
    const clients = [
      ['node-redis', await createCluster({ rootNodes: [{ url: cluster.nodes[0].url }] }).connect(), (c) => c.quit()],
      ['ioredis', new Cluster([{ host: '127.0.0.1', port: cluster.nodes[0].port }]), (c) => c.quit()],
    ];
    for (const [name, client, close] of clients) {
      const queue = new JobQueue({ client, name: `c-${name}`, limit: { prefix: 'api', algorithm: 'gcra', capacity: 50, rate: '100/s' } });
      const groups = Array.from({ length: 12 }, (_, i) => `tenant-${i}`);
      for (const g of groups) {
        const slots = new Set(queue.groupKeys(g).map((k) => slotOf(cluster.nodes[0].port, k)));
        assert.equal(slots.size, 1, `${g}: every key in one slot`);
        for (let i = 0; i < 3; i++) await queue.enqueue({ i }, { group: g, cost: 2 });
      }
      // The groups spread over the three masters.
      const owners = new Set(groups.map((g) => cluster.nodes.findIndex((n) => redisCli(n.port, 'EXISTS', queue.groupKeys(g)[1]).trim() === '1')));
      assert.equal(owners.size, 3, `${name}: the groups' keys on every master`);
      // A node that lost its scripts gets them again.
      for (const n of cluster.nodes) redisCli(n.port, 'SCRIPT', 'FLUSH');
      const done = [];
      const worker = new Worker(queue, async (job) => { done.push(`${job.group}/${job.id}`); }, { concurrency: 4, poll: 5 });
      await until(() => done.length === 36, 20000, `${name}: the 36 jobs`);
      await worker.close();
      const figures = await queue.inspect();
      assert.deepEqual(Object.keys(figures).sort(), [...groups].sort());
      for (const g of groups) assert.equal(figures[g].completed, 3);
      // Each group's bucket is RedisStore's key, written by the store's script, on the node of
      // the group's other keys.
      const store = new RedisStore({ client, prefix: 'api', algorithm: 'gcra', capacity: 50, rate: '100/s' });
      const node = cluster.nodes.find((n) => redisCli(n.port, 'EXISTS', queue.groupKeys('tenant-3')[1]).trim() === '1');
      assert.equal(store.redisKey('tenant-3'), queue.groupKeys('tenant-3')[0]);
      assert.match(redisCli(node.port, 'GET', 'api:{tenant-3}'), /^gcra:50:10000000\|\d+/);
      await close(client);
    }
  } finally {
    await cluster.close();
  }
});

test('jobs: a group\'s concurrency holds across workers, and a finished job frees its slot at once', (t) => withRedis(t, async (client) => {
  const queue = new JobQueue({ client, name: 'conc', concurrency: 2 });
  for (let i = 0; i < 20; i++) await queue.enqueue({ i }, { group: 'tenant' });
  let running = 0;
  let most = 0;
  const t0 = performance.now();
  const workers = [1, 2, 3].map((n) => new Worker(queue, async () => {
    most = Math.max(most, ++running);
    await sleep(30);
    running--;
  }, { concurrency: 4, poll: 5, consumer: `c${n}` }));
  await until(async () => (await queue.stats('tenant')).completed === 20, 10000, 'the 20 jobs');
  const elapsed = performance.now() - t0;
  await Promise.all(workers.map((w) => w.close()));
  assert.equal(most, 2, 'at most 2 of the group at once, across 3 workers of 4 slots');
  // 10 rounds of 2 jobs of 30 ms: a group parked as busy comes back when a job finishes, not
  // after the visibility timeout (30 s).
  assert.ok(elapsed < 3000, `20 jobs took ${elapsed.toFixed(0)} ms`);
}));

test('jobs: without a limit, a group arriving behind a long run of another group\'s jobs is picked within a few jobs', (t) => withRedis(t, async (client) => {
  const queue = new JobQueue({ client, name: 'turns', keepCompleted: 0 });
  for (let i = 0; i < 5000; i += 500) {
    await queue.enqueueMany(Array.from({ length: 500 }, (_, j) => ({ data: { i: i + j }, group: 'big' })));
  }
  const ran = [];
  const worker = new Worker(queue, async (job) => {
    ran.push(job.group);
    await sleep(1);
  }, { concurrency: 4, poll: 5 });
  // A long run of one group: the worker claims along with each finish, mostly without picks.
  await until(async () => (await queue.stats('big')).completed >= 1000, 20000, 'a thousand of the big group');
  const before = ran.length;
  for (let i = 0; i < 10; i++) await queue.enqueue({ i }, { group: 'small' });
  await until(() => ran.filter((g) => g === 'small').length === 10, 10000, 'the small group\'s jobs');
  await worker.close();
  // Round robin: once picked, the small group alternates with the big one.
  const between = ran.slice(before).indexOf('small');
  const bigWhileSmall = ran.slice(before).slice(between, ran.lastIndexOf('small') - before + 1).filter((g) => g === 'big').length;
  t.diagnostic(`the small group's first job after ${between} jobs of the big group; ${bigWhileSmall} big ones among the small group's 10`);
  assert.ok(between <= 60, `the small group waited for ${between} jobs of the big one`);
  assert.ok(bigWhileSmall <= 40, `${bigWhileSmall} jobs of the big group ran among the small group's 10`);
  assert.ok((await queue.stats('big')).waiting > 2000);
  await queue.purge();
}));

test('jobs: the sweep puts back a group whose producer stopped between its enqueue and its registration', (t) => withRedis(t, async (client) => {
  const queue = new JobQueue({ client, name: 'swept' });
  // A producer that ran the enqueue script and stopped before the registration.
  const reply = await queue.run(JOB_ENQUEUE, queue.groupKeys('orphan'), ['orphan', '{"n":1}', 1, 0, 0, 3, '']);
  assert.equal(String(reply[1]), '1');
  await queue.enqueue({ n: 2 }, { group: 'other' });
  // Known to the queue's group list (an earlier registration) but on neither list now.
  await client.sendCommand(['SADD', queue.queueKeys()[4], 'orphan']);
  const ran = [];
  const worker = new Worker(queue, async (job) => { ran.push(job.group); }, { poll: 5, sweep: 50 });
  await until(() => ran.includes('orphan'), 5000, 'the orphaned job');
  await worker.close();
  assert.deepEqual(ran.sort(), ['orphan', 'other']);
  assert.equal(await queue.sweep(), 0, 'nothing left to put back');
}));
