// The limiter instance of this worker, and the module's failure: the one place that creates
// the instance and the one place that gives it up.
//
// Owns: limiter (the SluiceLimiter, or null: never started, or failed), disabled (why nothing
// is limited, if so), failure (once the module has failed) and startError. Every call into the
// module that may trap goes through `guarded`; a throw fails the module for good.
// Must not touch: what the other modules hold. Each registers with whenFailed what it drops on a
// failure (record.js the pending save, queue.js the waiters, failure.js the counts and the
// pages); moduleFailed runs them in the order they were registered, the bundle's order.

import { SluiceLimiter } from './limiter.js';
import { config, configErrors } from './worker.js';

export let limiter = null;
export let disabled = null; // why nothing is limited, if so
// Once the module has failed (it did not compile, did not instantiate, or trapped): { reason,
// mode, unix_ms }. From then on every limited request is handled by `config.fail`: 'open'
// passes it to the network untouched, 'closed' answers 503 (failedResponse).
export let failure = null;
export let startError = null; // the module did not compile or instantiate
try {
  // An invalid configuration fails open (nothing says which requests to limit, nor how).
  if (!config) throw new Error('invalid configuration: ' + configErrors.join('; '));
  // Synchronous compile: allowed in workers, and the bytes came with this script, so a
  // restarted worker downloads nothing.
  const module = new WebAssembly.Module(self.__SLUICE_WASM__);
  limiter = new SluiceLimiter(module, {
    algorithm: config.algorithm,
    capacity: config.capacity,
    rate: config.rate,
    depth: config.queue.depth,
    maxWaitMs: config.queue.max_wait_ms,
  });
} catch (e) {
  disabled = String((e && e.message) || e);
  console.error('sluice: limiting disabled:', disabled);
  // With a valid configuration, the module failed: handled by `fail` (main.js calls
  // moduleFailed once every module has registered what it drops then).
  if (config) startError = e;
}

const failureHooks = [];

/** `drop()` runs when the module fails, after the ones registered before it. */
export function whenFailed(drop) {
  failureHooks.push(drop);
}

/** Runs a call into the module; on a throw the module is failed for good and this gives null. */
export function guarded(call) {
  try {
    return call();
  } catch (e) {
    moduleFailed(e);
    return null;
  }
}

/**
 * From now on the module is never called (after a trap its state is unknown): every limited
 * request, the waiting ones included, is handled by `config.fail` (failedResponse), pages are
 * told (`sluice:failed`), `/sluice/state` shows `failure`, and telemetry counts it.
 */
export function moduleFailed(e) {
  if (failure !== null) return;
  const reason = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  failure = { reason, mode: config.fail, unix_ms: Date.now() };
  limiter = null;
  disabled = `the limiter module failed (${reason}); fail ${config.fail}`;
  console.error('sluice:', disabled);
  for (const drop of failureHooks) drop();
}
