// One Node process of the interop test: spends `key` of a RedisStore as fast as it can for
// `ms` milliseconds, then prints { admitted, first, last } (Date.now() of its first request and
// of its last answer).
//
//   node interop-worker.mjs REDIS_URL PREFIX KEY MS

import { createClient } from 'redis';
import { RedisStore } from '../src/redis.js';

const [url, prefix, key, ms] = process.argv.slice(2);
const client = await createClient({ url }).connect();
// As the gateway beside it: Redis or nothing (on_error = "deny"), a timeout no stall reaches.
const store = new RedisStore({ client, prefix, algorithm: 'gcra', capacity: 20, rate: '100/s', onError: 'deny', timeout: '2s' });
await store.check('warm-up', 0);
let admitted = 0;
const first = Date.now();
const end = first + Number(ms);
let last = first;
while (Date.now() < end) {
  if (await store.tryAcquire(key)) admitted++;
  last = Date.now();
  await new Promise((r) => setTimeout(r, 1));
}
await client.quit();
process.stdout.write(JSON.stringify({ admitted, first, last }));
