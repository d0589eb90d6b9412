// retry(): exponential backoff with full jitter, reading the server's own hints (Retry-After,
// RateLimit, RateLimit-Reset) from fetch responses.

import { AbortError, CircuitOpenError, abortError } from './errors.js';
import { durationNs, nsToMsCeil, sleep } from './time.js';

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
 * A point in time (Unix seconds) from which no delay in seconds could come: 10^9 s is
 * September 2001, and a delay of over 31 years is not a delay. Above it, a reset is a time.
 */
const UNIX_TIME_FROM = 1e9;

/**
 * A reset header's value as milliseconds from now: delta-seconds (the IETF draft, `sluice
 * serve`), or Unix seconds (GitLab's `RateLimit-Reset`, GitHub's `X-RateLimit-Reset`).
 */
function resetMs(text, nowMs) {
  const ms = seconds(text);
  if (ms === null || ms < UNIX_TIME_FROM * 1000) return ms;
  return Math.max(0, ms - nowMs);
}

/**
 * The server's hints in a fetch Response's headers (or a Headers object, or a plain object):
 * `retryAfterMs` from `Retry-After` (seconds or an HTTP date), `resetMs` and `remaining` from
 * `RateLimit: "policy";r=R;t=T` (or the older `RateLimit-Reset` / `RateLimit-Remaining`, or
 * `X-RateLimit-Reset` / `X-RateLimit-Remaining`, or `RateLimit: limit=L, remaining=R,
 * reset=T`), `limit` and `windowMs` from `RateLimit-Policy: "policy";q=Q;w=W` (or
 * `RateLimit-Limit`, `X-RateLimit-Limit`). A reset is seconds from now, or a Unix time in
 * seconds when it is at least 10^9 (GitLab's and GitHub's form). Missing values are null.
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
    if (dict.reset !== undefined && hints.resetMs === null) hints.resetMs = resetMs(dict.reset, nowMs);
    if (dict.limit !== undefined) hints.limit = Number(dict.limit);
  }
  const reset = header(headers, 'ratelimit-reset') ?? header(headers, 'x-ratelimit-reset');
  if (reset !== null && hints.resetMs === null) hints.resetMs = resetMs(reset, nowMs);
  const remaining = header(headers, 'ratelimit-remaining') ?? header(headers, 'x-ratelimit-remaining');
  if (remaining !== null && hints.remaining === null) hints.remaining = Number(remaining);
  const policy = header(headers, 'ratelimit-policy');
  if (policy !== null) {
    const params = Object.fromEntries(
      policy.split(',')[0].split(';').slice(1).map((p) => p.trim().split('=')).filter((kv) => kv.length === 2),
    );
    if (params.q !== undefined) hints.limit = Number(params.q);
    if (params.w !== undefined) hints.windowMs = seconds(params.w);
  }
  const lim = header(headers, 'ratelimit-limit') ?? header(headers, 'x-ratelimit-limit');
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

/** The longest wait a server may ask for by default before retry() gives up instead. */
const DEFAULT_MAX_RETRY_AFTER_MS = 60000;

/**
 * Calls `fn(attempt)` (attempt 0, 1, ...) until it succeeds or `retries` retries are spent.
 * A thrown error is retried (unless it is an AbortError, a CircuitOpenError, or
 * `shouldRetry(error)` says no); a fetch Response is retried when its status is 408, 425, 429
 * or 5xx (or `shouldRetry(response)` says so). The wait before retry n is uniform in
 * [0, min(cap, base·2^n)] ('full' jitter; 'none': exactly that bound); with
 * `respectRetryAfter` (the default), a server's Retry-After (or an exhausted RateLimit's reset)
 * is waited at least, even above `cap`, up to `maxRetryAfter` (default 60 s): a server that
 * asks for longer is not retried. After the last attempt the last Response is returned, or the
 * last error thrown.
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
    maxRetryAfter = DEFAULT_MAX_RETRY_AFTER_MS,
  } = options;
  const maxServerNs = durationNs(maxRetryAfter, 'maxRetryAfter');
  const maxServerMs = maxServerNs === null ? Infinity : nsToMsCeil(maxServerNs);
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
    const bound = Math.min(cap, base * 2 ** attempt);
    let wait = jitter === 'full' ? random() * bound : bound;
    if (again && respectRetryAfter) {
      const source = failed ? error?.response ?? error : result;
      const hinted = isResponse(source) || source?.headers ? serverWaitMs(source) : null;
      const own = typeof error?.retryAfterMs === 'number' ? error.retryAfterMs : null;
      const server = hinted ?? own;
      // A wait above maxRetryAfter is not waited: the caller gets the answer now.
      if (server !== null && server > maxServerMs) again = false;
      else if (server !== null) wait = Math.max(wait, server);
    }
    if (!again || attempt >= retries) {
      if (failed) throw error;
      return result;
    }
    onRetry?.({ attempt, waitMs: wait, error: failed ? error : undefined, response: failed ? undefined : result });
    if (!failed && isResponse(result) && result.body && typeof result.body.cancel === 'function' && !result.bodyUsed) {
      // Free the connection of a response that is thrown away.
      result.body.cancel().catch(() => {});
    }
    await delay(wait, signal);
  }
}
