// Compiled by `tsc --noEmit -p test/types` (types.test.mjs): the declarations accept what the
// README shows and refuse what they should.
import {
  RateLimiter, PromisePool, limit, keyed, retry, rateLimitHints, CircuitBreaker,
  QueueFullError, TimeoutError, AbortError, CircuitOpenError,
} from 'sluice-limits';
import { RedisStore } from 'sluice-limits/redis';

const limiter = new RateLimiter({ algorithm: 'gcra', capacity: 20, rate: '10/s', queue: { depth: 100, maxWait: '2s' } });
const n: Promise<number> = limiter.schedule(async () => 42, { cost: 2, priority: 'high', signal: AbortSignal.timeout(1000) });
const ok: boolean = limiter.tryAcquire(1);
const pool = new PromisePool({ concurrency: 4 });
const doubled: Promise<number[]> = pool.map([1, 2, 3], (x) => x * 2);
const both = limit({ concurrency: 2, capacity: 5, rate: '5/s' });
const s: Promise<string> = both.schedule(() => 'x');
const perUser = keyed({ maxKeys: 1000, capacity: 10, rate: '1/s' });
const u: boolean = perUser.tryAcquire('user-1');
const r: Promise<Response> = retry(() => fetch('http://127.0.0.1/'), { retries: 5, base: 100, cap: 5000, jitter: 'full', respectRetryAfter: true });
const hints = rateLimitHints(new Headers());
const ra: number | null = hints.retryAfterMs;
const breaker = new CircuitBreaker({ failureThreshold: 3, resetTimeout: '10s' });
const state: 'closed' | 'open' | 'half-open' = breaker.state;
const e: unknown = null;
if (e instanceof TimeoutError || e instanceof QueueFullError || e instanceof CircuitOpenError) {
  const ms: number = e.retryAfterMs;
}
if (e instanceof AbortError) {
  const name: 'AbortError' = e.name;
}
const store = new RedisStore({ client: {}, prefix: 'sluice:api', capacity: 10, rate: '5/s' });
const d: Promise<boolean> = store.tryAcquire('k');

// @ts-expect-error: rate is a string such as "10/s"
new RateLimiter({ capacity: 1, rate: 10 });
// @ts-expect-error: priority is high, normal or low
limiter.schedule(() => 1, { priority: 'urgent' });
// @ts-expect-error: capacity is required
new RateLimiter({ rate: '1/s' });

export { n, ok, doubled, s, u, r, ra, state, d };
