// limit(): one object that enforces a concurrency bound and a rate together.

import { PromisePool } from './pool.js';
import { RateLimiter } from './limiter.js';

/**
 * At most `concurrency` tasks running, started at most at `rate` (with `capacity` as the
 * burst). A task first waits for a slot, then for its tokens, so the tokens are spent only by
 * tasks about to start. Returns `{ schedule, run, pool, limiter }`; `run(fn)` is `schedule(fn)`.
 */
export function limit(options = {}) {
  const { concurrency = Infinity, rate, capacity, ...rest } = options;
  const pool = new PromisePool({ concurrency });
  const limiter = rate === undefined ? null : new RateLimiter({ capacity: capacity ?? 1, rate, ...rest });
  const schedule = (fn, opts = {}) =>
    pool.run(() => (limiter ? limiter.schedule(fn, opts) : fn()), { signal: opts.signal });
  return {
    schedule,
    run: schedule,
    pool,
    limiter,
    get active() { return pool.active; },
    get pending() { return pool.pending + (limiter ? limiter.pending : 0); },
    close() { limiter?.close(); },
  };
}
