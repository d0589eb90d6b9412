// Clocks and durations. Time is a BigInt count of nanoseconds from a monotonic clock, never a
// sum of floats: the core computes in integers.

import { abortError } from './errors.js';

const hrtime = globalThis.process?.hrtime?.bigint;

/** The default clock: monotonic nanoseconds (process.hrtime in Node, performance.now in browsers). */
export const monotonicNow = hrtime
  ? () => hrtime()
  : () => BigInt(Math.round(globalThis.performance.now() * 1e6));

const UNITS = {
  ns: 1n,
  us: 1000n,
  'µs': 1000n,
  ms: 1000000n,
  s: 1000000000n,
  m: 60000000000n,
  min: 60000000000n,
  h: 3600000000000n,
  d: 86400000000000n,
};

/**
 * A duration as BigInt nanoseconds: a number of milliseconds (integer or not), or a string
 * with a unit ("250ms", "2s", "1.5min"). `Infinity` is null (no limit). `what` names the
 * option in error messages.
 */
export function durationNs(value, what) {
  if (value === Infinity) return null;
  if (typeof value === 'number') {
    if (!(value >= 0) || !Number.isFinite(value)) {
      throw new RangeError(`${what} must be a duration of zero or more, got ${value}`);
    }
    return BigInt(Math.round(value * 1e6));
  }
  if (typeof value === 'string') {
    const m = /^\s*(\d+)(?:\.(\d+))?\s*(ns|us|µs|ms|s|min|m|h|d)\s*$/.exec(value);
    if (!m) {
      throw new RangeError(
        `${what}: cannot read ${JSON.stringify(value)} as a duration (write e.g. "250ms", "2s", "1.5min")`,
      );
    }
    const unit = UNITS[m[3]];
    const frac = m[2] ?? '';
    const scale = 10n ** BigInt(frac.length);
    return (BigInt(m[1]) * scale + BigInt(frac || '0')) * unit / scale;
  }
  throw new TypeError(`${what} must be a number of milliseconds or a string like "2s", got ${typeof value}`);
}

/** Nanoseconds (BigInt) to whole milliseconds, rounded up. */
export function nsToMsCeil(ns) {
  return Number((ns + 999999n) / 1000000n);
}

/** The longest delay a timer takes (2^31 - 1 ms, about 24.8 days); longer ones fire at once. */
export const MAX_TIMER_MS = 2147483647;

const realClock = {
  now: () => globalThis.performance.now(),
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (t) => globalThis.clearTimeout(t),
};

/**
 * Resolves after `ms` milliseconds of timer (a wait longer than a timer takes is slept in
 * steps, never cut short); rejects with the abort reason once `signal` aborts. `clock`
 * ({ now() in ms, setTimeout, clearTimeout }) is for tests.
 */
export function sleep(ms, signal, clock = realClock) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    let t;
    const onAbort = () => {
      clock.clearTimeout(t);
      reject(abortError(signal));
    };
    const end = clock.now() + ms;
    const step = (left) => {
      t = clock.setTimeout(() => {
        const rest = end - clock.now();
        if (left > MAX_TIMER_MS && rest > 0) return step(rest);
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, Math.min(Math.max(0, Math.ceil(left)), MAX_TIMER_MS));
    };
    step(ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
