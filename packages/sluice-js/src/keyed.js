// keyed(): one rate limit per key, at most `maxKeys` of them, each new key in O(1).

import { CoreLimiter, ADMITTED, TOO_COSTLY, freeWithOwner } from './core.js';
import { RateLimiter, ADOPT, readConfig, wholeCost, maxDebtOption, agoOption } from './limiter.js';
import { ClosedError, InsufficientCapacityError, QueueFullError } from './errors.js';
import { monotonicNow } from './time.js';

// Where a key's node is: in the list of keys to drop (nothing waits), among the keys with
// waiters (never dropped), or in the list of forgotten keys (a memory, no bucket).
const LRU = 0, BUSY = 1, GONE = 2;

/**
 * A doubly linked list of nodes (`prev`, `next`), first out first: O(1) to append, unlink and
 * take the first. (A Map's first key is not O(1) in V8 once keys are deleted from its front:
 * `keys().next()` steps over the deleted slots until the table is rebuilt.)
 */
class List {
  head = null;
  tail = null;
  size = 0;

  push(node) {
    node.prev = this.tail;
    node.next = null;
    if (this.tail !== null) this.tail.next = node;
    else this.head = node;
    this.tail = node;
    this.size++;
  }

  unlink(node) {
    if (node.prev !== null) node.prev.next = node.next;
    else this.head = node.next;
    if (node.next !== null) node.next.prev = node.prev;
    else this.tail = node.prev;
    node.prev = node.next = null;
    this.size--;
  }

  *[Symbol.iterator]() {
    for (let n = this.head; n !== null; n = n.next) yield n;
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
 * Every step is O(1), one Map lookup for the key: its node says where it is. Keys without
 * waiters are on a list in the order of their last use (the first is the one to drop), keys
 * with waiters apart; a forgotten key's node stays in the Map as a memory, on a list of its own.
 * The memories are at most an eighth of `maxKeys` (at least 16); past that the oldest is folded
 * into a floor, a time before which every new key starts spent until then. A key's bucket is a
 * core limiter (the bucket of a dropped key is made afresh for the next); the RateLimiter of
 * get(key) is made only when asked for (or when a task of the key must wait).
 */
export class Keyed {
  /** key -> node { key, where, core, limiter, fullAt, prev, next }. */
  #nodes = new Map();
  /** Keys with nothing waiting, least recently used first. */
  #lru = new List();
  /** Keys with tasks waiting. */
  #busy = new List();
  /** Forgotten keys whose bucket was not full, oldest first (`fullAt`: when it is). */
  #gone = new List();
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
    const lists = [this.#lru, this.#busy];
    freeWithOwner(this, function* cores() {
      for (const list of lists) for (const n of list) yield n.core;
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
    const n = this.#nodes.get(key);
    return n !== undefined && n.where !== GONE;
  }

  /** The live node of `key` at `now`, made (and an old key dropped) if needed. */
  #node(key, now) {
    if (this.#closed) throw new ClosedError('keyed() was closed');
    let n = this.#nodes.get(key);
    let until = 0n;
    if (n !== undefined) {
      if (n.where === LRU) {
        if (n.core.handle >= 0) {
          this.#lru.unlink(n);
          if (n.limiter !== null && n.limiter.pending > 0) {
            n.where = BUSY;
            this.#busy.push(n);
          } else {
            this.#lru.push(n);
          }
          return n;
        }
        // Its limiter was closed by hand: the key starts again, as a new one.
        this.#lru.unlink(n);
        this.#nodes.delete(key);
        n = undefined;
      } else if (n.where === BUSY) {
        if (n.limiter.pending === 0) {
          this.#busy.unlink(n);
          n.where = LRU;
          this.#lru.push(n);
        }
        return n;
      } else {
        // Forgotten with spending to recover: back no fuller than it left.
        this.#gone.unlink(n);
        until = n.fullAt;
      }
    }
    if (this.#floor !== null) {
      if (this.#floor <= now) this.#floor = null;
      else if (this.#floor > until) until = this.#floor;
    }
    // The bucket of a dropped key is made afresh for this one (no allocation), else a new one.
    let core = this.size >= this.#maxKeys ? this.#makeRoom(now, until) : null;
    if (core === null) {
      const c = this.#config;
      core = new CoreLimiter(c.kind, c.capacityN, c.intervalNs, c.depth, c.maxWaitNs, false);
      if (until > now) core.reset(now, until);
    }
    if (n === undefined) {
      n = { key, where: LRU, core, limiter: null, fullAt: 0n, prev: null, next: null };
      this.#nodes.set(key, n);
    } else {
      n.where = LRU;
      n.core = core;
    }
    this.#lru.push(n);
    return n;
  }

  /** The RateLimiter of `key`, made (and an old key dropped) if needed. */
  get(key) {
    const n = this.#node(key, this.#now());
    n.limiter ??= new RateLimiter({ ...this.#options, [ADOPT]: { core: n.core, config: this.#config } });
    return n.limiter;
  }

  /**
   * Drops the least recently used key with nothing waiting, remembering it if its bucket is
   * not full again. Returns its core limiter, made afresh for the next key (no fuller than a
   * bucket full at `until`), when nothing else holds it; null when it had a RateLimiter (now
   * closed).
   */
  #makeRoom(now, until) {
    for (;;) {
      const n = this.#lru.head;
      if (n === null) {
        if (this.#settleBusy()) continue;
        throw new QueueFullError(`maxKeys (${this.#maxKeys}) reached and every key has waiting tasks`);
      }
      this.#lru.unlink(n);
      if (n.limiter !== null && n.limiter.pending > 0) {
        // Waiters came through get(key).schedule(): it is busy, not a key to drop.
        n.where = BUSY;
        this.#busy.push(n);
        continue;
      }
      const core = n.core;
      const reuse = n.limiter === null && core.handle >= 0;
      // One call to the core for the key that goes and the one that comes, when they share it.
      const untilFull = reuse ? core.recycle(now, until) : core.handle >= 0 ? BigInt(core.untilFull(now)) : 0n;
      if (untilFull > 0n) this.#remember(n, now, now + untilFull);
      else this.#nodes.delete(n.key);
      n.core = null;
      if (reuse) return core;
      n.limiter?.close();
      n.limiter = null;
      return null;
    }
  }

  /** Moves the busy keys whose waiters have all gone back among the others; whether any did. */
  #settleBusy() {
    let moved = false;
    for (let n = this.#busy.head; n !== null;) {
      const next = n.next;
      if (n.limiter.pending === 0) {
        this.#busy.unlink(n);
        n.where = LRU;
        this.#lru.push(n);
        moved = true;
      }
      n = next;
    }
    return moved;
  }

  /** Keeps `n` as a memory: its key is full again at `fullAt`. */
  #remember(n, now, fullAt) {
    const gone = this.#gone;
    // Memories already past go from the front as they are met: nothing to hold against them.
    while (gone.head !== null && gone.head.fullAt <= now) this.#forget(gone.head);
    if (gone.size >= this.#maxGone) {
      // The oldest memory folds into the floor: every new key is then held to it.
      const oldest = gone.head;
      if (this.#floor === null || oldest.fullAt > this.#floor) this.#floor = oldest.fullAt;
      this.#forget(oldest);
    }
    n.where = GONE;
    n.fullAt = fullAt;
    gone.push(n);
  }

  #forget(n) {
    this.#gone.unlink(n);
    this.#nodes.delete(n.key);
  }

  /** Takes `cost` from `key`'s bucket if it is there now and nobody waits; false once closed. */
  tryAcquire(key, cost = 1) {
    if (this.#closed) return false;
    const now = this.#now();
    const n = this.#node(key, now);
    if (n.limiter !== null) return n.limiter.tryAcquire(cost);
    if (!Number.isSafeInteger(cost) || cost < 0) {
      throw new RangeError(`cost must be a whole number of zero or more, got ${cost}`);
    }
    const code = n.core.offerNow(now, cost === 1 ? 1n : BigInt(cost));
    if (code === ADMITTED) return true;
    if (code === TOO_COSTLY) throw new InsufficientCapacityError(cost, this.#config.capacity);
    return false;
  }

  /**
   * Takes `cost` from `key`'s bucket now without asking (see RateLimiter.charge): a bucket
   * goes up to `maxDebt` tokens beyond empty (default: no cap) and the key is refused until
   * the refill has paid it; a window takes what it has left. Returns the part forgiven (all of
   * it once closed). A key in debt that is dropped for a new one is remembered until its debt
   * is paid and its bucket full again, so that it comes back no fuller than it left.
   */
  charge(key, cost, options = {}) {
    const costN = wholeCost(cost);
    const maxDebt = maxDebtOption(options.maxDebt);
    if (this.#closed) return cost;
    if (costN === 0n) return 0;
    const now = this.#now();
    const n = this.#node(key, now);
    if (n.limiter !== null) return n.limiter.charge(cost, options);
    return n.core.charge(now, costN, maxDebt);
  }

  /**
   * Gives back `cost` admitted for `key` `ago` (default 0) that will never be used (see
   * RateLimiter.refund). A key not held now (never seen, dropped, or only remembered) gets
   * nothing back: it was full again, or is remembered only as a moment it is spent until.
   */
  refund(key, cost, options = {}) {
    const costN = wholeCost(cost);
    const agoNs = agoOption(options.ago);
    if (this.#closed || costN === 0n) return;
    const n = this.#nodes.get(key);
    if (n === undefined || n.where === GONE) return;
    if (n.limiter !== null) n.limiter.refund(cost, options);
    else if (n.core.handle >= 0) n.core.refund(this.#now(), costN, agoNs);
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
    const n = this.#nodes.get(key);
    if (l.pending > 0 && n !== undefined && n.where === LRU && n.limiter === l) {
      this.#lru.unlink(n);
      n.where = BUSY;
      this.#busy.push(n);
      const settle = () => {
        if (l.pending === 0 && n.where === BUSY && n.limiter === l) {
          this.#busy.unlink(n);
          n.where = LRU;
          this.#lru.push(n);
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
    for (const list of [this.#lru, this.#busy]) {
      for (const n of list) {
        if (n.limiter !== null) n.limiter.reconfigure(options);
        else if (n.core.handle >= 0) n.core.reconfigure(this.#now(), c.kind, c.capacityN, c.intervalNs, c.depth, c.maxWaitNs);
      }
    }
  }

  /** Closes every key's limiter (their waiters reject with ClosedError); no key is made after. */
  close() {
    this.#closed = true;
    for (const list of [this.#lru, this.#busy]) {
      for (const n of list) {
        if (n.limiter !== null) n.limiter.close();
        else n.core.free();
      }
    }
    this.#nodes.clear();
    this.#lru = new List();
    this.#busy = new List();
    this.#gone = new List();
  }
}

/** A rate limit per key, at most `maxKeys` of them: `new Keyed(options)`. */
export function keyed(options = {}) {
  return new Keyed(options);
}
