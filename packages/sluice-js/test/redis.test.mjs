// sluice-limits/redis against a real redis-server, and beside `sluice serve` on the same Redis:
// two Node processes and the gateway spend one bucket.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { createClient } from 'redis';
import { RedisStore } from '../src/redis.js';
import { AbortError, InsufficientCapacityError, TimeoutError } from '../src/index.js';
import { DEBT } from '../src/redis-scripts.generated.js';
import { PACKAGE, freePort, missing, sluiceBin, startRedis, which } from './support.mjs';

test('RedisStore: the Rust crate\'s key layout, exact denials, waits, aborts and NOSCRIPT', async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    const store = new RedisStore({ client, prefix: 'app:api', capacity: 5, rate: '10/s' });
    for (let i = 0; i < 5; i++) assert.equal((await store.check('u1')).allowed, true);
    const denied = await store.check('u1');
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 100, `retry after ${denied.retryAfterMs}`);
    assert.deepEqual(await client.keys('*'), ['app:api:{u1}']);
    assert.match(await client.get('app:api:{u1}'), /^gcra:5:100000000\|\d+$/);
    assert.equal(await client.sendCommand(['SCRIPT', 'EXISTS', (await import('node:crypto')).createHash('sha1').update(DEBT).digest('hex')]).then((r) => Number(r[0])), 1);
    // The script is gone (a restarted Redis): EVALSHA fails with NOSCRIPT and EVAL follows.
    await client.sendCommand(['SCRIPT', 'FLUSH']);
    assert.equal((await store.check('u2')).allowed, true);
    // schedule waits what Redis says.
    const t0 = Date.now();
    const waited = await store.schedule('u1', () => Date.now() - t0);
    assert.ok(waited >= 50 && waited < 2000, `waited ${waited} ms`);
    await assert.rejects(store.schedule('u1', () => 1, { maxWait: 0 }), (e) => e instanceof TimeoutError && e.retryAfterMs > 0);
    const ac = new AbortController();
    const p = store.schedule('u1', () => 'ran', { signal: ac.signal, cost: 5 });
    ac.abort();
    await assert.rejects(p, (e) => e instanceof AbortError && e.name === 'AbortError');
    await assert.rejects(store.check('u1', 6), InsufficientCapacityError);
    assert.throws(() => new RedisStore({ client, capacity: 5, rate: '1/s', algorithm: 'sliding_log' }), /sliding_log is not available on Redis/);
    assert.throws(() => new RedisStore({ client, capacity: 100, rate: '1/d' }), /52 days/);
    const sw = new RedisStore({ client, prefix: 'app:api', algorithm: 'sliding_window', capacity: 2, rate: '1/s' });
    assert.equal(await sw.tryAcquire('w'), true);
    assert.equal(await sw.tryAcquire('w'), true);
    assert.equal(await sw.tryAcquire('w'), false);
    assert.match(await client.get('app:api:{w}'), /^sw:2:1000000000\|\d+ \d+ \d+$/);
    // Another quota or algorithm on the same key converts it on read: never more than it had left.
    const one = new RedisStore({ client, prefix: 'app:api', algorithm: 'gcra', capacity: 5, rate: '1/h' });
    const other = new RedisStore({ client, prefix: 'app:api', algorithm: 'fixed_window', capacity: 10, rate: '1/h' });
    for (let i = 0; i < 3; i++) assert.equal(await one.tryAcquire('c'), true);
    let admitted = 0;
    for (let i = 0; i < 6; i++) {
      if (await other.tryAcquire('c')) admitted++;
      if (await one.tryAcquire('c')) admitted++;
    }
    assert.equal(admitted, 2, 'the 2 left, however the two stores alternate');
    assert.deepEqual((await client.keys('app:api:*c*')), ['app:api:{c}']);
  } finally {
    await client.quit();
    await redis.close();
  }
});

test('RedisStore with an ioredis client: the same decisions and key', async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const { Redis } = await import('ioredis');
  const client = new Redis(redis.port, '127.0.0.1', { lazyConnect: true });
  await client.connect();
  try {
    const store = new RedisStore({ client, prefix: 'io:api', capacity: 2, rate: '1/s' });
    assert.equal(await store.tryAcquire('k'), true);
    assert.equal(await store.tryAcquire('k'), true);
    const denied = await store.check('k');
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 900 && denied.retryAfterMs <= 1000, `retry after ${denied.retryAfterMs}`);
    assert.deepEqual(await client.keys('*'), ['io:api:{k}']);
    await client.call('SCRIPT', 'FLUSH');
    assert.equal((await store.check('other')).allowed, true, 'EVAL after NOSCRIPT');
  } finally {
    client.disconnect();
    await redis.close();
  }
});

function run(cmd, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} ${args.join(' ')} exited ${code}`))));
  });
}

test('interop: sluice serve and two Node processes share one bucket in Redis', { timeout: 120000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const bin = sluiceBin();
  if (!bin) return missing(t, 'the sluice binary (cargo build -p sluice-server --bin sluice; SLUICE_BIN)');
  const redis = await startRedis();
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-interop-'));
  const [listen, admin] = [await freePort(), await freePort()];
  const config = join(dir, 'sluice.toml');
  await writeFile(config, [
    '[server]',
    `listen = "127.0.0.1:${listen}"`,
    `admin_listen = "127.0.0.1:${admin}"`,
    'workers = 1',
    '[store]',
    'backend = "redis"',
    `url = "${redis.url}"`,
    'prefix = "interop"',
    'on_error = "deny"',
    '[[policy]]',
    'name = "api"',
    'algorithm = "gcra"',
    'capacity = 20',
    'rate = "100/s"',
    '[[route]]',
    'path_prefix = "/"',
    'policies = ["api"]',
    'upstream = "builtin:demo"',
    '',
  ].join('\n'));
  const gateway = spawn(bin, ['serve', '--config', config], { stdio: ['ignore', 'ignore', 'inherit'] });
  try {
    const adminUrl = `http://127.0.0.1:${admin}`;
    const deadline = Date.now() + 30000;
    for (;;) {
      const up = await fetch(`${adminUrl}/healthz`).then((r) => r.ok, () => false);
      if (up) break;
      if (Date.now() > deadline || gateway.exitCode !== null) throw new Error('sluice serve did not start');
      await new Promise((r) => setTimeout(r, 100));
    }
    const check = () => fetch(`${adminUrl}/v1/check`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'api', key: 'shared' }),
    }).then(async (r) => {
      await r.arrayBuffer();
      if (r.status !== 200 && r.status !== 429) throw new Error(`/v1/check answered ${r.status}`);
      return r.status === 200;
    });
    // The gateway's store connects in the background: wait for its first decision from Redis.
    while (!(await fetch(`${adminUrl}/v1/check`, { method: 'POST', body: '{"policy":"api","key":"warm-up","cost":0}', headers: { 'content-type': 'application/json' } }).then((r) => r.status === 200))) {
      await new Promise((r) => setTimeout(r, 50));
    }
    const MS = 3000;
    const worker = join(PACKAGE, 'test', 'interop-worker.mjs');
    const nodes = [1, 2].map(() => run(process.execPath, [worker, redis.url, 'interop:api', 'shared', String(MS)]));
    let gatewayAdmitted = 0;
    const gFirst = Date.now();
    let gLast = gFirst;
    while (Date.now() < gFirst + MS) {
      if (await check()) gatewayAdmitted++;
      gLast = Date.now();
    }
    const results = (await Promise.all(nodes)).map((s) => JSON.parse(s));
    const first = Math.min(gFirst, ...results.map((r) => r.first));
    const last = Math.max(gLast, ...results.map((r) => r.last));
    const total = gatewayAdmitted + results.reduce((n, r) => n + r.admitted, 0);
    const bound = 20 + Math.floor((100 * (last - first)) / 1000);
    t.diagnostic(`admitted: gateway ${gatewayAdmitted}, node ${results.map((r) => r.admitted).join(', ')}; total ${total} over ${last - first} ms, bound ${bound}`);
    assert.ok(total <= bound, `${total} admitted, above capacity + rate·T = ${bound}`);
    assert.ok(gatewayAdmitted > 0 && results.every((r) => r.admitted > 0), 'every party was admitted some');
    // One bucket, kept busy: close to the bound (three buckets would be about three times it).
    assert.ok(total >= bound * 0.6, `${total} admitted, far below the bound ${bound}`);
    // The very key the Rust store names, written by all three.
    const client = await createClient({ url: redis.url }).connect();
    try {
      assert.equal(await client.exists('interop:api:{shared}'), 1);
      assert.match(await client.get('interop:api:{shared}'), /^gcra:20:10000000\|\d+$/);
    } finally {
      await client.quit();
    }
  } finally {
    gateway.kill('SIGTERM');
    await new Promise((r) => (gateway.exitCode !== null ? r() : gateway.once('exit', r)));
    await rm(dir, { recursive: true, force: true });
    await redis.close();
  }
});
