// PromisePool: at most `concurrency` tasks running, the others waiting in FIFO order (with
// opt-in priorities).

import { AbortError, TimeoutError, abortError } from './errors.js';
import { Observed, CHANGED, EMIT, runTask, timeoutOption } from './events.js';
import { defaultTimers, priorityCode } from './limiter.js';
import { durationNs, monotonicNow, nsToMsCeil, MAX_TIMER_MS } from './time.js';

/** A FIFO of waiting tasks: an array with a moving head, compacted when half is consumed. */
class Fifo {
  items = [];
  head = 0;

  push(task) {
    this.items.push(task);
  }

  /** The first task still waiting (withdrawn ones have `fn === null`), removed; or null. */
  shift() {
    while (this.head < this.items.length) {
      const task = this.items[this.head];
      this.items[this.head++] = undefined;
      if (this.head * 2 > this.items.length && this.head > 1024) {
        this.items = this.items.slice(this.head);
        this.head = 0;
      }
      if (task.fn !== null) return task;
    }
    this.items.length = 0;
    this.head = 0;
    return null;
  }

  /** Every task still waiting, removed. */
  drain() {
    const out = [];
    for (let i = this.head; i < this.items.length; i++) if (this.items[i].fn !== null) out.push(this.items[i]);
    this.items = [];
    this.head = 0;
    return out;
  }
}

const NO_OPTIONS = Object.freeze({});

function concurrencyOption(concurrency) {
  if (!(Number.isSafeInteger(concurrency) && concurrency >= 1) && concurrency !== Infinity) {
    throw new RangeError(`concurrency must be a whole number of at least 1, got ${concurrency}`);
  }
  return concurrency;
}

/**
 * At most `concurrency` tasks at once; the rest wait, first come first served (`priority`
 * 'high' or 'low' opt-in, FIFO within each), each at most its `maxWait` if it has one.
 */
export class PromisePool extends Observed {
  #concurrency;
  #active = 0;
  #queues = [new Fifo(), new Fifo(), new Fifo()];
  #waiting = 0;
  #paused = false;
  #now;
  #timers;
  #timeout;
  #maxWaitNs;

  constructor(options = {}) {
    super();
    const { concurrency, now, timers, timeout, maxWait } = options;
    this.#concurrency = concurrencyOption(concurrency);
    this.#now = now ?? monotonicNow;
    this.#timers = timers ?? defaultTimers;
    this.#timeout = timeoutOption(timeout);
    this.#maxWaitNs = maxWait === undefined ? null : durationNs(maxWait, 'maxWait');
  }

  /** The most tasks running at once. Setting it starts waiting tasks at once if it grew. */
  get concurrency() {
    return this.#concurrency;
  }

  set concurrency(value) {
    this.#concurrency = concurrencyOption(value);
    this.#fill();
  }

  /** Tasks running now. */
  get active() {
    return this.#active;
  }

  /** Tasks waiting for a slot. */
  get pending() {
    return this.#waiting;
  }

  /** Whether pause() holds the waiting tasks. */
  get isPaused() {
    return this.#paused;
  }

  /**
   * Runs `fn({ signal })` once a slot is free and returns its result. While it waits, `signal`
   * withdraws it (AbortError) and `maxWait` bounds the wait (TimeoutError, reason 'expired');
   * once it runs, `timeout` bounds the run (TimeoutError, reason 'run'; its slot stays taken
   * until `fn` settles, so the pool never runs more than `concurrency`).
   */
  run(fn, options = NO_OPTIONS) {
    if (typeof fn !== 'function') return Promise.reject(new TypeError('run needs a function'));
    const { signal, priority, maxWait } = options;
    let prio, timeout, maxWaitNs;
    try {
      prio = priority === undefined ? 1 : priorityCode(priority);
      timeout = options.timeout === undefined ? this.#timeout : timeoutOption(options.timeout);
      maxWaitNs = maxWait === undefined ? this.#maxWaitNs : durationNs(maxWait, 'maxWait');
    } catch (e) {
      return Promise.reject(e);
    }
    if (signal?.aborted) return Promise.reject(abortError(signal));
    if (!this.#paused && this.#active < this.#concurrency && this.#waiting === 0) {
      return this.#start(fn, signal, timeout);
    }
    if (maxWaitNs === 0n) {
      return Promise.reject(new TimeoutError('no free slot now and this task may not wait', 0, 'limited'));
    }
    return new Promise((resolve, reject) => {
      const task = { fn, resolve, reject, signal, timeout, onAbort: null, timer: null };
      if (signal) {
        task.onAbort = () => {
          if (this.#withdraw(task)) reject(abortError(signal));
        };
        signal.addEventListener('abort', task.onAbort, { once: true });
      }
      if (maxWaitNs !== null) {
        const ms = Math.min(nsToMsCeil(maxWaitNs), MAX_TIMER_MS);
        const deadline = this.#now() + maxWaitNs;
        const expire = () => {
          const now = this.#now();
          if (now < deadline) {
            task.timer = this.#timers.setTimeout(expire, Math.min(nsToMsCeil(deadline - now), MAX_TIMER_MS));
            return;
          }
          task.timer = null;
          if (this.#withdraw(task)) reject(new TimeoutError(`waited past the maximum wait of ${nsToMsCeil(maxWaitNs)} ms for a slot`, 0, 'expired'));
        };
        task.timer = this.#timers.setTimeout(expire, ms);
      }
      this.#queues[prio].push(task);
      this.#waiting++;
      this[CHANGED]();
    });
  }

  /** Takes a waiting task out (it never runs): whether it was still waiting. */
  #withdraw(task) {
    if (task.fn === null) return false;
    task.fn = null;
    this.#waiting--;
    this.#forget(task);
    this[CHANGED]();
    return true;
  }

  #forget(task) {
    if (task.timer !== null) {
      this.#timers.clearTimeout(task.timer);
      task.timer = null;
    }
    if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
  }

  #start(fn, signal, timeout) {
    this.#active++;
    this[EMIT]('active');
    const p = runTask(fn, signal, timeout, this.#timers, this.#completed, this.#failed);
    this[CHANGED]();
    return p;
  }

  #completed = (value) => {
    this.#active--;
    this[EMIT]('completed', value);
    if (this.#waiting > 0) this.#fill();
    this[CHANGED]();
  };
  #failed = (error) => {
    this.#active--;
    this[EMIT]('error', error);
    if (this.#waiting > 0) this.#fill();
    this[CHANGED]();
  };

  /** Starts waiting tasks while slots are free: high, then normal, then low. */
  #fill() {
    while (!this.#paused && this.#active < this.#concurrency && this.#waiting > 0) {
      const task = this.#queues[0].shift() ?? this.#queues[1].shift() ?? this.#queues[2].shift();
      if (task === null) break;
      const fn = task.fn;
      task.fn = null;
      this.#waiting--;
      this.#forget(task);
      this.#start(fn, task.signal, task.timeout).then(task.resolve, task.reject);
    }
  }

  /**
   * Runs `fn(item, index)` for every item with at most `concurrency` at once; resolves to the
   * results in the order of the items, or rejects with the first error.
   */
  map(items, fn, options) {
    const tasks = [];
    let i = 0;
    for (const item of items) {
      const index = i++;
      tasks.push(this.run(() => fn(item, index), options));
    }
    return Promise.all(tasks);
  }

  /** `fn` bounded: a function that runs `fn(...args)` in the pool each time it is called. */
  wrap(fn, options) {
    if (typeof fn !== 'function') throw new TypeError('wrap needs a function');
    return (...args) => this.run(() => fn(...args), options);
  }

  /** Starts no waiting task until resume(); running tasks go on, new ones wait. */
  pause() {
    this.#paused = true;
  }

  /** Starts waiting tasks again, up to `concurrency`. */
  resume() {
    this.#paused = false;
    this.#fill();
  }

  /**
   * Withdraws every waiting task: each rejects with AbortError (its `cause` is `reason`).
   * Running tasks go on. Returns how many were withdrawn.
   */
  clear(reason = 'cleared from the queue') {
    const tasks = this.#queues.flatMap((q) => q.drain());
    for (const task of tasks) {
      task.fn = null;
      this.#forget(task);
      task.reject(new AbortError('the task was cleared from the queue', { cause: reason }));
    }
    this.#waiting -= tasks.length;
    this[CHANGED]();
    return tasks.length;
  }
}
