// keyed(): one RateLimiter per key, at most `maxKeys` of them.

import { RateLimiter } from './limiter.js';
import { QueueFullError } from './errors.js';

/**
 * A RateLimiter per key (a user, an IP, a host), made on first use with `options`. At most
 * `maxKeys` are kept: a new key first drops a key whose bucket is full with nothing waiting
 * (dropping it loses nothing), else the least recently used key with nothing waiting; a key
 * with waiters is never dropped. With every key waiting, a new key is refused (QueueFullError).
 */
export function keyed(options = {}) {
  const { maxKeys = 100000, ...limiterOptions } = options;
  if (!(Number.isSafeInteger(maxKeys) && maxKeys >= 1)) {
    throw new RangeError(`maxKeys must be a whole number of at least 1, got ${maxKeys}`);
  }
  // Validate the options once, now, rather than at the first key.
  new RateLimiter(limiterOptions).close();
  return new Keyed(maxKeys, limiterOptions);
}

export class Keyed {
  // Insertion order is recency: a used key is moved to the end.
  #limiters = new Map();
  #maxKeys;
  #options;

  constructor(maxKeys, options) {
    this.#maxKeys = maxKeys;
    this.#options = options;
  }

  /** Keys held now. */
  get size() {
    return this.#limiters.size;
  }

  /** Whether `key` has a limiter now. */
  has(key) {
    return this.#limiters.has(key);
  }

  /** The limiter of `key`, made (and an old key dropped) if needed. */
  get(key) {
    let l = this.#limiters.get(key);
    if (l) {
      this.#limiters.delete(key);
      this.#limiters.set(key, l);
      return l;
    }
    if (this.#limiters.size >= this.#maxKeys) this.#evict();
    l = new RateLimiter(this.#options);
    this.#limiters.set(key, l);
    return l;
  }

  #evict() {
    let fallback;
    for (const [key, l] of this.#limiters) {
      if (l.pending > 0) continue;
      if (l.isIdle()) return this.#drop(key, l);
      fallback ??= key;
    }
    if (fallback === undefined) {
      throw new QueueFullError(`maxKeys (${this.#maxKeys}) reached and every key has waiting tasks`);
    }
    this.#drop(fallback, this.#limiters.get(fallback));
  }

  #drop(key, l) {
    this.#limiters.delete(key);
    l.close();
  }

  /** `tryAcquire(cost)` on `key`'s limiter. */
  tryAcquire(key, cost = 1) {
    return this.get(key).tryAcquire(cost);
  }

  /** `schedule(fn, options)` on `key`'s limiter. */
  schedule(key, fn, options) {
    let l;
    try {
      l = this.get(key);
    } catch (e) {
      return Promise.reject(e);
    }
    return l.schedule(fn, options);
  }

  /** Closes every key's limiter. */
  close() {
    for (const l of this.#limiters.values()) l.close();
    this.#limiters.clear();
  }
}
