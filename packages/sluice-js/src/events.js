// What the queues share (RateLimiter, PromisePool, limit()): the platform's event methods
// (addEventListener, removeEventListener, dispatchEvent) under p-queue's event names, the
// promises onEmpty() and onIdle(), and a task run with its signal and run timeout.
//
// The events go through a real EventTarget made on the first listener: constructing one costs
// microseconds in Node, too much for keyed() which makes a limiter per key. Listeners get a
// CustomEvent whose `detail` carries the task's result or error; `target` is that inner
// EventTarget, not the queue.

import { TimeoutError } from './errors.js';
import { durationNs, nsToMsCeil } from './time.js';

/** Internal hooks, kept off the public surface. */
export const CHANGED = Symbol('changed');
export const EMIT = Symbol('emit');

export class Observed {
  #target = null;
  #empty = null;
  #idle = null;
  #waiting = false;
  #busy = false;

  /** As EventTarget's: 'active', 'completed', 'error', 'empty', 'idle'. */
  addEventListener(type, listener, options) {
    (this.#target ??= new EventTarget()).addEventListener(type, listener, options);
  }

  removeEventListener(type, listener, options) {
    this.#target?.removeEventListener(type, listener, options);
  }

  dispatchEvent(event) {
    return this.#target ? this.#target.dispatchEvent(event) : true;
  }

  [EMIT](type, detail) {
    if (this.#target !== null) this.#target.dispatchEvent(new CustomEvent(type, { detail }));
  }

  /** Resolves once no task waits (at once if none does). */
  onEmpty() {
    if (this.pending === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#empty ??= []).push(resolve));
  }

  /** Resolves once no task waits and none runs (at once if so now). */
  onIdle() {
    if (this.pending === 0 && this.active === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#idle ??= []).push(resolve));
  }

  /** Call after `pending` or `active` changed: fires 'empty' and 'idle' on their transitions. */
  [CHANGED]() {
    const waiting = this.pending > 0;
    const busy = waiting || this.active > 0;
    if (this.#waiting && !waiting) {
      const list = this.#empty;
      this.#empty = null;
      if (list) for (const resolve of list) resolve();
      this[EMIT]('empty');
    }
    if (this.#busy && !busy) {
      const list = this.#idle;
      this.#idle = null;
      if (list) for (const resolve of list) resolve();
      this[EMIT]('idle');
    }
    this.#waiting = waiting;
    this.#busy = busy;
  }
}

const NO_SIGNAL = Object.freeze({ signal: undefined });

/**
 * Runs `fn({ signal })` and returns its result as a promise (a synchronous throw becomes a
 * rejection). With `timeoutMs`, the promise rejects with TimeoutError (reason 'run') once it
 * passes, and the signal given to `fn` aborts with that error; `signal` aborting aborts it too.
 * `onOk(value)` or `onError(error)` is called once `fn` itself has settled, whatever the
 * timeout did: the caller holds its slot until then, so a bound counts what really runs.
 */
export function runTask(fn, signal, timeoutMs, timers, onOk, onError) {
  if (timeoutMs === undefined) {
    let p;
    try {
      p = Promise.resolve(fn(signal ? { signal } : NO_SIGNAL));
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(onOk, onError);
    return p;
  }
  const ac = new AbortController();
  const forward = () => ac.abort(signal.reason);
  if (signal) {
    if (signal.aborted) ac.abort(signal.reason);
    else signal.addEventListener('abort', forward, { once: true });
  }
  return new Promise((resolve, reject) => {
    const timer = timers.setTimeout(() => {
      const e = new TimeoutError(`the task ran past its timeout of ${timeoutMs} ms`, 0, 'run');
      ac.abort(e);
      reject(e);
    }, timeoutMs);
    const done = () => {
      timers.clearTimeout(timer);
      signal?.removeEventListener('abort', forward);
    };
    let p;
    try {
      p = Promise.resolve(fn({ signal: ac.signal }));
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(
      (v) => { done(); resolve(v); onOk(v); },
      (e) => { done(); reject(e); onError(e); },
    );
  });
}

/** A run timeout option: undefined (none) or whole milliseconds (a number or "5s"). */
export function timeoutOption(value, what = 'timeout') {
  if (value === undefined) return undefined;
  const ns = durationNs(value, what);
  return ns === null ? undefined : nsToMsCeil(ns);
}
