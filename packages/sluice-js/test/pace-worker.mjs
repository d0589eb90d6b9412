// One process of the fleet in pacing-live.test.mjs: 8 workers pacing through the Redis state
// `key` against `url` for `ms`; prints { ok, limited }.
//   node test/pace-worker.mjs <redis url> <url> <ms> <key>

import { createClient } from 'redis';
import { paced } from '../src/index.js';
import { RedisPacerStore } from '../src/redis.js';
import { drive, tally } from './standin.mjs';

const [redisUrl, url, ms, key] = process.argv.slice(2);
const client = await createClient({ url: redisUrl }).connect();
const f = paced(fetch, { store: new RedisPacerStore({ client, key }) });
const log = await drive(async () => {
  const r = await f(url);
  await r.arrayBuffer();
  return r.status;
}, { workers: 8, ms: Number(ms) });
await client.quit();
process.stdout.write(JSON.stringify(tally(log)));
