// CircuitBreaker: closed (calls go through), open (calls fail at once), half-open (a few trial
// calls decide).

import { CircuitOpenError } from './errors.js';
import { monotonicNow, durationNs, nsToMsCeil } from './time.js';

/**
 * Opens after `failureThreshold` consecutive failures; stays open for `resetTimeout`, failing
 * calls at once with CircuitOpenError (`retryAfterMs` until it half-opens); then lets
 * `halfOpenMax` trial calls through: a success closes it, a failure opens it again.
 * `isFailure(error)` decides which errors count (default: all).
 */
export class CircuitBreaker {
  #state = 'closed';
  #failures = 0;
  #openedAt = 0n;
  #trials = 0;
  #now;
  #resetNs;

  constructor(options = {}) {
    const { failureThreshold = 5, resetTimeout = 30000, halfOpenMax = 1, isFailure, now, onStateChange } = options;
    if (!(Number.isSafeInteger(failureThreshold) && failureThreshold >= 1)) {
      throw new RangeError(`failureThreshold must be a whole number of at least 1, got ${failureThreshold}`);
    }
    if (!(Number.isSafeInteger(halfOpenMax) && halfOpenMax >= 1)) {
      throw new RangeError(`halfOpenMax must be a whole number of at least 1, got ${halfOpenMax}`);
    }
    this.failureThreshold = failureThreshold;
    this.halfOpenMax = halfOpenMax;
    this.#resetNs = durationNs(resetTimeout, 'resetTimeout') ?? 9223372036854775807n;
    this.#now = now ?? monotonicNow;
    this.isFailure = isFailure ?? (() => true);
    this.onStateChange = onStateChange;
  }

  /** 'closed', 'open' or 'half-open', as of now. */
  get state() {
    if (this.#state === 'open' && this.#now() - this.#openedAt >= this.#resetNs) this.#to('half-open');
    return this.#state;
  }

  #to(state) {
    if (this.#state === state) return;
    this.#state = state;
    if (state === 'half-open') this.#trials = 0;
    if (state === 'closed') this.#failures = 0;
    this.onStateChange?.(state);
  }

  /** Runs `fn` through the breaker. */
  async call(fn) {
    const state = this.state;
    if (state === 'open') {
      const left = this.#resetNs - (this.#now() - this.#openedAt);
      const ms = nsToMsCeil(left > 0n ? left : 0n);
      throw new CircuitOpenError(`the circuit is open (half-opens in ${ms} ms)`, ms);
    }
    if (state === 'half-open') {
      if (this.#trials >= this.halfOpenMax) {
        throw new CircuitOpenError('the circuit is half-open and its trial calls are taken', 0);
      }
      this.#trials++;
    }
    let result;
    try {
      result = await fn();
    } catch (e) {
      if (this.isFailure(e)) this.#failure();
      else this.#success(state);
      throw e;
    }
    this.#success(state);
    return result;
  }

  #success(state) {
    if (state === 'half-open' || this.#state === 'half-open') this.#to('closed');
    this.#failures = 0;
  }

  #failure() {
    if (this.#state === 'half-open' || ++this.#failures >= this.failureThreshold) {
      this.#openedAt = this.#now();
      this.#failures = 0;
      this.#state = 'closed'; // so that #to reports the change
      this.#to('open');
    }
  }
}
