// The program of a limit on Redis: which of the store's scripts decides it, and the stamp
// `<family>:<capacity>:<interval_ns>` that starts every value it writes. Shared by the Redis
// store and the job queue (which hands the stamp to its scripts); no I/O and no Node module,
// so the job queue can be imported where the package runs in a browser.

import { ALGORITHMS, algorithmCode } from './core.js';
import { DEBT, SLIDING_WINDOW, FIXED_WINDOW } from './redis-scripts.generated.js';

// The scripts compute exactly only below these (crates/sluice/src/store/redis/script.rs).
export const MAX_WINDOW_NS = 1n << 52n;
/** The most a bucket key may owe on Redis, its window and its debt included (2^53 ns). */
export const MAX_OWED_NS = 1n << 53n;
const MAX_WINDOW_CAPACITY = 94906265n;

// The script of `algorithm` and its stamp `<family>:<capacity>:<interval_ns>`, which starts
// every value it writes: a script reading another stamp converts the value to its own first.
export function program(algorithm, capacity, intervalNs) {
  // ALGORITHMS is frozen: the name of a code cannot move under the store.
  const kind = ALGORITHMS[algorithmCode(algorithm)];
  const window = capacity * intervalNs;
  if (window > MAX_WINDOW_NS) {
    throw new RangeError(`${kind}: its window (capacity x interval) is above the 52 days (2^52 ns) the Redis scripts compute exactly`);
  }
  const stamp = (family) => `${family}:${capacity}:${intervalNs}`;
  switch (kind) {
    case 'gcra':
    case 'token_bucket':
    case 'leaky_bucket':
      return { kind, source: DEBT, stamp: stamp('gcra'), window, intervalNs };
    case 'sliding_window':
    case 'fixed_window':
      if (capacity > MAX_WINDOW_CAPACITY) {
        throw new RangeError(`${kind}: capacity ${capacity} is above the ${MAX_WINDOW_CAPACITY} the window scripts compute exactly`);
      }
      return kind === 'sliding_window'
        ? { kind, source: SLIDING_WINDOW, stamp: stamp('sw'), window, intervalNs }
        : { kind, source: FIXED_WINDOW, stamp: stamp('fw'), window, intervalNs };
    default:
      throw new RangeError(`${kind} is not available on Redis (it keeps one entry per admission); use sliding_window (same window, O(1)) or gcra`);
  }
}
