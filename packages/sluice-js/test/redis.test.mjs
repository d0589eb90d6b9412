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
import { ALGORITHMS, AbortError, InsufficientCapacityError, TimeoutError, UnavailableError, keyHash } from '../src/index.js';
import { DEBT } from '../src/redis-scripts.generated.js';
import { PACKAGE, freePort, missing, redisCli, sluiceBin, startRedis, which } from './support.mjs';

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

test('RedisStore.charge: the scripts\' charge mode, its ARGV as the Rust crate builds them; debt, maxDebt, windows, refund', async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const real = await createClient({ url: redis.url }).connect();
  // node-redis's client, with every command it is given recorded.
  const sent = [];
  const client = { sendCommand: (args) => { sent.push(args); return real.sendCommand(args); } };
  try {
    const SHA = (await import('node:crypto')).createHash('sha1').update(DEBT).digest('hex');
    const store = new RedisStore({ client, prefix: 'ch', algorithm: 'gcra', capacity: 5, rate: '1/s', onError: 'throw' });
    // 12 on a full bucket of 5: all of it, 7 beyond empty (no cap: most_ns is 2^53).
    assert.equal(await store.charge('k', 12), 0);
    const argv = ['1', 'ch:{k}', 'gcra:5:1000000000', '12', '', 'c', '9007199254740992'];
    // A fresh Redis: EVALSHA, NOSCRIPT, then EVAL with the same arguments.
    assert.deepEqual(sent.slice(-2), [['EVALSHA', SHA, ...argv], ['EVAL', DEBT, ...argv]]);
    const denied = await store.check('k', 0);
    assert.equal(denied.allowed, false, 'a query on a key in debt');
    assert.ok(denied.retryAfterMs > 6500 && denied.retryAfterMs <= 7000, `the debt is paid in ${denied.retryAfterMs} ms`);
    const one = await store.check('k');
    assert.ok(one.retryAfterMs > 7500 && one.retryAfterMs <= 8000, `a token in ${one.retryAfterMs} ms`);
    // maxDebt: most_ns = window + maxDebt x interval; what does not fit is forgiven.
    assert.equal(await store.charge('m', 12, { maxDebt: 2 }), 5);
    assert.deepEqual(sent.at(-1).slice(4), ['gcra:5:1000000000', '12', '', 'c', String(5e9 + 2e9)]);
    assert.equal(await store.charge('m', 3, { maxDebt: 2 }), 3, 'at the cap: all forgiven');
    // A cap beyond what Redis counts is 2^53 ns, as charge_command caps it.
    assert.equal(await store.charge('n', 1, { maxDebt: 1e7 }), 0);
    assert.equal(sent.at(-1).at(-1), '9007199254740992');
    assert.equal(await store.charge('n', 0), 0);
    // Refund: EVALSHA ... <cost> '' <ago_ns>; the debt shrinks, never beyond full.
    await store.refund('k', 3, { ago: '1s' });
    assert.deepEqual(sent.at(-1).slice(4), ['gcra:5:1000000000', '3', '', '1000000000']);
    const after = await store.check('k', 0);
    assert.ok(after.retryAfterMs > 3500 && after.retryAfterMs <= 4000, `4 owed: ${after.retryAfterMs} ms`);
    await store.refund('fresh', 3);
    assert.equal((await store.check('fresh', 0)).remaining, 5, 'a full bucket stays full');
    // Windows take what is left; the rest is forgiven.
    // Windows of 5 min (aligned to the epoch): no boundary falls between these few steps.
    for (const algorithm of ['fixed_window', 'sliding_window']) {
      const w = new RedisStore({ client, prefix: 'ch', algorithm, capacity: 5, rate: '1/min', onError: 'throw' });
      assert.equal(await w.tryAcquire(`w-${algorithm}`, 2), true);
      assert.equal(await w.charge(`w-${algorithm}`, 10), 7, algorithm);
      assert.deepEqual(sent.at(-1).slice(5), ['10', '', 'c', '9007199254740992']);
      assert.equal((await w.check(`w-${algorithm}`, 0)).remaining, 0, algorithm);
      await w.refund(`w-${algorithm}`, 2);
      assert.equal((await w.check(`w-${algorithm}`, 0)).remaining, 2, `${algorithm}: refunded in its window`);
    }
    await assert.rejects(store.charge('k', -1), RangeError);
    await assert.rejects(store.charge('k', 1, { maxDebt: 0.5 }), /maxDebt/);
  } finally {
    await real.quit();
    await redis.close();
  }
});

test('RedisStore.charge while Redis does not answer: onError decides', { timeout: 60000 }, async (t) => {
  if (!which('redis-server') || !which('redis-cli')) return missing(t, 'redis-server and redis-cli');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    const local = new RedisStore({ client, prefix: 'down', capacity: 2, rate: '1/min', timeout: '100ms', retryInterval: '5s' });
    const strict = new RedisStore({ client, prefix: 'down', capacity: 2, rate: '1/min', timeout: '100ms', onError: 'throw' });
    redisCli(redis.port, 'CLIENT', 'PAUSE', '1500', 'ALL');
    // Unanswered: nothing charged, all forgiven (or UnavailableError).
    assert.equal(await local.charge('k', 5), 5);
    await assert.rejects(strict.charge('k', 5), (e) => e instanceof UnavailableError && /within 100 ms/.test(e.message));
    // Within retryInterval: the local limiter that decides meanwhile is charged.
    assert.equal(await local.charge('k', 5), 0);
    const d = await local.check('k', 0);
    assert.deepEqual([d.source, d.allowed], ['local', false], 'the local bucket is in debt');
    await local.refund('k', 1);
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

test('RedisStore.schedule: maxWait counts the time queued behind earlier tasks of the key', async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    const store = new RedisStore({ client, prefix: 'mw', capacity: 1, rate: '1/s', onError: 'throw', timeout: '5s' });
    const t0 = Date.now();
    const outcomes = await Promise.all([1, 2, 3, 4, 5].map((i) => store.schedule('k', () => ['ran', i, Date.now() - t0], { maxWait: '1.5s' })
      .catch((e) => [e.name, i, Date.now() - t0, e.reason])));
    t.diagnostic(JSON.stringify(outcomes));
    const ran = outcomes.filter((o) => o[0] === 'ran');
    assert.deepEqual(ran.map((o) => o[1]), [1, 2], 'the two that fit in 1.5 s ran');
    assert.ok(ran[1][2] >= 900 && ran[1][2] < 1500, `the second at ${ran[1][2]} ms`);
    for (const o of outcomes.slice(2)) {
      assert.equal(o[0], 'TimeoutError', JSON.stringify(o));
      assert.ok(o[2] < 1500 + 500, `refused at ${o[2]} ms, not after its maximum wait`);
    }
  } finally {
    await client.quit();
    await redis.close();
  }
});

test('RedisStore: a stalled Redis (CLIENT PAUSE) is given `timeout`, then onError decides', { timeout: 60000 }, async (t) => {
  if (!which('redis-server') || !which('redis-cli')) return missing(t, 'redis-server and redis-cli');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    const local = new RedisStore({ client, prefix: 'stall', capacity: 2, rate: '1/min', timeout: '200ms' });
    assert.equal((await local.check('k')).source, 'redis');
    redisCli(redis.port, 'CLIENT', 'PAUSE', '2000', 'ALL');
    const t0 = Date.now();
    const d = await local.check('k');
    const took = Date.now() - t0;
    t.diagnostic(`check() during a 2 s CLIENT PAUSE answered in ${took} ms: ${JSON.stringify(d)}`);
    assert.ok(took >= 190 && took < 1000, `answered after ${took} ms`);
    assert.equal(d.source, 'local');
    assert.equal(d.allowed, true);
    // Within retryInterval Redis is not asked: the local limit decides at once, exactly.
    const t1 = Date.now();
    assert.equal((await local.check('k')).allowed, true);
    const third = await local.check('k');
    assert.equal(third.allowed, false, 'the local bucket holds the same quota');
    assert.ok(Date.now() - t1 < 100, `local decisions at once: ${Date.now() - t1} ms`);
    const deny = new RedisStore({ client, prefix: 'stall', capacity: 2, rate: '1/min', timeout: '100ms', onError: 'deny' });
    const denied = await deny.check('d');
    assert.equal(denied.allowed, false);
    assert.equal(denied.source, 'deny');
    assert.ok(denied.retryAfterMs > 0);
    const strict = new RedisStore({ client, prefix: 'stall', capacity: 2, rate: '1/min', timeout: '100ms', onError: 'throw' });
    await assert.rejects(strict.check('s'), (e) => e instanceof UnavailableError && /within 100 ms/.test(e.message));
    const allow = new RedisStore({ client, prefix: 'stall', capacity: 2, rate: '1/min', timeout: '100ms', onError: 'allow' });
    assert.deepEqual([(await allow.check('a')).allowed, (await allow.check('a')).source], [true, 'allow']);
    // Once Redis answers again (the pause over, retryInterval past), it decides again.
    await new Promise((r) => setTimeout(r, Math.max(0, 2300 - (Date.now() - t0))));
    const back = await local.check('fresh');
    assert.equal(back.source, 'redis');
  } finally {
    await client.quit();
    await redis.close();
  }
});

test('RedisStore: a sorted ALGORITHMS cannot send a token bucket to another script', async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const client = await createClient({ url: redis.url }).connect();
  try {
    try {
      ALGORITHMS.sort();
    } catch {
      // Frozen: refused.
    }
    const store = new RedisStore({ client, prefix: 'alg', algorithm: 'token_bucket', capacity: 3, rate: '1/s', onError: 'throw' });
    assert.equal(await store.tryAcquire('k'), true);
    assert.match(await client.get('alg:{k}'), /^gcra:3:1000000000\|/);
  } finally {
    await client.quit();
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

test('interop: a key charged into debt by Node is refused by sluice serve, and one /v1/settle charged is in debt for Node', { timeout: 120000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const bin = sluiceBin();
  if (!bin) return missing(t, 'the sluice binary (cargo build -p sluice-server --bin sluice; SLUICE_BIN)');
  const redis = await startRedis();
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-charge-'));
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
    'prefix = "settled"',
    'timeout = "2s"',
    'on_error = "deny"',
    '[[policy]]',
    'name = "llm"',
    'algorithm = "gcra"',
    'capacity = 5',
    'rate = "1/s"',
    '[[route]]',
    'path_prefix = "/"',
    'policies = ["llm"]',
    'upstream = "builtin:demo"',
    '',
  ].join('\n'));
  const gateway = spawn(bin, ['serve', '--config', config], { stdio: ['ignore', 'ignore', 'inherit'] });
  const client = await createClient({ url: redis.url }).connect();
  try {
    const adminUrl = `http://127.0.0.1:${admin}`;
    const post = (path, body) => fetch(`${adminUrl}${path}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    }).then(async (r) => ({ status: r.status, body: await r.json() }), () => ({ status: 0 }));
    // Up, and its store answering from Redis.
    const deadline = Date.now() + 30000;
    while ((await post('/v1/check', { policy: 'llm', key: 'warm-up', cost: 0 })).status !== 200) {
      if (Date.now() > deadline || gateway.exitCode !== null) throw new Error('sluice serve did not answer /v1/check');
      await new Promise((r) => setTimeout(r, 100));
    }
    const store = new RedisStore({ client, prefix: 'settled:llm', algorithm: 'gcra', capacity: 5, rate: '1/s', onError: 'throw' });

    // Node charges 12 on a full bucket of 5: 7 owed. The gateway refuses the key until the
    // refill has paid them and brought a token: about 8 s.
    assert.equal(await store.charge('from-node', 12), 0);
    const refused = await post('/v1/check', { policy: 'llm', key: 'from-node' });
    t.diagnostic(`/v1/check after Node's charge: ${JSON.stringify(refused)}`);
    assert.equal(refused.status, 429);
    assert.equal(refused.body.allowed, false);
    assert.ok(refused.body.retry_after_ms > 7000 && refused.body.retry_after_ms <= 8000, `retry after ${refused.body.retry_after_ms} ms`);
    // Another key, not charged, is admitted: the debt is that key's alone.
    assert.equal((await post('/v1/check', { policy: 'llm', key: 'other' })).status, 200);

    // The gateway settles a request admitted with 1 that cost 13: 12 charged, 7 owed. Node's
    // store refuses the key, even a query, until they are paid.
    const settled = await post('/v1/settle', { policy: 'llm', key: 'from-gateway', reserved: 1, actual: 13 });
    t.diagnostic(`/v1/settle: ${JSON.stringify(settled)}`);
    assert.equal(settled.status, 200);
    assert.equal(settled.body.charged, 12);
    assert.equal(settled.body.owed, 7);
    const query = await store.check('from-gateway', 0);
    assert.equal(query.allowed, false, 'a query on the key the gateway put in debt');
    assert.ok(query.retryAfterMs > 6000 && query.retryAfterMs <= 7000, `paid in ${query.retryAfterMs} ms`);
    assert.equal(await store.tryAcquire('from-gateway'), false);
    // Node's charge on that key adds to the same debt; its refund takes from it.
    assert.equal(await store.charge('from-gateway', 2, { maxDebt: 8 }), 1, 'one more fits under maxDebt 8');
    await store.refund('from-gateway', 4);
    const again = await post('/v1/check', { policy: 'llm', key: 'from-gateway', cost: 0 });
    assert.equal(again.status, 429);
    assert.ok(again.body.retry_after_ms > 3000 && again.body.retry_after_ms <= 4000, `4 owed: ${again.body.retry_after_ms} ms`);
  } finally {
    await client.quit();
    gateway.kill('SIGTERM');
    await new Promise((r) => (gateway.exitCode !== null ? r() : gateway.once('exit', r)));
    await rm(dir, { recursive: true, force: true });
    await redis.close();
  }
});

test('keyHash: the gateway stores a header key under keyHash(salt, key), and Node spends that bucket', { timeout: 120000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const bin = sluiceBin();
  if (!bin) return missing(t, 'the sluice binary (cargo build -p sluice-server --bin sluice; SLUICE_BIN)');
  const redis = await startRedis();
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-salt-'));
  const [listen, admin] = [await freePort(), await freePort()];
  const config = join(dir, 'sluice.toml');
  const SALT = 'pepper and salt';
  const SECRET = 'sk-live-0123456789abcdef';
  await writeFile(config, [
    '[server]',
    `listen = "127.0.0.1:${listen}"`,
    `admin_listen = "127.0.0.1:${admin}"`,
    'workers = 1',
    '[store]',
    'backend = "redis"',
    `url = "${redis.url}"`,
    'prefix = "gw"',
    'timeout = "2s"',
    'on_error = "deny"',
    'key_salt = "env:SLUICE_JS_TEST_SALT"',
    '[[policy]]',
    'name = "bykey"',
    'algorithm = "gcra"',
    'capacity = 5',
    'rate = "1/min"',
    'key = "header:x-api-key"',
    '[[route]]',
    'path_prefix = "/"',
    'policies = ["bykey"]',
    'upstream = "builtin:demo"',
    '',
  ].join('\n'));
  const gateway = spawn(bin, ['serve', '--config', config], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, SLUICE_JS_TEST_SALT: SALT },
  });
  const client = await createClient({ url: redis.url }).connect();
  try {
    const call = () => fetch(`http://127.0.0.1:${listen}/x`, { headers: { 'x-api-key': SECRET } }).then(async (r) => {
      await r.arrayBuffer();
      return r.status;
    }, () => 0);
    const deadline = Date.now() + 30000;
    while ((await call()) !== 200) {
      if (Date.now() > deadline || gateway.exitCode !== null) throw new Error('sluice serve did not admit a first request');
      await new Promise((r) => setTimeout(r, 100));
    }
    // The gateway wrote the key's bucket under its keyed hash, as keyHash computes it.
    const keys = await client.keys('gw:*');
    const hashed = keyHash(SALT, SECRET);
    t.diagnostic(`the gateway's key: ${keys.join(', ')}; keyHash: ${hashed}`);
    assert.deepEqual(keys, [`gw:bykey:{${hashed}}`]);
    const store = new RedisStore({ client, prefix: 'gw:bykey', algorithm: 'gcra', capacity: 5, rate: '1/min', keySalt: SALT, onError: 'throw' });
    assert.equal(store.redisKey(SECRET), keys[0]);
    // One bucket: the gateway took 1 of 5; Node takes the other 4; the gateway then refuses.
    let node = 0;
    while (await store.tryAcquire(SECRET)) node++;
    assert.equal(node, 4);
    assert.equal(await call(), 429);
  } finally {
    await client.quit();
    gateway.kill('SIGTERM');
    await new Promise((r) => (gateway.exitCode !== null ? r() : gateway.once('exit', r)));
    await rm(dir, { recursive: true, force: true });
    await redis.close();
  }
});
