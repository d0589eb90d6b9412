// retry(): exponential backoff with full jitter, reading the server's own hints (Retry-After,
// RateLimit, RateLimit-Reset) from fetch responses.

import { AbortError, CircuitOpenError, abortError } from './errors.js';
import { sleep } from './time.js';

function header(headers, name) {
  if (!headers) return null;
  if (typeof headers.get === 'function') return headers.get(name);
  const lower = name.toLowerCase();
  for (const k of Object.keys(headers)) if (k.toLowerCase() === lower) return String(headers[k]);
  return null;
}

function seconds(text) {
  if (text === null || text === undefined) return null;
  const t = String(text).trim();
  if (!/^\d+(\.\d+)?$/.test(t)) return null;
  return Number(t) * 1000;
}

/**
 * The server's hints in a fetch Response's headers (or a Headers object, or a plain object):
 * `retryAfterMs` from `Retry-After` (seconds or an HTTP date), `resetMs` and `remaining` from
 * `RateLimit: "policy";r=R;t=T` (or the older `RateLimit-Reset` / `RateLimit-Remaining`, or
 * `RateLimit: limit=L, remaining=R, reset=T`), `limit` and `windowMs` from
 * `RateLimit-Policy: "policy";q=Q;w=W` (or `RateLimit-Limit`). Missing values are null.
 */
export function rateLimitHints(headersOrResponse, nowMs = Date.now()) {
  const headers = headersOrResponse?.headers ?? headersOrResponse;
  const hints = { retryAfterMs: null, resetMs: null, remaining: null, limit: null, windowMs: null };
  const ra = header(headers, 'retry-after');
  if (ra !== null) {
    hints.retryAfterMs = seconds(ra);
    if (hints.retryAfterMs === null) {
      const at = Date.parse(ra);
      if (!Number.isNaN(at)) hints.retryAfterMs = Math.max(0, at - nowMs);
    }
  }
  const rl = header(headers, 'ratelimit');
  if (rl !== null) {
    // Structured field (draft-ietf-httpapi-ratelimit-headers): the first item's parameters.
    const first = rl.split(',')[0];
    const params = Object.fromEntries(
      first.split(';').slice(1).map((p) => p.trim().split('=')).filter((kv) => kv.length === 2),
    );
    if (params.r !== undefined) hints.remaining = Number(params.r);
    if (params.t !== undefined) hints.resetMs = seconds(params.t);
    // The older dictionary form: limit=L, remaining=R, reset=T.
    const dict = Object.fromEntries(
      rl.split(',').map((p) => p.trim().split('=')).filter((kv) => kv.length === 2),
    );
    if (dict.remaining !== undefined && hints.remaining === null) hints.remaining = Number(dict.remaining);
    if (dict.reset !== undefined && hints.resetMs === null) hints.resetMs = seconds(dict.reset);
    if (dict.limit !== undefined) hints.limit = Number(dict.limit);
  }
  const reset = header(headers, 'ratelimit-reset');
  if (reset !== null && hints.resetMs === null) hints.resetMs = seconds(reset);
  const remaining = header(headers, 'ratelimit-remaining');
  if (remaining !== null && hints.remaining === null) hints.remaining = Number(remaining);
  const policy = header(headers, 'ratelimit-policy');
  if (policy !== null) {
    const params = Object.fromEntries(
      policy.split(',')[0].split(';').slice(1).map((p) => p.trim().split('=')).filter((kv) => kv.length === 2),
    );
    if (params.q !== undefined) hints.limit = Number(params.q);
    if (params.w !== undefined) hints.windowMs = seconds(params.w);
  }
  const lim = header(headers, 'ratelimit-limit');
  if (lim !== null && hints.limit === null) hints.limit = Number(lim);
  return hints;
}

/** The wait the server asks for, if any: Retry-After, else the reset of an exhausted limit. */
export function serverWaitMs(response, nowMs) {
  const h = rateLimitHints(response, nowMs);
  if (h.retryAfterMs !== null) return h.retryAfterMs;
  if (h.resetMs !== null && h.remaining === 0) return h.resetMs;
  return null;
}

function isResponse(v) {
  return v !== null && typeof v === 'object' && typeof v.status === 'number' && 'headers' in v;
}

/** Retry these statuses by default: 408, 425, 429, 500, 502, 503, 504. */
const RETRY_STATUSES = new Set([408, 425, 429, 500, 502, 503, 504]);

/**
 * Calls `fn(attempt)` (attempt 0, 1, ...) until it succeeds or `retries` retries are spent.
 * A thrown error is retried (unless it is an AbortError, a CircuitOpenError, or
 * `shouldRetry(error)` says no); a fetch Response is retried when its status is 408, 425, 429
 * or 5xx (or `shouldRetry(response)` says so). The wait before retry n is uniform in
 * [0, min(cap, base·2^n)] ('full' jitter; 'none': exactly that bound); with
 * `respectRetryAfter` (the default), a server's Retry-After (or an exhausted RateLimit's reset)
 * is waited at least, even above `cap`. After the last attempt the last Response is returned, or
 * the last error thrown.
 */
export async function retry(fn, options = {}) {
  const {
    retries = 3,
    base = 100,
    cap = 10000,
    jitter = 'full',
    respectRetryAfter = true,
    shouldRetry,
    signal,
    onRetry,
    random = Math.random,
    delay = sleep,
  } = options;
  if (!(Number.isSafeInteger(retries) && retries >= 0)) throw new RangeError(`retries must be a whole number of zero or more, got ${retries}`);
  if (!(base >= 0) || !(cap >= 0)) throw new RangeError('base and cap must be milliseconds of zero or more');
  if (jitter !== 'full' && jitter !== 'none') throw new RangeError(`jitter must be 'full' or 'none', got ${JSON.stringify(jitter)}`);
  for (let attempt = 0; ; attempt++) {
    if (signal?.aborted) throw abortError(signal);
    let result, error, failed = false;
    try {
      result = await fn(attempt);
    } catch (e) {
      failed = true;
      error = e;
    }
    let again;
    if (failed) {
      again = !(error instanceof AbortError) && error?.name !== 'AbortError' && !(error instanceof CircuitOpenError)
        && (shouldRetry ? await shouldRetry(error) : true);
    } else if (isResponse(result)) {
      again = shouldRetry ? await shouldRetry(result) : RETRY_STATUSES.has(result.status);
    } else {
      again = shouldRetry ? await shouldRetry(result) : false;
    }
    if (!again || attempt >= retries) {
      if (failed) throw error;
      return result;
    }
    const bound = Math.min(cap, base * 2 ** attempt);
    let wait = jitter === 'full' ? random() * bound : bound;
    if (respectRetryAfter) {
      const source = failed ? error?.response ?? error : result;
      const hinted = isResponse(source) || source?.headers ? serverWaitMs(source) : null;
      const own = typeof error?.retryAfterMs === 'number' ? error.retryAfterMs : null;
      const server = hinted ?? own;
      if (server !== null) wait = Math.max(wait, server);
    }
    onRetry?.({ attempt, waitMs: wait, error: failed ? error : undefined, response: failed ? undefined : result });
    if (!failed && isResponse(result) && result.body && typeof result.body.cancel === 'function' && !result.bodyUsed) {
      // Free the connection of a response that is thrown away.
      result.body.cancel().catch(() => {});
    }
    await delay(wait, signal);
  }
}
