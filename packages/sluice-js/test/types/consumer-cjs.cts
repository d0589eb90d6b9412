// A CommonJS TypeScript consumer (a .cts file under nodenext: `require` conditions, the
// .d.cts declarations), compiled by tsc --strict --noEmit with consumer.ts.
import sluice = require('sluice-limits');
import redis = require('sluice-limits/redis');

export async function main(): Promise<void> {
  const limiter = new sluice.RateLimiter({ capacity: 2, rate: '10/s' });
  const n: number = await limiter.schedule(() => 1);
  const k: sluice.Keyed<string> = sluice.keyed({ maxKeys: 10, capacity: 1, rate: '1/s' });
  const hashed: string = sluice.keyHash('salt', 'key');
  const e: unknown = null;
  if (e instanceof sluice.TimeoutError) {
    const r: sluice.TimeoutReason = e.reason;
  }
  type Options = redis.RedisStoreOptions;
  const store: typeof redis.RedisStore = redis.RedisStore;
  const jobs: typeof sluice.JobQueue = sluice.JobQueue;
  const worker: typeof sluice.Worker = sluice.Worker;
  void [n, k, hashed, store, jobs, worker];
}
