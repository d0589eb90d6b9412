// RateLimiter: the core's bucket and FIFO queue, with the promise callbacks and one timer (for
// the head of the queue only) on the JavaScript side.

import {
  algorithmCode, rateIntervalNs, CoreLimiter,
  ADMITTED, QUEUED, LIMITED, QUEUE_FULL, TIMEOUT, TOO_COSTLY,
  OUT_ADMITTED, OUT_TIMED_OUT,
} from './core.js';
import {
  QueueFullError, TimeoutError, InsufficientCapacityError, ClosedError, abortError,
} from './errors.js';
import { monotonicNow, durationNs, nsToMsCeil } from './time.js';

const PRIORITY = { high: 0, normal: 1, low: 2 };
const MAX_TIMER_MS = 2147483647;
const defaultTimers = {
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (t) => globalThis.clearTimeout(t),
};

function wholeCost(cost, what = 'cost') {
  if (!Number.isSafeInteger(cost) || cost < 0) {
    throw new RangeError(`${what} must be a whole number of zero or more, got ${cost}`);
  }
  return BigInt(cost);
}

function priorityCode(p) {
  if (p === undefined) return 1;
  const code = PRIORITY[p];
  if (code === undefined) throw new RangeError(`priority must be 'high', 'normal' or 'low', got ${JSON.stringify(p)}`);
  return code;
}

/** Runs `fn` and always returns a promise (a synchronous throw becomes a rejection). */
function run(fn) {
  try {
    return Promise.resolve(fn());
  } catch (e) {
    return Promise.reject(e);
  }
}

/** Reads the `queue` option: [depth, maxWaitNs or null]. */
function queueOptions(queue) {
  if (queue === false || queue === null) return [0, 0n];
  if (queue === undefined) return [Infinity, null];
  if (typeof queue !== 'object') throw new TypeError('queue must be an object { depth, maxWait } or false');
  const depth = queue.depth ?? Infinity;
  if (depth !== Infinity && (!Number.isSafeInteger(depth) || depth < 0)) {
    throw new RangeError(`queue.depth must be a whole number of zero or more, got ${depth}`);
  }
  const maxWait = queue.maxWait === undefined ? null : durationNs(queue.maxWait, 'queue.maxWait');
  return [depth, maxWait];
}

/**
 * A rate limiter: `capacity` tokens (the burst), refilled at `rate`, by one of the core's
 * algorithms; tasks that find no token wait in a FIFO queue (priorities opt-in).
 */
export class RateLimiter {
  #core;
  #now;
  #timers;
  #tasks = new Map();
  #timer = null;
  #wakeAt = -1n;
  #closed = false;

  constructor(options = {}) {
    const { algorithm = 'token_bucket', capacity, rate, queue, now, timers } = options;
    if (!Number.isSafeInteger(capacity) || capacity < 1) {
      throw new RangeError(`capacity must be a whole number of at least 1, got ${capacity}`);
    }
    const [depth, maxWaitNs] = queueOptions(queue);
    this.#core = new CoreLimiter(algorithmCode(algorithm), BigInt(capacity), rateIntervalNs(rate), depth, maxWaitNs);
    this.#now = now ?? monotonicNow;
    this.#timers = timers ?? defaultTimers;
    this.capacity = capacity;
  }

  /** Tasks waiting for a token. */
  get pending() {
    return this.#tasks.size;
  }

  /** Whole tokens available now. */
  get available() {
    return this.#core.status(this.#now())[0];
  }

  /**
   * Takes `cost` tokens if they are there now and nobody waits ahead; never waits.
   * @returns {boolean}
   */
  tryAcquire(cost = 1) {
    const code = this.#core.offer(this.#now(), wholeCost(cost), 1, 0n);
    if (code === ADMITTED) return true;
    if (code === TOO_COSTLY) throw new InsufficientCapacityError(cost, this.capacity);
    return false;
  }

  /** Waits until `cost` tokens are taken (no task to run). */
  acquire(options = {}) {
    return this.schedule(() => undefined, options);
  }

  /**
   * Runs `fn` once `cost` tokens are admitted and returns its result. Rejects with
   * QueueFullError, TimeoutError (with `retryAfterMs`), AbortError (the signal fired while it
   * waited: it spent nothing), InsufficientCapacityError or ClosedError.
   */
  schedule(fn, options = {}) {
    const { cost = 1, priority, signal, maxWait } = options;
    if (typeof fn !== 'function') return Promise.reject(new TypeError('schedule needs a function'));
    let costN, prio, maxWaitNs;
    try {
      costN = wholeCost(cost);
      prio = priorityCode(priority);
      maxWaitNs = maxWait === undefined ? -1n : (durationNs(maxWait, 'maxWait') ?? 9223372036854775807n);
    } catch (e) {
      return Promise.reject(e);
    }
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const now = this.#now();
    const core = this.#core;
    const code = core.offer(now, costN, prio, maxWaitNs);
    if (code === ADMITTED) return run(fn);
    if (code === QUEUED) {
      const ticket = core.ticket;
      const task = { fn, resolve: null, reject: null, signal, onAbort: null };
      const promise = new Promise((resolve, reject) => {
        task.resolve = resolve;
        task.reject = reject;
      });
      if (signal) {
        task.onAbort = () => this.#abort(ticket);
        signal.addEventListener('abort', task.onAbort, { once: true });
      }
      this.#tasks.set(ticket, task);
      this.#arm(now + BigInt(core.waitNs), now);
      return promise;
    }
    return Promise.reject(this.#refusal(code, cost, core.waitNs));
  }

  #refusal(code, cost, retryNs) {
    const retryAfterMs = Math.ceil(retryNs / 1e6);
    switch (code) {
      case QUEUE_FULL: return new QueueFullError(`the queue is full (retry after ${retryAfterMs} ms)`, retryAfterMs);
      case TIMEOUT: return new TimeoutError(`the predicted wait of ${retryAfterMs} ms exceeds the maximum wait`, retryAfterMs, 'timeout');
      case LIMITED: return new TimeoutError(`no token now and this task may not wait (retry after ${retryAfterMs} ms)`, retryAfterMs, 'limited');
      case TOO_COSTLY: return new InsufficientCapacityError(cost, this.capacity);
      default: return new ClosedError('the limiter is closed');
    }
  }

  #abort(ticket) {
    const task = this.#tasks.get(ticket);
    if (!task || !this.#core.cancel(ticket)) return;
    this.#tasks.delete(ticket);
    task.reject(abortError(task.signal));
    // The head may have changed: poll now, which also re-arms the timer.
    this.#pump();
  }

  /** One timer, for the earliest moment the head can go (or a deadline passes). */
  #arm(at, now) {
    if (this.#timer !== null) {
      if (this.#wakeAt <= at) return;
      this.#timers.clearTimeout(this.#timer);
    }
    this.#wakeAt = at;
    // Timers take at most 2^31 - 1 ms (about 24.8 days); a later wake polls early and re-arms.
    const delayMs = at > now ? Math.min(nsToMsCeil(at - now), MAX_TIMER_MS) : 0;
    this.#timer = this.#timers.setTimeout(() => {
      this.#timer = null;
      this.#pump();
    }, delayMs);
  }

  #pump() {
    const now = this.#now();
    const wake = this.#core.poll(now, (ticket, code, retryNs) => this.#deliver(ticket, code, retryNs));
    if (this.#timer !== null) {
      this.#timers.clearTimeout(this.#timer);
      this.#timer = null;
    }
    if (wake >= 0n) this.#arm(wake, now);
  }

  #deliver(ticket, code, retryNs) {
    const task = this.#tasks.get(ticket);
    if (!task) return;
    this.#tasks.delete(ticket);
    if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
    if (code === OUT_ADMITTED) {
      run(task.fn).then(task.resolve, task.reject);
    } else if (code === OUT_TIMED_OUT) {
      const ms = Math.ceil(retryNs / 1e6);
      task.reject(new TimeoutError(`waited past the maximum wait (retry after ${ms} ms)`, ms, 'expired'));
    } else {
      task.reject(new ClosedError('the limiter was closed'));
    }
  }

  /** Whether nothing waits and the bucket is full (dropping it would lose nothing). */
  isIdle() {
    const [, , queued, untilFull] = this.#core.status(this.#now());
    return queued === 0 && untilFull === 0;
  }

  /** Rejects every waiting task with ClosedError, refuses new ones, and frees the core's memory. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer !== null) this.#timers.clearTimeout(this.#timer);
    this.#timer = null;
    this.#core.close((ticket, code, retryNs) => this.#deliver(ticket, code, retryNs));
    this.#core.free();
    this.#core = closedCore;
  }
}

/** What a closed limiter offers to: everything refused as closed. */
const closedCore = {
  ticket: 0, waitNs: 0, remaining: 0,
  offer: () => 6,
  poll: () => -1n,
  cancel: () => false,
  close: () => {},
  status: () => [0, 0, 0, 0],
  free: () => {},
};
