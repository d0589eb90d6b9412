// limit(): one object that enforces a concurrency bound and a rate together.

import { PromisePool } from './pool.js';
import { RateLimiter, defaultTimers } from './limiter.js';
import { TimeoutError } from './errors.js';
import { Observed, CHANGED, EMIT } from './events.js';
import { durationNs, monotonicNow } from './time.js';

const I64_MAX = 9223372036854775807n;
const NO_OPTIONS = Object.freeze({});

/**
 * At most `concurrency` tasks running, started at most at `rate` (with `capacity` as the
 * burst). A task first waits for a slot, then for its tokens, so the tokens are spent only by
 * tasks about to start. Its priority orders both waits; its `maxWait` (or the queue's) bounds
 * both together.
 */
class Limit extends Observed {
  #pool;
  #limiter;
  #now;
  #maxWaitNs;
  #wired = false;

  constructor(options) {
    super();
    const { concurrency = Infinity, rate, capacity, now, timers, timeout, ...rest } = options;
    this.#now = now ?? monotonicNow;
    const clock = { now: this.#now, timers: timers ?? defaultTimers };
    // The run timeout bounds fn: the limiter's when there is one (the pool's task also waits
    // for the tokens).
    this.#pool = new PromisePool({ concurrency, ...clock, timeout: rate === undefined ? timeout : undefined });
    this.#limiter = rate === undefined ? null : new RateLimiter({ capacity: capacity ?? 1, rate, ...rest, ...clock, timeout });
    const maxWait = rest.queue ? rest.queue.maxWait : undefined;
    this.#maxWaitNs = maxWait === undefined ? null : durationNs(maxWait, 'queue.maxWait');
  }

  /**
   * Listens to the pool and the limiter, on the first listener or promise of this object
   * only: their events cost a CustomEvent per task once anyone listens.
   */
  #wire() {
    if (this.#wired) return;
    this.#wired = true;
    // A task's own start and end are the rate limiter's (the pool's slot is taken earlier).
    const tasks = this.#limiter ?? this.#pool;
    for (const type of ['active', 'completed', 'error']) tasks.addEventListener(type, (e) => this[EMIT](type, e.detail));
    for (const source of [this.#pool, this.#limiter]) {
      source?.addEventListener('empty', () => this[CHANGED]());
      source?.addEventListener('idle', () => this[CHANGED]());
    }
    this[CHANGED]();
  }

  addEventListener(type, listener, options) {
    this.#wire();
    super.addEventListener(type, listener, options);
  }

  onEmpty() {
    this.#wire();
    return super.onEmpty();
  }

  onIdle() {
    this.#wire();
    return super.onIdle();
  }

  /** The pool of slots. */
  get pool() {
    return this.#pool;
  }

  /** The rate limiter (null without a rate). */
  get limiter() {
    return this.#limiter;
  }

  /** Tasks running (holding a slot, their tokens taken). */
  get active() {
    return this.#pool.active - (this.#limiter ? this.#limiter.pending : 0);
  }

  /** Tasks waiting for a slot or for their tokens. */
  get pending() {
    return this.#pool.pending + (this.#limiter ? this.#limiter.pending : 0);
  }

  get concurrency() {
    return this.#pool.concurrency;
  }

  /** Changes the concurrency; waiting tasks start at once if it grew. */
  set concurrency(value) {
    this.#pool.concurrency = value;
  }

  /**
   * Runs `fn({ signal })` once it has a slot and its tokens. Options: `cost`, `priority`,
   * `signal`, `maxWait` (for the slot and the tokens together), `timeout` (of the run).
   */
  schedule(fn, options = NO_OPTIONS) {
    const { signal, priority, maxWait, timeout, cost } = options;
    if (typeof fn !== 'function') return Promise.reject(new TypeError('schedule needs a function'));
    let maxWaitNs;
    try {
      maxWaitNs = maxWait === undefined ? this.#maxWaitNs : durationNs(maxWait, 'maxWait');
    } catch (e) {
      return Promise.reject(e);
    }
    const limiter = this.#limiter;
    if (!limiter) return this.#pool.run(fn, { signal, priority, timeout, maxWait: maxWaitNs === null ? undefined : Number(maxWaitNs) / 1e6 });
    if (maxWaitNs === null) {
      // The run timeout is the limiter's (it bounds fn, not the wait for tokens).
      return this.#pool.run(() => limiter.schedule(fn, options), timeout === undefined ? options : { signal, priority });
    }
    const start = this.#now();
    // The slot is waited for first; the tokens then get what is left of the wait.
    const inSlot = () => {
      const left = maxWaitNs - (this.#now() - start);
      if (left < 0n) return Promise.reject(new TimeoutError('waited past the maximum wait for a slot', 0, 'expired'));
      return limiter.schedule(fn, {
        cost, signal, priority, timeout,
        maxWait: left === I64_MAX ? Infinity : Number(left) / 1e6,
      });
    };
    return this.#pool.run(inSlot, { signal, priority, maxWait: Number(maxWaitNs) / 1e6 });
  }

  run(fn, options) {
    return this.schedule(fn, options);
  }

  /** `fn` limited: a function that schedules `fn(...args)` each time it is called. */
  wrap(fn, options) {
    if (typeof fn !== 'function') throw new TypeError('wrap needs a function');
    return (...args) => this.schedule(() => fn(...args), options);
  }

  /** Changes the rate limiter's quota in place (see RateLimiter.reconfigure). */
  reconfigure(options) {
    if (!this.#limiter) throw new TypeError('this limit() has no rate to reconfigure');
    this.#limiter.reconfigure(options);
  }

  /** Takes `cost` from the rate limiter's bucket now without asking (see RateLimiter.charge). */
  charge(cost, options) {
    if (!this.#limiter) throw new TypeError('this limit() has no rate to charge');
    return this.#limiter.charge(cost, options);
  }

  /** Gives back `cost` admitted `ago` to the rate limiter's bucket (see RateLimiter.refund). */
  refund(cost, options) {
    if (!this.#limiter) throw new TypeError('this limit() has no rate to refund');
    this.#limiter.refund(cost, options);
  }

  /** Starts nothing new until resume(). */
  pause() {
    this.#pool.pause();
    this.#limiter?.pause();
  }

  resume() {
    this.#limiter?.resume();
    this.#pool.resume();
  }

  /** Withdraws every waiting task (AbortError); returns how many. */
  clear(reason) {
    return this.#pool.clear(reason) + (this.#limiter ? this.#limiter.clear(reason) : 0);
  }

  close() {
    this.#limiter?.close();
  }
}

export function limit(options = {}) {
  return new Limit(options);
}
