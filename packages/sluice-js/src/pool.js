// PromisePool: at most `concurrency` tasks running, the others waiting in FIFO order.

import { abortError } from './errors.js';

function run(fn) {
  try {
    return Promise.resolve(fn());
  } catch (e) {
    return Promise.reject(e);
  }
}

/** At most `concurrency` tasks at once; the rest wait, first come first served. */
export class PromisePool {
  #active = 0;
  // A FIFO of waiting tasks: an array with a moving head, compacted when half is consumed.
  #queue = [];
  #head = 0;
  #waiting = 0;

  constructor({ concurrency } = {}) {
    if (!(Number.isSafeInteger(concurrency) && concurrency >= 1) && concurrency !== Infinity) {
      throw new RangeError(`concurrency must be a whole number of at least 1, got ${concurrency}`);
    }
    this.concurrency = concurrency;
  }

  /** Tasks running now. */
  get active() {
    return this.#active;
  }

  /** Tasks waiting for a slot. */
  get pending() {
    return this.#waiting;
  }

  /**
   * Runs `fn` once a slot is free and returns its result. `signal` withdraws it while it
   * waits (AbortError); a running task is not interrupted.
   */
  run(fn, { signal } = {}) {
    if (typeof fn !== 'function') return Promise.reject(new TypeError('run needs a function'));
    if (signal?.aborted) return Promise.reject(abortError(signal));
    if (this.#active < this.concurrency) return this.#start(fn);
    return new Promise((resolve, reject) => {
      const task = { fn, resolve, reject, signal, onAbort: null };
      if (signal) {
        task.onAbort = () => {
          if (task.fn === null) return;
          task.fn = null;
          this.#waiting--;
          reject(abortError(signal));
        };
        signal.addEventListener('abort', task.onAbort, { once: true });
      }
      this.#queue.push(task);
      this.#waiting++;
    });
  }

  #start(fn) {
    this.#active++;
    const p = run(fn);
    p.then(this.#done, this.#done);
    return p;
  }

  #done = () => {
    this.#active--;
    while (this.#head < this.#queue.length) {
      const task = this.#queue[this.#head];
      this.#queue[this.#head++] = undefined;
      if (this.#head * 2 > this.#queue.length && this.#head > 1024) {
        this.#queue = this.#queue.slice(this.#head);
        this.#head = 0;
      }
      if (task.fn === null) continue; // aborted while waiting
      const fn = task.fn;
      task.fn = null;
      this.#waiting--;
      if (task.onAbort) task.signal.removeEventListener('abort', task.onAbort);
      this.#start(fn).then(task.resolve, task.reject);
      return;
    }
    this.#queue.length = 0;
    this.#head = 0;
  };

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
}
