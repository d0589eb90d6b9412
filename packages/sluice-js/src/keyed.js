// keyed(): one RateLimiter per key, at most `maxKeys` of them, each new key in O(1).

import { CoreLimiter, ADMITTED, TOO_COSTLY, freeWithOwner } from './core.js';
import { RateLimiter, ADOPT, readConfig } from './limiter.js';
import { ClosedError, InsufficientCapacityError, QueueFullError } from './errors.js';
import { monotonicNow } from './time.js';

/**
 * A Map that keeps its keys in order with O(1) access to the first: a Map of nodes threaded on
 * a doubly linked list. (A plain Map's first key is not O(1) in V8 once keys are deleted from
 * its front: `keys().next()` steps over the deleted slots until the table is rebuilt.)
 */
class OrderedMap {
  #nodes = new Map();
  #head = null;
  #tail = null;

  get size() {
    return this.#nodes.size;
  }

  get(key) {
    return this.#nodes.get(key)?.value;
  }

  has(key) {
    return this.#nodes.has(key);
  }

  /** Sets `key` last (moving it there if present). */
  set(key, value) {
    let node = this.#nodes.get(key);
    if (node !== undefined) {
      this.#unlink(node);
      node.value = value;
    } else {
      node = { key, value, prev: null, next: null };
      this.#nodes.set(key, node);
    }
    node.prev = this.#tail;
    if (this.#tail !== null) this.#tail.next = node;
    else this.#head = node;
    this.#tail = node;
  }

  delete(key) {
    const node = this.#nodes.get(key);
    if (node === undefined) return false;
    this.#unlink(node);
    this.#nodes.delete(key);
    return true;
  }

  /** The first key, or undefined. */
  firstKey() {
    return this.#head?.key;
  }

  /** The first value, or undefined. */
  firstValue() {
    return this.#head?.value;
  }

  #unlink(node) {
    if (node.prev !== null) node.prev.next = node.next;
    else this.#head = node.next;
    if (node.next !== null) node.next.prev = node.prev;
    else this.#tail = node.prev;
    node.prev = node.next = null;
  }

  *values() {
    for (let n = this.#head; n !== null; n = n.next) yield n.value;
  }

  clear() {
    this.#nodes.clear();
    this.#head = this.#tail = null;
  }
}

/**
 * A rate limit per key (a user, an IP, a host), made on first use with the limiter options.
 * At most `maxKeys` are kept. A new key drops the least recently used key that has no task
 * waiting; if that key's bucket is not full again yet, the key and the moment it would be are
 * remembered, so that it comes back no fuller than it left (a key never gains tokens by being
 * forgotten). A key with waiting tasks is never dropped; with every key waiting, a new key is
 * refused (QueueFullError).
 *
 * Every step is O(1): keys without waiters sit in the order of their last use (the first is
 * the one to drop), keys with waiters apart. The remembered keys are at most an eighth of
 * `maxKeys` (at least 16); past that the oldest memory is folded into a floor, a time before
 * which every new key starts spent until then. A key is a bucket in the core; the RateLimiter
 * of get(key) is made for it only when asked for (or when a task of the key must wait).
 */
export class Keyed {
  /** Keys with nothing waiting, least recently used first: key -> entry { core, limiter }. */
  #lru = new OrderedMap();
  /** Keys with tasks waiting: never dropped. */
  #busy = new Map();
  /** Forgotten keys whose bucket was not full, oldest first: key -> when it is full again (ns). */
  #gone = new OrderedMap();
  #maxGone;
  /** Every key made before this moment (ns of the clock) starts spent until it. */
  #floor = null;
  #maxKeys;
  #options;
  #config;
  #now;
  #closed = false;

  constructor(options = {}) {
    const { maxKeys = 100000, ...limiterOptions } = options;
    if (!(Number.isSafeInteger(maxKeys) && maxKeys >= 1)) {
      throw new RangeError(`maxKeys must be a whole number of at least 1, got ${maxKeys}`);
    }
    // Validate the options once, now, rather than at the first key.
    new RateLimiter(limiterOptions).close();
    this.#maxKeys = maxKeys;
    this.#maxGone = Math.max(16, Math.ceil(maxKeys / 8));
    this.#options = limiterOptions;
    this.#config = readConfig(limiterOptions);
    this.#now = limiterOptions.now ?? monotonicNow;
    // The keys' core limiters are made unowned: freed with this table if it is dropped unclosed.
    const lru = this.#lru;
    const busy = this.#busy;
    freeWithOwner(this, function* cores() {
      for (const e of lru.values()) yield e.core;
      for (const e of busy.values()) yield e.core;
    });
  }

  /** The most keys kept. */
  get maxKeys() {
    return this.#maxKeys;
  }

  /** Keys held now. */
  get size() {
    return this.#lru.size + this.#busy.size;
  }

  /** Whether `key` has a limiter now. */
  has(key) {
    return this.#lru.has(key) || this.#busy.has(key);
  }

  /** The entry of `key` ({ core, limiter }) at `now`, made (and an old key dropped) if needed. */
  #entry(key, now) {
    if (this.#closed) throw new ClosedError('keyed() was closed');
    let e = this.#lru.get(key);
    if (e !== undefined) {
      if (e.core.handle < 0) {
        // Its limiter was closed by hand: the key starts again.
        this.#lru.delete(key);
      } else {
        if (e.limiter !== null && e.limiter.pending > 0) {
          this.#lru.delete(key);
          this.#busy.set(key, e);
        } else {
          this.#lru.set(key, e);
        }
        return e;
      }
    }
    e = this.#busy.get(key);
    if (e !== undefined) {
      if (e.limiter.pending === 0) {
        this.#busy.delete(key);
        this.#lru.set(key, e);
      }
      return e;
    }
    // The bucket of a dropped key is made afresh for this one (no allocation), else a new one.
    let core = this.size >= this.#maxKeys ? this.#makeRoom(now) : null;
    const until = this.#until(key, now);
    if (core !== null) {
      core.reset(now, until);
    } else {
      const c = this.#config;
      core = new CoreLimiter(c.kind, c.capacityN, c.intervalNs, c.depth, c.maxWaitNs, false);
      if (until > now) core.reset(now, until);
    }
    e = { core, limiter: null };
    this.#lru.set(key, e);
    return e;
  }

  /** The RateLimiter of `key`, made (and an old key dropped) if needed. */
  get(key) {
    const e = this.#entry(key, this.#now());
    e.limiter ??= new RateLimiter({ ...this.#options, [ADOPT]: { core: e.core, config: this.#config } });
    return e.limiter;
  }

  /**
   * Drops the least recently used key with nothing waiting. Returns its core limiter for the
   * next key when nothing else holds it (null when it had a RateLimiter, now closed).
   */
  #makeRoom(now) {
    for (;;) {
      const key = this.#lru.firstKey();
      const e = this.#lru.firstValue();
      if (e === undefined) {
        if (this.#settleBusy()) continue;
        throw new QueueFullError(`maxKeys (${this.#maxKeys}) reached and every key has waiting tasks`);
      }
      this.#lru.delete(key);
      if (e.limiter !== null && e.limiter.pending > 0) {
        // Waiters came through get(key).schedule(): it is busy, not a key to drop.
        this.#busy.set(key, e);
        continue;
      }
      if (e.core.handle >= 0) {
        const untilFull = e.core.untilFull(now);
        if (untilFull > 0) this.#remember(key, now, now + BigInt(untilFull));
      }
      if (e.limiter === null && e.core.handle >= 0) return e.core;
      e.limiter?.close();
      return null;
    }
  }

  /** Moves the busy keys whose waiters have all gone back among the others; whether any did. */
  #settleBusy() {
    let moved = false;
    for (const [key, e] of this.#busy) {
      if (e.limiter.pending === 0) {
        this.#busy.delete(key);
        this.#lru.set(key, e);
        moved = true;
      }
    }
    return moved;
  }

  #remember(key, now, fullAt) {
    // Memories already past go from the front as they are met: nothing to hold against them.
    while (this.#gone.size > 0 && this.#gone.firstValue() <= now) this.#gone.delete(this.#gone.firstKey());
    if (this.#gone.size >= this.#maxGone) {
      // The oldest memory folds into the floor: every new key is then held to it.
      const oldest = this.#gone.firstKey();
      const at = this.#gone.firstValue();
      this.#gone.delete(oldest);
      if (this.#floor === null || at > this.#floor) this.#floor = at;
    }
    this.#gone.set(key, fullAt);
  }

  /** When a new key's bucket may be full at the earliest: when it was when forgotten, or the floor (0n: now). */
  #until(key, now) {
    let until = 0n;
    if (this.#gone.size > 0) {
      const remembered = this.#gone.get(key);
      if (remembered !== undefined) {
        this.#gone.delete(key);
        until = remembered;
      }
    }
    if (this.#floor !== null) {
      if (this.#floor <= now) this.#floor = null;
      else if (this.#floor > until) until = this.#floor;
    }
    return until;
  }

  /** Takes `cost` from `key`'s bucket if it is there now and nobody waits; false once closed. */
  tryAcquire(key, cost = 1) {
    if (this.#closed) return false;
    const now = this.#now();
    const e = this.#entry(key, now);
    if (e.limiter !== null) return e.limiter.tryAcquire(cost);
    if (!Number.isSafeInteger(cost) || cost < 0) {
      throw new RangeError(`cost must be a whole number of zero or more, got ${cost}`);
    }
    const code = e.core.offer(now, cost === 1 ? 1n : BigInt(cost), 1, 0n);
    if (code === ADMITTED) return true;
    if (code === TOO_COSTLY) throw new InsufficientCapacityError(cost, this.#config.capacity);
    return false;
  }

  /** `schedule(fn, options)` on `key`'s limiter. */
  schedule(key, fn, options) {
    let l;
    try {
      l = this.get(key);
    } catch (e) {
      return Promise.reject(e);
    }
    const p = l.schedule(fn, options);
    const e = this.#lru.get(key);
    if (l.pending > 0 && e !== undefined && e.limiter === l) {
      this.#lru.delete(key);
      this.#busy.set(key, e);
      const settle = () => {
        if (l.pending === 0 && this.#busy.get(key) === e) {
          this.#busy.delete(key);
          this.#lru.set(key, e);
        }
      };
      p.then(settle, settle);
    }
    return p;
  }

  /** `fn` limited per key: `(key, ...args) => schedule(key, () => fn(key, ...args))`. */
  wrap(fn, options) {
    if (typeof fn !== 'function') throw new TypeError('wrap needs a function');
    return (key, ...args) => this.schedule(key, () => fn(key, ...args), options);
  }

  /**
   * Changes the quota of every key (and of keys made from now on) in place, each converted
   * so that none gains tokens (see RateLimiter.reconfigure).
   */
  reconfigure(options) {
    if (this.#closed) throw new ClosedError('keyed() was closed');
    const next = { ...this.#options, ...options };
    new RateLimiter(next).close();
    this.#options = next;
    this.#config = readConfig(next);
    const c = this.#config;
    for (const e of [...this.#lru.values(), ...this.#busy.values()]) {
      if (e.limiter !== null) e.limiter.reconfigure(options);
      else if (e.core.handle >= 0) e.core.reconfigure(this.#now(), c.kind, c.capacityN, c.intervalNs, c.depth, c.maxWaitNs);
    }
  }

  /** Closes every key's limiter (their waiters reject with ClosedError); no key is made after. */
  close() {
    this.#closed = true;
    for (const e of [...this.#lru.values(), ...this.#busy.values()]) {
      if (e.limiter !== null) e.limiter.close();
      else e.core.free();
    }
    this.#lru.clear();
    this.#busy.clear();
    this.#gone.clear();
  }
}

/** A rate limit per key, at most `maxKeys` of them: `new Keyed(options)`. */
export function keyed(options = {}) {
  return new Keyed(options);
}
