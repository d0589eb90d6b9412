// sluice-limits/redis (Node): a rate limit shared through Redis, running the very scripts and
// key layout of the Rust crate's Redis store, so that Node processes and `sluice serve` on one
// Redis and prefix spend one bucket. Single Redis or Redis Cluster, through node-redis or
// ioredis; when Redis does not answer in time, a decision by `onError` as the gateway makes it.

import { createHash } from 'node:crypto';

import { algorithmCode, keyHash, rateIntervalNs, CoreLimiter } from './core.js';
import { MAX_OWED_NS, program } from './redis-program.js';
import { InsufficientCapacityError, TimeoutError, UnavailableError, abortError } from './errors.js';
import { Keyed } from './keyed.js';
import { sender } from './redis-client.js';
import { CHECK, agoOption, maxDebtOption, wholeCost } from './limiter.js';
import { durationNs, monotonicNow, nsToMsCeil, sleep } from './time.js';

export { RedisPacerStore } from './redis-pacer.js';

const sha1 = (text) => createHash('sha1').update(text).digest('hex');

const ON_ERROR = new Set(['local', 'allow', 'deny', 'throw']);
/** After Redis failed, it is not asked again for this long (decisions follow onError). */
const DEFAULT_RETRY_INTERVAL = 250;

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
  #timeoutMs;
  #onError;
  #retryIntervalMs;
  #downUntil = 0;
  #local = null;
  #salt;

  constructor(options = {}) {
    const {
      client, prefix = 'sluice', algorithm = 'token_bucket', capacity, rate, maxWait,
      timeout = 250, onError = 'local', retryInterval = DEFAULT_RETRY_INTERVAL, keySalt,
    } = options;
    if (!Number.isSafeInteger(capacity) || capacity < 1) {
      throw new RangeError(`capacity must be a whole number of at least 1, got ${capacity}`);
    }
    if (typeof prefix !== 'string' || prefix === '') throw new TypeError('prefix must be a non-empty string');
    if (!ON_ERROR.has(onError)) throw new RangeError(`onError must be 'local', 'allow', 'deny' or 'throw', got ${JSON.stringify(onError)}`);
    const intervalNs = rateIntervalNs(rate);
    // The core validates the quota as the gateway does.
    new CoreLimiter(algorithmCode(algorithm), BigInt(capacity), intervalNs, 0, 0n).free();
    this.#program = program(algorithm, BigInt(capacity), intervalNs);
    this.#sha = sha1(this.#program.source);
    this.#send = sender(client);
    const timeoutNs = durationNs(timeout, 'timeout');
    this.#timeoutMs = timeoutNs === null ? Infinity : Math.max(1, nsToMsCeil(timeoutNs));
    this.#retryIntervalMs = nsToMsCeil(durationNs(retryInterval, 'retryInterval') ?? 0n);
    this.#onError = onError;
    if (keySalt !== undefined && keySalt !== null) keyHash(keySalt, ''); // checks its type now
    this.#salt = keySalt ?? null;
    this.prefix = prefix;
    this.capacity = capacity;
    this.algorithm = this.#program.kind;
    this.rate = rate;
    this.maxWaitNs = maxWait === undefined ? null : durationNs(maxWait, 'maxWait');
  }

  /**
   * The Redis key of `key`: `<prefix>:{<key>}` (the braces a Cluster hash tag); with
   * `keySalt`, `<prefix>:{<keyHash(keySalt, key)>}`, as the gateway stores keys taken from
   * headers, cookies and query parameters.
   */
  redisKey(key) {
    const k = String(key);
    return `${this.prefix}:{${this.#salt === null ? k : keyHash(this.#salt, k)}}`;
  }

  async #eval(redisKey, args) {
    try {
      return await this.#send(redisKey, ['EVALSHA', this.#sha, '1', redisKey, ...args]);
    } catch (e) {
      if (!/NOSCRIPT/.test(String(e?.message ?? e))) throw e;
      return this.#send(redisKey, ['EVAL', this.#program.source, '1', redisKey, ...args]);
    }
  }

  /** The script's answer, or a rejection once `timeout` has passed without one. */
  #withTimeout(promise) {
    if (this.#timeoutMs === Infinity) return promise;
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`Redis did not answer within ${this.#timeoutMs} ms`)), this.#timeoutMs);
    });
    // A late answer (or error) after the timeout is dropped.
    promise.catch(() => {});
    return Promise.race([promise, late]).finally(() => clearTimeout(timer));
  }

  /** The limiter of this process that decides while Redis does not answer (onError 'local'). */
  #localKeyed() {
    this.#local ??= new Keyed({ maxKeys: 100000, algorithm: this.#program.kind, capacity: this.capacity, rate: this.rate, queue: false });
    return this.#local;
  }

  /** What `onError` decides without Redis. */
  #fallback(key, cost, cause) {
    const retryAfterMs = Math.max(0, Math.ceil(this.#downUntil - performance.now()));
    switch (this.#onError) {
      case 'allow':
        return { allowed: true, limit: this.capacity, remaining: this.capacity - cost, retryAfterMs: 0, resetAfterMs: 0, source: 'allow' };
      case 'deny':
        return { allowed: false, limit: this.capacity, remaining: 0, retryAfterMs: Math.max(1, retryAfterMs), resetAfterMs: 0, source: 'deny' };
      case 'throw':
        throw new UnavailableError(`Redis is unavailable: ${cause?.message ?? cause}`, retryAfterMs, { cause });
      default: {
        // Decided in this process with the same quota: each process holds the limit on its
        // own share of the traffic until Redis answers again.
        return { ...this.#localKeyed().get(key)[CHECK](cost), source: 'local' };
      }
    }
  }

  /**
   * Takes `cost` from `key`'s bucket if it allows, never waits: `{ allowed, limit, remaining,
   * retryAfterMs, resetAfterMs, source }` (the times rounded up to whole ms). `source` is
   * 'redis', or what `onError` decided while Redis did not answer ('local', 'allow', 'deny').
   */
  async check(key, cost = 1) {
    if (!Number.isSafeInteger(cost) || cost < 0) throw new RangeError(`cost must be a whole number of zero or more, got ${cost}`);
    if (cost > this.capacity) throw new InsufficientCapacityError(cost, this.capacity);
    const k = String(key);
    if (performance.now() < this.#downUntil) return this.#fallback(k, cost, new Error('Redis failed moments ago'));
    const redisKey = this.redisKey(k);
    let reply;
    try {
      reply = await this.#withTimeout(this.#eval(redisKey, [this.#program.stamp, String(cost)]));
    } catch (e) {
      this.#downUntil = performance.now() + this.#retryIntervalMs;
      return this.#fallback(k, cost, e);
    }
    if (!Array.isArray(reply) || reply.length !== 4) throw new Error(`unexpected reply from the Redis script: ${JSON.stringify(reply)}`);
    const [allowed, remaining, retryNs, resetNs] = reply.map(Number);
    return {
      allowed: allowed === 1,
      limit: this.capacity,
      remaining,
      retryAfterMs: Math.ceil(retryNs / 1e6),
      resetAfterMs: Math.ceil(resetNs / 1e6),
      source: 'redis',
    };
  }

  /**
   * Takes `cost` from `key`'s bucket now without asking, in Redis (the scripts' charge, as
   * `sluice serve` settles a cost): a bucket (gcra, token_bucket, leaky_bucket) takes all of
   * it, going up to `maxDebt` tokens beyond empty (default: no cap; Redis counts at most 2^53
   * ns, about 104 days, of refill owed), and the key is refused, by this store and by the
   * gateway, until the refill has paid the debt. A window takes what it has left. Resolves to
   * the part of `cost` that was not taken, forgiven (0 when all was).
   *
   * While Redis does not answer, `onError` decides: 'local' charges this process's limiter
   * (the one that decides meanwhile), 'throw' rejects with UnavailableError, 'allow' and
   * 'deny' charge nothing. A charge Redis did not answer charges nothing: all of `cost` is
   * forgiven (or UnavailableError with 'throw').
   */
  async charge(key, cost, options = {}) {
    const costN = wholeCost(cost);
    const maxDebt = maxDebtOption(options.maxDebt);
    if (costN === 0n) return 0;
    const k = String(key);
    if (performance.now() < this.#downUntil) return this.#unanswered(k, cost, options, new Error('Redis failed moments ago'));
    // ARGV as the Rust crate's charge_command sends them: stamp, cost, '' (Redis's time), 'c',
    // and the most the key may owe in ns of refill, its window included (at most 2^53).
    const { window, intervalNs, stamp } = this.#program;
    let most = maxDebt < 0n ? MAX_OWED_NS : window + maxDebt * intervalNs;
    if (most > MAX_OWED_NS) most = MAX_OWED_NS;
    let reply;
    try {
      reply = await this.#withTimeout(this.#eval(this.redisKey(k), [stamp, String(costN), '', 'c', String(most)]));
    } catch (e) {
      this.#downUntil = performance.now() + this.#retryIntervalMs;
      if (this.#onError === 'throw') throw new UnavailableError(`Redis is unavailable: ${e?.message ?? e}`, this.#retryIntervalMs, { cause: e });
      return cost;
    }
    if (!Array.isArray(reply) || reply.length !== 5) throw new Error(`unexpected reply from the Redis script: ${JSON.stringify(reply)}`);
    const taken = Number(reply[4]);
    return taken >= cost ? 0 : cost - taken;
  }

  /**
   * Gives back `cost` admitted for `key` `ago` (a duration, default 0) that will never be used,
   * in Redis (the scripts' refund): a debt shrinks first, a bucket never holds more than when
   * it was full, a window gives back only what it counted in a window it still holds. While
   * Redis does not answer, `onError` 'local' gives it back to this process's limiter;
   * otherwise the tokens stay spent.
   */
  async refund(key, cost, options = {}) {
    const costN = wholeCost(cost);
    const agoNs = agoOption(options.ago);
    if (costN === 0n) return;
    const k = String(key);
    if (performance.now() < this.#downUntil) {
      if (this.#onError === 'local') this.#localKeyed().refund(k, cost, options);
      return;
    }
    try {
      await this.#withTimeout(this.#eval(this.redisKey(k), [this.#program.stamp, String(costN), '', String(agoNs)]));
    } catch {
      // Unanswered: the tokens stay spent.
      this.#downUntil = performance.now() + this.#retryIntervalMs;
    }
  }

  /** What a charge comes to while Redis is known not to answer: as `onError` says. */
  #unanswered(key, cost, options, cause) {
    switch (this.#onError) {
      case 'local':
        return this.#localKeyed().charge(key, cost, options);
      case 'throw':
        throw new UnavailableError(`Redis is unavailable: ${cause?.message ?? cause}`, Math.max(0, Math.ceil(this.#downUntil - performance.now())), { cause });
      default:
        return cost;
    }
  }

  /** Whether `cost` was taken from `key`'s bucket now. */
  async tryAcquire(key, cost = 1) {
    return (await this.check(key, cost)).allowed;
  }

  /**
   * Runs `fn()` once `cost` is taken from `key`'s bucket, waiting what Redis says between
   * tries; tasks of one key in this process go in FIFO order. `maxWait` counts from this call,
   * time spent behind earlier tasks of the key included: TimeoutError (with `retryAfterMs`)
   * as soon as the wait is known to pass it ('timeout'), or when it passes while the task is
   * still behind others ('expired'). AbortError when `signal` fires first.
   */
  schedule(key, fn, options = {}) {
    const { cost = 1, signal } = options;
    let maxWaitNs;
    try {
      maxWaitNs = options.maxWait === undefined ? this.maxWaitNs : durationNs(options.maxWait, 'maxWait');
    } catch (e) {
      return Promise.reject(e);
    }
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const k = String(key);
    const deadline = maxWaitNs === null ? null : monotonicNow() + maxWaitNs;
    // Aborted when this task gives up (its signal, its deadline): its tries and sleeps stop.
    const stop = new AbortController();
    let settle;
    const admitted = new Promise((resolve, reject) => {
      settle = { resolve, reject };
    });
    let timer = null;
    let over = false;
    const finish = (ok, value) => {
      if (over) return;
      over = true;
      if (timer !== null) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      if (ok) settle.resolve(value);
      else {
        stop.abort(value);
        settle.reject(value);
      }
    };
    const onAbort = () => finish(false, abortError(signal));
    signal?.addEventListener('abort', onAbort, { once: true });
    if (deadline !== null) {
      timer = setTimeout(() => {
        timer = null;
        finish(false, new TimeoutError(`waited past the maximum wait of ${nsToMsCeil(maxWaitNs)} ms`, 0, 'expired'));
      }, nsToMsCeil(maxWaitNs));
    }
    const previous = this.#tails.get(k) ?? Promise.resolve();
    const turn = previous.then(() => {
      if (over) return undefined;
      // Its turn: from here the tries themselves keep to the deadline, refusing as soon as the
      // wait Redis names would pass it.
      if (timer !== null) clearTimeout(timer);
      timer = null;
      return this.#acquire(k, cost, deadline, stop.signal).then((d) => finish(true, d), (e) => finish(false, stop.signal.aborted ? stop.signal.reason : e));
    });
    const tail = turn.then(() => {}, () => {});
    this.#tails.set(k, tail);
    tail.then(() => {
      if (this.#tails.get(k) === tail) this.#tails.delete(k);
    });
    return admitted.then(() => fn());
  }

  async #acquire(key, cost, deadline, stop) {
    for (;;) {
      if (stop.aborted) throw stop.reason;
      const d = await this.check(key, cost);
      if (stop.aborted) throw stop.reason;
      if (d.allowed) return d;
      const waitNs = BigInt(d.retryAfterMs) * 1000000n;
      if (deadline !== null && monotonicNow() + waitNs > deadline) {
        throw new TimeoutError(`the wait of ${d.retryAfterMs} ms would pass the maximum wait`, d.retryAfterMs, 'timeout');
      }
      await sleep(Math.max(1, d.retryAfterMs), stop);
    }
  }
}
