// RateLimiter: the core's bucket and FIFO queue, with the promise callbacks and one timer (for
// the head of the queue only) on the JavaScript side.

import {
  algorithmCode, rateIntervalNs, CoreLimiter, I64_MAX,
  ADMITTED, QUEUED, LIMITED, QUEUE_FULL, TIMEOUT, TOO_COSTLY,
  OUT_ADMITTED, OUT_TIMED_OUT,
} from './core.js';
import {
  QueueFullError, TimeoutError, InsufficientCapacityError, ClosedError, AbortError, abortError,
} from './errors.js';
import { Observed, CHANGED, EMIT, runTask, timeoutOption } from './events.js';
import { monotonicNow, durationNs, nsToMsCeil, MAX_TIMER_MS } from './time.js';

const PRIORITY = { high: 0, normal: 1, low: 2 };
const NO_OPTIONS = Object.freeze({});
/** For keyed(): a limiter over a core limiter it made, with options it has read already. */
export const ADOPT = Symbol('adopt');
/** For the Redis store's local decisions: a decision without waiting, as Redis gives one. */
export const CHECK = Symbol('check');
export const defaultTimers = {
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (t) => globalThis.clearTimeout(t),
};

export function wholeCost(cost, what = 'cost') {
  if (!Number.isSafeInteger(cost) || cost < 0) {
    throw new RangeError(`${what} must be a whole number of zero or more, got ${cost}`);
  }
  return BigInt(cost);
}

/** Reads the `maxDebt` option of a charge: BigInt tokens, or -1n for no cap (the default). */
export function maxDebtOption(maxDebt) {
  if (maxDebt === undefined || maxDebt === Infinity) return -1n;
  if (!Number.isSafeInteger(maxDebt) || maxDebt < 0) {
    throw new RangeError(`maxDebt must be a whole number of tokens (zero or more) or Infinity, got ${maxDebt}`);
  }
  return BigInt(maxDebt);
}

/** Reads the `ago` option of a refund: BigInt ns (default 0). */
export function agoOption(ago) {
  if (ago === undefined) return 0n;
  return durationNs(ago, 'ago') ?? I64_MAX;
}

export function priorityCode(p) {
  if (p === undefined) return 1;
  const code = PRIORITY[p];
  if (code === undefined) throw new RangeError(`priority must be 'high', 'normal' or 'low', got ${JSON.stringify(p)}`);
  return code;
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

/** The quota and queue of `options`, validated: { kind, capacity, intervalNs, depth, maxWaitNs }. */
export function readConfig(options) {
  const { algorithm = 'token_bucket', capacity, rate, queue } = options;
  if (!Number.isSafeInteger(capacity) || capacity < 1) {
    throw new RangeError(`capacity must be a whole number of at least 1, got ${capacity}`);
  }
  const [depth, maxWaitNs] = queueOptions(queue);
  return { algorithm, kind: algorithmCode(algorithm), capacity, capacityN: BigInt(capacity), intervalNs: rateIntervalNs(rate), rate, queue, depth, maxWaitNs };
}

/**
 * A rate limiter: `capacity` tokens (the burst), refilled at `rate`, by one of the core's
 * algorithms; tasks that find no token wait in a FIFO queue (priorities opt-in).
 */
export class RateLimiter extends Observed {
  #core;
  #config;
  #now;
  #timers;
  #timeout;
  /** Tasks waiting in the core's queue, by ticket, in the order they were offered. */
  #tasks = new Map();
  /** While paused: the tasks waiting for resume(), in the order they came (withdrawn: null). */
  #held = null;
  #heldCount = 0;
  #timer = null;
  #wakeAt = -1n;
  #closed = false;
  #active = 0;
  #completed = (value) => {
    this.#active--;
    this[EMIT]('completed', value);
    this[CHANGED]();
  };
  #failed = (error) => {
    this.#active--;
    this[EMIT]('error', error);
    this[CHANGED]();
  };

  constructor(options = {}) {
    super();
    const adopted = options[ADOPT];
    const config = adopted ? adopted.config : readConfig(options);
    this.#core = adopted ? adopted.core : new CoreLimiter(config.kind, BigInt(config.capacity), config.intervalNs, config.depth, config.maxWaitNs);
    this.#config = config;
    this.#now = options.now ?? monotonicNow;
    this.#timers = options.timers ?? defaultTimers;
    this.#timeout = timeoutOption(options.timeout);
  }

  /** The capacity (the burst). */
  get capacity() {
    return this.#config.capacity;
  }

  /** The rate, as given. */
  get rate() {
    return this.#config.rate;
  }

  /** The algorithm, as given. */
  get algorithm() {
    return this.#config.algorithm;
  }

  /** Tasks waiting for a token (or for resume()). */
  get pending() {
    return this.#tasks.size + this.#heldCount;
  }

  /** Tasks admitted whose function has not settled yet. */
  get active() {
    return this.#active;
  }

  /** Whole tokens available now. */
  get available() {
    return this.#core.status(this.#now())[0];
  }

  /** Whether pause() holds the queue. */
  get isPaused() {
    return this.#held !== null;
  }

  /**
   * Takes `cost` tokens if they are there now and nobody waits ahead; never waits.
   * @returns {boolean}
   */
  tryAcquire(cost = 1) {
    if (this.#held !== null) {
      wholeCost(cost);
      return false;
    }
    const code = this.#core.offerNow(this.#now(), cost === 1 ? 1n : wholeCost(cost));
    if (code === ADMITTED) return true;
    if (code === TOO_COSTLY) throw new InsufficientCapacityError(cost, this.capacity);
    return false;
  }

  /**
   * Takes `cost` tokens now without asking: a cost learnt once the work was done (the tokens
   * an LLM answer used, the bytes sent), which must be paid whatever is left. A bucket
   * (token_bucket, gcra, leaky_bucket) takes all of it, going up to `maxDebt` tokens beyond
   * empty (default: no cap); until the refill has paid that debt nothing is admitted, and the
   * tasks waiting are planned after it. A window (sliding_log, sliding_window, fixed_window)
   * takes what it has left. Returns the part of `cost` that was not taken, forgiven (0 when
   * all was; all of it once the limiter is closed).
   * @returns {number}
   */
  charge(cost, options = NO_OPTIONS) {
    const costN = wholeCost(cost);
    const maxDebt = maxDebtOption(options.maxDebt);
    if (this.#closed) return cost;
    if (costN === 0n) return 0;
    return this.#settle((core, now) => core.charge(now, costN, maxDebt));
  }

  /**
   * Gives back `cost` tokens admitted `ago` (a duration, default 0) that will never be used.
   * A debt shrinks first; the bucket never holds more than when it was full, and a window
   * gives back only what it counted in a window it still holds. The tasks waiting are planned
   * again: the first may go now.
   */
  refund(cost, options = NO_OPTIONS) {
    const costN = wholeCost(cost);
    const agoNs = agoOption(options.ago);
    if (this.#closed || costN === 0n) return;
    this.#settle((core, now) => core.refund(now, costN, agoNs));
  }

  /**
   * Runs `f(core, now)` on the bucket with nothing waiting in the core: the waiting tasks are
   * withdrawn first (they spent nothing) and offered again after, in their order and with
   * what is left of their waits, so that their turns are planned on the bucket `f` left (a
   * debt delays them until the refill pays it; a refund may admit the first at once).
   */
  #settle(f) {
    const waiting = this.#tasks.size > 0 ? this.#withdraw() : null;
    const out = f(this.#core, this.#now());
    if (waiting !== null) this.#reoffer(waiting);
    return out;
  }

  /** Waits until `cost` tokens are taken (no task to run). */
  acquire(options = {}) {
    return this.schedule(() => undefined, options);
  }

  /**
   * Runs `fn({ signal })` once `cost` tokens are admitted and returns its result. Rejects with
   * QueueFullError, TimeoutError (with `retryAfterMs`), AbortError (the signal fired while it
   * waited: it spent nothing), InsufficientCapacityError or ClosedError.
   */
  schedule(fn, options = NO_OPTIONS) {
    const { cost = 1, priority, signal, maxWait } = options;
    if (typeof fn !== 'function') return Promise.reject(new TypeError('schedule needs a function'));
    let costN, prio, maxWaitNs, timeout;
    try {
      costN = cost === 1 ? 1n : wholeCost(cost);
      prio = priority === undefined ? 1 : priorityCode(priority);
      maxWaitNs = maxWait === undefined ? -1n : (durationNs(maxWait, 'maxWait') ?? I64_MAX);
      timeout = options.timeout === undefined ? this.#timeout : timeoutOption(options.timeout);
    } catch (e) {
      return Promise.reject(e);
    }
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const now = this.#now();
    if (this.#held === null) {
      const core = this.#core;
      const code = core.offer(now, costN, prio, maxWaitNs);
      if (code === ADMITTED) return this.#start(fn, signal, timeout);
      if (code !== QUEUED) return Promise.reject(this.#refusal(code, cost, core.waitNs));
      const task = this.#task(fn, signal, costN, prio, timeout, maxWaitNs, now);
      const promise = this.#waiting(task);
      task.ticket = core.ticket;
      this.#tasks.set(task.ticket, task);
      this[CHANGED]();
      this.#arm(now + BigInt(core.waitNs), now);
      return promise;
    }
    if (this.pending >= this.#config.depth) {
      return Promise.reject(new QueueFullError('the queue is full (the limiter is paused)', 0));
    }
    const task = this.#task(fn, signal, costN, prio, timeout, maxWaitNs, now);
    const promise = this.#waiting(task);
    this.#hold(task, now);
    return promise;
  }

  /** A waiting task, with the deadline its own maxWait or the queue's sets. */
  #task(fn, signal, cost, prio, timeout, maxWaitNs, now) {
    let deadline = null;
    if (maxWaitNs >= 0n) {
      deadline = maxWaitNs === I64_MAX ? null : now + maxWaitNs;
    } else if (this.#config.maxWaitNs !== null) {
      deadline = now + this.#config.maxWaitNs;
    }
    return { fn, resolve: null, reject: null, signal, onAbort: null, cost, prio, timeout, deadline, timer: null, ticket: undefined, heldAt: -1 };
  }

  /**
   * `fn` limited: a function that schedules `fn(...args)` with `options` each time it is
   * called and returns its result.
   */
  wrap(fn, options) {
    if (typeof fn !== 'function') throw new TypeError('wrap needs a function');
    return (...args) => this.schedule(() => fn(...args), options);
  }

  /** The promise of a task that will wait; its abort listener. */
  #waiting(task) {
    const promise = new Promise((resolve, reject) => {
      task.resolve = resolve;
      task.reject = reject;
    });
    if (task.signal) {
      task.onAbort = () => this.#abort(task);
      task.signal.addEventListener('abort', task.onAbort, { once: true });
    }
    return promise;
  }

  #start(fn, signal, timeout) {
    this.#active++;
    this[EMIT]('active');
    const p = runTask(fn, signal, timeout, this.#timers, this.#completed, this.#failed);
    this[CHANGED]();
    return p;
  }

  #refusal(code, cost, retryNs, expired = false) {
    const retryAfterMs = Math.ceil(retryNs / 1e6);
    switch (code) {
      case QUEUE_FULL: return new QueueFullError(`the queue is full (retry after ${retryAfterMs} ms)`, retryAfterMs);
      case TIMEOUT: return expired
        ? new TimeoutError(`waited past the maximum wait (retry after ${retryAfterMs} ms)`, retryAfterMs, 'expired')
        : new TimeoutError(`the predicted wait of ${retryAfterMs} ms exceeds the maximum wait`, retryAfterMs, 'timeout');
      case LIMITED: return new TimeoutError(`no token now and this task may not wait (retry after ${retryAfterMs} ms)`, retryAfterMs, 'limited');
      case TOO_COSTLY: return new InsufficientCapacityError(cost, this.capacity);
      default: return new ClosedError('the limiter is closed');
    }
  }

  #abort(task) {
    if (task.ticket !== undefined) {
      if (this.#tasks.get(task.ticket) !== task || !this.#core.cancel(task.ticket)) return;
      this.#tasks.delete(task.ticket);
      task.reject(abortError(task.signal));
      this[CHANGED]();
      // The head may have changed: poll now, which also re-arms the timer.
      this.#pump();
    } else if (this.#unhold(task)) {
      task.reject(abortError(task.signal));
      this[CHANGED]();
    }
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
    if (this.#held !== null) return;
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
      this.#start(task.fn, task.signal, task.timeout).then(task.resolve, task.reject);
    } else if (code === OUT_TIMED_OUT) {
      const ms = Math.ceil(retryNs / 1e6);
      task.reject(new TimeoutError(`waited past the maximum wait (retry after ${ms} ms)`, ms, 'expired'));
      this[CHANGED]();
    } else {
      task.reject(new ClosedError('the limiter was closed'));
      this[CHANGED]();
    }
  }

  // === pause, resume, clear, reconfigure ===

  /** A task into the held list (paused), with a timer for its deadline. */
  #hold(task, now) {
    task.ticket = undefined;
    task.heldAt = this.#held.length;
    this.#held.push(task);
    this.#heldCount++;
    if (task.deadline !== null) {
      const ms = task.deadline > now ? Math.min(nsToMsCeil(task.deadline - now), MAX_TIMER_MS) : 0;
      task.timer = this.#timers.setTimeout(() => this.#expireHeld(task), ms);
    }
    this[CHANGED]();
  }

  #expireHeld(task) {
    task.timer = null;
    if (this.#held === null || this.#held[task.heldAt] !== task) return;
    const now = this.#now();
    if (now < task.deadline) {
      // A wait longer than a timer takes: armed again for the rest.
      task.timer = this.#timers.setTimeout(() => this.#expireHeld(task), Math.min(nsToMsCeil(task.deadline - now), MAX_TIMER_MS));
      return;
    }
    this.#unhold(task);
    if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
    task.reject(new TimeoutError('waited past the maximum wait (the limiter is paused)', 0, 'expired'));
    this[CHANGED]();
  }

  /** Removes a held task: whether it was held. */
  #unhold(task) {
    if (this.#held === null || this.#held[task.heldAt] !== task) return false;
    this.#held[task.heldAt] = null;
    this.#heldCount--;
    if (task.timer !== null) {
      this.#timers.clearTimeout(task.timer);
      task.timer = null;
    }
    return true;
  }

  /** Withdraws every task from the core's queue (they spend nothing), in the order offered. */
  #withdraw() {
    const tasks = [];
    for (const [ticket, task] of this.#tasks) {
      if (this.#core.cancel(ticket)) tasks.push(task);
    }
    this.#tasks.clear();
    if (this.#timer !== null) {
      this.#timers.clearTimeout(this.#timer);
      this.#timer = null;
    }
    return tasks;
  }

  /** Offers withdrawn or held tasks again, in their order, each with what is left of its wait. */
  #reoffer(tasks) {
    const now = this.#now();
    for (const task of tasks) {
      let maxWaitNs = I64_MAX;
      if (task.deadline !== null) {
        maxWaitNs = task.deadline - now;
        if (maxWaitNs < 0n) maxWaitNs = 0n;
      }
      const code = this.#core.offer(now, task.cost, task.prio, maxWaitNs);
      if (code === ADMITTED) {
        if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
        this.#start(task.fn, task.signal, task.timeout).then(task.resolve, task.reject);
      } else if (code === QUEUED) {
        task.ticket = this.#core.ticket;
        this.#tasks.set(task.ticket, task);
      } else {
        if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
        task.reject(this.#refusal(code === LIMITED ? TIMEOUT : code, Number(task.cost), this.#core.waitNs, true));
      }
    }
    this[CHANGED]();
    this.#pump();
  }

  /**
   * Holds every waiting task and every new one until resume(): nothing is admitted meanwhile
   * (tryAcquire is false), tokens keep refilling, and each task's maximum wait keeps running.
   */
  pause() {
    if (this.#held !== null || this.#closed) return;
    const waiting = this.#withdraw();
    this.#held = [];
    const now = this.#now();
    for (const task of waiting) this.#hold(task, now);
  }

  /** Offers the held tasks again, in their order, and admits as usual from then on. */
  resume() {
    if (this.#held === null) return;
    const held = this.#held.filter((t) => t !== null);
    for (const task of held) {
      if (task.timer !== null) this.#timers.clearTimeout(task.timer);
      task.timer = null;
    }
    this.#held = null;
    this.#heldCount = 0;
    this.#reoffer(held);
  }

  /**
   * Withdraws every waiting task: each rejects with AbortError (its `cause` is `reason`) and
   * spends nothing. Running tasks go on. Returns how many were withdrawn.
   */
  clear(reason = 'cleared from the queue') {
    const tasks = this.#withdraw();
    if (this.#held !== null) {
      for (const task of this.#held) if (task !== null && this.#unhold(task)) tasks.push(task);
      this.#held = [];
    }
    for (const task of tasks) {
      if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
      task.reject(new AbortError('the task was cleared from the queue', { cause: reason }));
    }
    this[CHANGED]();
    return tasks.length;
  }

  /**
   * Changes the algorithm, capacity, rate or queue (the options of the constructor, each
   * optional) in place. The bucket is converted by the core's rule: what it has left becomes
   * at most the new capacity, debt is kept in the new rate's time, so no change gives tokens
   * that were not there. Waiting tasks keep their order and their deadlines and are planned
   * with the new quota (a task the new queue cannot hold is refused as it would be now).
   */
  reconfigure(options = {}) {
    if (this.#closed) throw new ClosedError('the limiter is closed');
    const merged = { ...this.#config, ...options };
    if (!('queue' in options)) merged.queue = this.#config.queue;
    const config = readConfig(merged);
    // Checked before anything is withdrawn: the core refuses an impossible quota here.
    new CoreLimiter(config.kind, BigInt(config.capacity), config.intervalNs, config.depth, config.maxWaitNs).free();
    const waiting = this.#withdraw();
    this.#core.reconfigure(this.#now(), config.kind, BigInt(config.capacity), config.intervalNs, config.depth, config.maxWaitNs);
    this.#config = config;
    if (this.#held !== null) {
      const now = this.#now();
      for (const task of waiting) this.#hold(task, now);
    } else {
      this.#reoffer(waiting);
    }
  }

  /** Whether nothing waits and the bucket is full (dropping it would lose nothing). */
  isIdle() {
    if (this.pending > 0) return false;
    const [, , queued, untilFull] = this.#core.status(this.#now());
    return queued === 0 && untilFull === 0;
  }

  /** `cost` taken now if it is there: { allowed, limit, remaining, retryAfterMs, resetAfterMs }. */
  [CHECK](cost) {
    const now = this.#now();
    const code = this.#held === null ? this.#core.offer(now, BigInt(cost), 1, 0n) : LIMITED;
    if (code === TOO_COSTLY) throw new InsufficientCapacityError(cost, this.capacity);
    const [remaining, , , untilFull] = this.#core.status(now);
    return {
      allowed: code === ADMITTED,
      limit: this.capacity,
      remaining,
      retryAfterMs: code === ADMITTED ? 0 : Math.ceil(this.#core.waitNs / 1e6),
      resetAfterMs: Math.ceil(untilFull / 1e6),
    };
  }

  /** Rejects every waiting task with ClosedError, refuses new ones, and frees the core's memory. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer !== null) this.#timers.clearTimeout(this.#timer);
    this.#timer = null;
    if (this.#held !== null) {
      for (const task of this.#held) {
        if (task === null || !this.#unhold(task)) continue;
        if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
        task.reject(new ClosedError('the limiter was closed'));
      }
      this.#held = null;
      this.#heldCount = 0;
    }
    this.#core.close((ticket, code, retryNs) => this.#deliver(ticket, code, retryNs));
    this.#core.free();
    this.#core = closedCore;
    this[CHANGED]();
  }
}

/** What a closed limiter offers to: everything refused as closed. */
const closedCore = {
  ticket: 0, waitNs: 0, remaining: 0,
  offer: () => 6,
  offerNow: () => 6,
  poll: () => -1n,
  cancel: () => false,
  close: () => {},
  status: () => [0, 0, 0, 0],
  reconfigure: () => {},
  free: () => {},
};
