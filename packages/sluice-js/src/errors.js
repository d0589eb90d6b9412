// The typed errors of sluice-limits. Every one carries `retryAfterMs` where a wait is known.

/** The base class of every error sluice-limits raises itself. */
export class SluiceError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The queue is at its depth; `retryAfterMs` is the predicted wait for this cost. */
export class QueueFullError extends SluiceError {
  constructor(message, retryAfterMs = 0) {
    super(message);
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * The task could not be admitted within its maximum wait: either refused at once (the
 * predicted wait exceeded it, `reason` 'timeout'; no token and no wait allowed, 'limited') or
 * timed out while waiting ('expired'); or it ran past its run timeout ('run').
 * `retryAfterMs`: the predicted wait for this cost (0 when not known).
 */
export class TimeoutError extends SluiceError {
  constructor(message, retryAfterMs = 0, reason = 'timeout') {
    super(message);
    this.retryAfterMs = retryAfterMs;
    this.reason = reason;
  }
}

/**
 * The task's AbortSignal fired before it ran. `name` is 'AbortError', as for the DOMException
 * that fetch rejects with, so `err.name === 'AbortError'` checks work alike; `cause` is the
 * signal's reason.
 */
export class AbortError extends SluiceError {
  constructor(message = 'the operation was aborted', options) {
    super(message, options);
    this.name = 'AbortError';
    this.code = 20; // DOMException.ABORT_ERR
  }
}

/** The cost is above the capacity: no wait could ever admit it. */
export class InsufficientCapacityError extends SluiceError {
  constructor(cost, capacity) {
    super(`cost ${cost} exceeds the capacity ${capacity}: it can never be admitted`);
    this.cost = cost;
    this.capacity = capacity;
  }
}

/** The limiter, pool or store was closed. */
export class ClosedError extends SluiceError {}

/** The circuit breaker is open (or half-open with its trial calls taken). */
export class CircuitOpenError extends SluiceError {
  constructor(message, retryAfterMs = 0) {
    super(message);
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * Redis did not answer (an error, or nothing within the store's `timeout`) and the store's
 * `onError` is 'throw'. `cause` is what happened; `retryAfterMs` when the store tries Redis
 * again.
 */
export class UnavailableError extends SluiceError {
  constructor(message, retryAfterMs = 0, options) {
    super(message, options);
    this.retryAfterMs = retryAfterMs;
  }
}

/** The AbortError for `signal`. */
export function abortError(signal) {
  return new AbortError('the operation was aborted', { cause: signal?.reason });
}
