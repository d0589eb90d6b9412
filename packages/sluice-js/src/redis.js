// sluice-limits/redis (Node): a rate limit shared through Redis, running the very scripts and
// key layout of the Rust crate's Redis store, so that Node processes and `sluice serve` on one
// Redis and prefix spend one bucket.

import { createHash } from 'node:crypto';

import { algorithmCode, ALGORITHMS, rateIntervalNs, CoreLimiter } from './core.js';
import { DEBT, SLIDING_WINDOW, FIXED_WINDOW } from './redis-scripts.generated.js';
import { InsufficientCapacityError, TimeoutError, abortError } from './errors.js';
import { durationNs, monotonicNow, sleep } from './time.js';

// The scripts compute exactly only below these (crates/sluice/src/store/redis/script.rs).
const MAX_WINDOW_NS = 1n << 52n;
const MAX_WINDOW_CAPACITY = 94906265n;

const sha1 = (text) => createHash('sha1').update(text).digest('hex');

// The script of `algorithm` and its stamp `<family>:<capacity>:<interval_ns>`, which starts
// every value it writes: a script reading another stamp converts the value to its own first.
function program(algorithm, capacity, intervalNs) {
  const kind = ALGORITHMS[algorithmCode(algorithm)];
  const window = capacity * intervalNs;
  if (window > MAX_WINDOW_NS) {
    throw new RangeError(`${kind}: its window (capacity x interval) is above the 52 days (2^52 ns) the Redis scripts compute exactly`);
  }
  const stamp = (family) => `${family}:${capacity}:${intervalNs}`;
  switch (kind) {
    case 'gcra':
    case 'token_bucket':
    case 'leaky_bucket':
      return { source: DEBT, stamp: stamp('gcra') };
    case 'sliding_window':
    case 'fixed_window':
      if (capacity > MAX_WINDOW_CAPACITY) {
        throw new RangeError(`${kind}: capacity ${capacity} is above the ${MAX_WINDOW_CAPACITY} the window scripts compute exactly`);
      }
      return kind === 'sliding_window'
        ? { source: SLIDING_WINDOW, stamp: stamp('sw') }
        : { source: FIXED_WINDOW, stamp: stamp('fw') };
    default:
      throw new RangeError(`${kind} is not available on Redis (it keeps one entry per admission); use sliding_window (same window, O(1)) or gcra`);
  }
}

/** Sends one command through node-redis (v4+) or ioredis. */
function sender(client) {
  if (typeof client?.call === 'function') return (args) => client.call(...args);
  if (typeof client?.sendCommand === 'function') return (args) => client.sendCommand(args);
  throw new TypeError('client must be a connected node-redis (createClient) or ioredis client');
}

/**
 * One limit in Redis: `capacity` and `rate` by `algorithm`, each key's bucket at
 * `<prefix>:{<key>}` whatever the algorithm, its value stamped with the quota that wrote it
 * (a store with another quota or algorithm converts it on read, never giving a key more than
 * it had left), decided by Redis's clock. `sluice serve` keeps policy P of
 * `[store] prefix = "X"` under the prefix `X:P`: give that prefix here to share its buckets.
 */
export class RedisStore {
  #send;
  #program;
  #sha;
  #tails = new Map();

  constructor(options = {}) {
    const { client, prefix = 'sluice', algorithm = 'token_bucket', capacity, rate, maxWait } = options;
    if (!Number.isSafeInteger(capacity) || capacity < 1) {
      throw new RangeError(`capacity must be a whole number of at least 1, got ${capacity}`);
    }
    if (typeof prefix !== 'string' || prefix === '') throw new TypeError('prefix must be a non-empty string');
    const intervalNs = rateIntervalNs(rate);
    // The core validates the quota as the gateway does.
    new CoreLimiter(algorithmCode(algorithm), BigInt(capacity), intervalNs, 0, 0n).free();
    this.#program = program(algorithm, BigInt(capacity), intervalNs);
    this.#sha = sha1(this.#program.source);
    this.#send = sender(client);
    this.prefix = prefix;
    this.capacity = capacity;
    this.maxWaitNs = maxWait === undefined ? null : durationNs(maxWait, 'maxWait');
  }

  /** The Redis key of `key`: `<prefix>:{<key>}` (the braces a Cluster hash tag). */
  redisKey(key) {
    return `${this.prefix}:{${key}}`;
  }

  async #eval(args) {
    try {
      return await this.#send(['EVALSHA', this.#sha, ...args]);
    } catch (e) {
      if (!/NOSCRIPT/.test(String(e?.message ?? e))) throw e;
      return this.#send(['EVAL', this.#program.source, ...args]);
    }
  }

  /**
   * Takes `cost` from `key`'s bucket if it allows, never waits: `{ allowed, limit, remaining,
   * retryAfterMs, resetAfterMs }` (the times rounded up to whole ms).
   */
  async check(key, cost = 1) {
    if (!Number.isSafeInteger(cost) || cost < 0) throw new RangeError(`cost must be a whole number of zero or more, got ${cost}`);
    if (cost > this.capacity) throw new InsufficientCapacityError(cost, this.capacity);
    const reply = await this.#eval(['1', this.redisKey(String(key)), this.#program.stamp, String(cost)]);
    if (!Array.isArray(reply) || reply.length !== 4) throw new Error(`unexpected reply from the Redis script: ${JSON.stringify(reply)}`);
    const [allowed, remaining, retryNs, resetNs] = reply.map(Number);
    return {
      allowed: allowed === 1,
      limit: this.capacity,
      remaining,
      retryAfterMs: Math.ceil(retryNs / 1e6),
      resetAfterMs: Math.ceil(resetNs / 1e6),
    };
  }

  /** Whether `cost` was taken from `key`'s bucket now. */
  async tryAcquire(key, cost = 1) {
    return (await this.check(key, cost)).allowed;
  }

  /**
   * Runs `fn` once `cost` is taken from `key`'s bucket, waiting what Redis says between tries;
   * tasks of one key in this process go in FIFO order. Rejects with TimeoutError (with
   * `retryAfterMs`) when the wait would pass `maxWait`, AbortError when `signal` fires first.
   */
  schedule(key, fn, options = {}) {
    const { cost = 1, signal } = options;
    const maxWaitNs = options.maxWait === undefined ? this.maxWaitNs : durationNs(options.maxWait, 'maxWait');
    const k = String(key);
    const previous = this.#tails.get(k) ?? Promise.resolve();
    const admitted = previous.then(() => this.#acquire(k, cost, maxWaitNs, signal));
    const tail = admitted.then(() => {}, () => {});
    this.#tails.set(k, tail);
    tail.then(() => {
      if (this.#tails.get(k) === tail) this.#tails.delete(k);
    });
    if (!signal) return admitted.then(() => fn());
    // The signal rejects at once, even while earlier tasks of the key still go first; its
    // listener goes once this task is admitted or refused.
    let onAbort;
    const aborted = new Promise((_, reject) => {
      onAbort = () => reject(abortError(signal));
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
    const done = () => signal.removeEventListener('abort', onAbort);
    admitted.then(done, done);
    return Promise.race([admitted, aborted]).then(() => fn());
  }

  async #acquire(key, cost, maxWaitNs, signal) {
    const start = monotonicNow();
    for (;;) {
      if (signal?.aborted) throw abortError(signal);
      const d = await this.check(key, cost);
      if (d.allowed) return d;
      const waited = monotonicNow() - start;
      const waitNs = BigInt(d.retryAfterMs) * 1000000n;
      if (maxWaitNs !== null && waited + waitNs > maxWaitNs) {
        throw new TimeoutError(`the wait of ${d.retryAfterMs} ms would pass the maximum wait`, d.retryAfterMs, 'timeout');
      }
      await sleep(Math.max(1, d.retryAfterMs), signal);
    }
  }
}
