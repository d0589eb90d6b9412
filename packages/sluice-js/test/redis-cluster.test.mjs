// sluice-limits/redis on a real Redis Cluster (three masters), through node-redis's
// createCluster() and ioredis's Cluster: each key's script (a decision or a charge) runs on the
// node of its slot, the keys spread over the masters, decisions stay exact, and NOSCRIPT on one
// node is healed.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { createCluster } from 'redis';
import { RedisStore } from '../src/redis.js';
import { missing, redisCli, startRedisCluster, which } from './support.mjs';

/** The same checks through `client`, a connected Cluster client of either library. */
async function exercise(client, cluster, prefix) {
  const store = new RedisStore({ client, prefix, algorithm: 'gcra', capacity: 2, rate: '1/min', onError: 'throw', timeout: '5s' });
  for (let i = 0; i < 30; i++) {
    assert.equal(await store.tryAcquire(`user-${i}`), true);
    assert.equal(await store.tryAcquire(`user-${i}`), true);
    const denied = await store.check(`user-${i}`);
    assert.equal(denied.allowed, false, `user-${i}: the third is refused`);
    assert.equal(denied.source, 'redis');
    assert.ok(denied.retryAfterMs > 59000 && denied.retryAfterMs <= 60000, `retry after ${denied.retryAfterMs}`);
  }
  const perNode = cluster.nodes.map((n) => Number(redisCli(n.port, 'DBSIZE').trim()));
  assert.equal(perNode.reduce((a, b) => a + b, 0), 30, `keys per node: ${perNode}`);
  assert.ok(perNode.every((n) => n > 0), `the keys spread over the three masters: ${perNode}`);
  // Each key on the node that owns its slot, under the Rust crate's name.
  const owner = cluster.nodes.find((n) => redisCli(n.port, 'EXISTS', store.redisKey('user-7')).trim() === '1');
  assert.ok(owner, 'user-7 is on one node');
  assert.match(redisCli(owner.port, 'GET', `${prefix}:{user-7}`), /^gcra:2:60000000000\|\d+/);
  // A charge runs on the node of its key's slot too: 3 more on a spent bucket, owed there.
  for (let i = 0; i < 30; i += 7) {
    assert.equal(await store.charge(`user-${i}`, 3), 0);
    const owed = await store.check(`user-${i}`, 0);
    assert.equal(owed.allowed, false, `user-${i}: in debt, even a query is refused`);
    assert.ok(owed.retryAfterMs > 170000 && owed.retryAfterMs <= 180000, `user-${i}: paid in ${owed.retryAfterMs} ms`);
  }
  // A node that lost its scripts (a restart) gets them again through EVAL.
  for (const n of cluster.nodes) redisCli(n.port, 'SCRIPT', 'FLUSH');
  assert.equal(await store.tryAcquire('after-flush'), true);
  // schedule() on the Cluster: a short quota, one wait.
  const fast = new RedisStore({ client, prefix: `${prefix}-fast`, capacity: 1, rate: '10/s', onError: 'throw', timeout: '5s' });
  const t0 = Date.now();
  const at = await Promise.all([1, 2, 3].map(() => fast.schedule('k', () => Date.now() - t0)));
  assert.ok(at[2] >= 150 && at[2] < 3000, `the third ran at ${at[2]} ms`);
}

test('RedisStore on a Redis Cluster through node-redis createCluster()', { timeout: 120000 }, async (t) => {
  if (!which('redis-server') || !which('redis-cli')) return missing(t, 'redis-server and redis-cli');
  const cluster = await startRedisCluster();
  const client = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })) });
  await client.connect();
  try {
    await exercise(client, cluster, 'nr:api');
  } finally {
    await client.close();
    await cluster.close();
  }
});

test('RedisStore on a Redis Cluster through ioredis Cluster', { timeout: 120000 }, async (t) => {
  if (!which('redis-server') || !which('redis-cli')) return missing(t, 'redis-server and redis-cli');
  const cluster = await startRedisCluster();
  const { Cluster } = await import('ioredis');
  const client = new Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })), { lazyConnect: true });
  await client.connect();
  try {
    await exercise(client, cluster, 'io:api');
  } finally {
    client.disconnect();
    await cluster.close();
  }
});
