// sluice client module: register the rate-limiting Service Worker, and fetch politely.
//
//   import { register, politeFetch } from '/sluice/client.js';
//   await register();                       // resolves once this page is controlled
//   const res = await politeFetch('/api/items', {}, { maxAttempts: 4 });

/**
 * Registers the sluice Service Worker and resolves, with the registration, once this page is
 * controlled by it: at once on later loads; on the first load after the worker's `activate`
 * (which calls `clients.claim()`); after a hard reload (which bypasses workers) by asking the
 * active worker to claim the page.
 *
 * Options: `url` ('/sluice/sw.js'), `scope` ('/'), `timeoutMs` (10000), `onFailed({ reason,
 * mode })`.
 *
 * When the worker's limiter has failed (its module did not load, or trapped), the page gets a
 * `sluice:failed` event on `window` (`event.detail`: `{ reason, mode }`, `mode` being the
 * configured `fail`, 'open' or 'closed') and `onFailed` is called: once per page, also when the
 * failure happened before this page loaded.
 *
 * @throws Error when Service Workers are unavailable (they need a secure context: https, or
 *   http on localhost / 127.0.0.1) or the page is not controlled within `timeoutMs`.
 */
export async function register(options = {}) {
  const { url = '/sluice/sw.js', scope = '/', timeoutMs = 10000, onFailed } = options;
  const container = globalThis.navigator && navigator.serviceWorker;
  if (!container) {
    throw new Error('sluice: Service Workers are unavailable here (a secure context is needed)');
  }
  if (onFailed) failureCallbacks.push(onFailed);
  listenForFailure(container);
  // Listen before registering: the worker may claim this page before register() resolves.
  const controlled = new Promise((resolve) => {
    if (container.controller) resolve();
    else container.addEventListener('controllerchange', () => resolve(), { once: true });
  });
  const registration = await container.register(url, { scope, updateViaCache: 'none' });
  if (!container.controller) {
    const active = registration.active;
    if (active) active.postMessage({ type: 'sluice:claim' }); // e.g. after a hard reload
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`sluice: the Service Worker did not control this page within ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      await Promise.race([controlled, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }
  // The worker answers with `sluice:failed` if its limiter has already failed.
  if (container.controller) container.controller.postMessage({ type: 'sluice:hello' });
  return registration;
}

const failureCallbacks = [];
let failureListening = false;
let failureSeen = false;

function listenForFailure(container) {
  if (failureListening) return;
  failureListening = true;
  container.addEventListener('message', (event) => {
    const data = event.data;
    if (!data || data.type !== 'sluice:failed' || failureSeen) return;
    failureSeen = true;
    const detail = { reason: String(data.reason), mode: data.mode };
    console.error(`sluice: the browser limiter failed (${detail.reason}); fail ${detail.mode}`);
    for (const callback of failureCallbacks) callback(detail);
    globalThis.dispatchEvent(new CustomEvent('sluice:failed', { detail }));
  });
  // Messages from the worker wait until the page is ready for them; this module is.
  if (container.startMessages) container.startMessages();
}

/**
 * `Retry-After` as milliseconds from `nowMs`: delta-seconds or an HTTP-date; a date in the
 * past is 0. `null` when absent or unreadable.
 */
export function parseRetryAfter(value, nowMs = Date.now()) {
  if (value === null || value === undefined) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  // HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms) opens with a day name.
  const at = /^[A-Za-z]{3}/.test(text) ? Date.parse(text) : NaN;
  if (Number.isNaN(at)) return null;
  return Math.max(0, at - nowMs);
}

/**
 * The wait before retry number `attempt` (1 = the first retry): full jitter over an exponential
 * ceiling, `random() * min(maxDelayMs, baseDelayMs * 2^(attempt-1))`, added to the server's
 * `retryAfterMs` when it gave one (never earlier than it said; spread, so that clients told the
 * same time do not return together).
 */
export function backoffDelay(attempt, { baseDelayMs = 100, maxDelayMs = 10000, retryAfterMs = null, random = Math.random } = {}) {
  const ceiling = Math.min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1));
  const jitter = random() * ceiling;
  return (retryAfterMs === null ? 0 : retryAfterMs) + jitter;
}

function abortError(signal) {
  return signal.reason !== undefined ? signal.reason : new DOMException('The operation was aborted.', 'AbortError');
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(abortError(signal));
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    const timer = setTimeout(() => {
      if (signal) signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    if (signal) signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** The wait a 429/503 asks for, in ms: a sluice JSON body's exact `retry_after_ms`, else `Retry-After`. */
async function askedWait(response) {
  const type = response.headers.get('content-type') || '';
  if (response.status === 429 && type.includes('json')) {
    try {
      const body = await response.clone().json();
      if (Number.isFinite(body.retry_after_ms) && body.retry_after_ms >= 0) return body.retry_after_ms;
    } catch (e) {
      // not sluice's body: fall back to the header
    }
  }
  return parseRetryAfter(response.headers.get('retry-after'));
}

/**
 * `fetch`, retrying 429 and 503 politely: it waits at least what `Retry-After` says (or the
 * exact `retry_after_ms` of a sluice 429 body), plus full-jitter exponential backoff, for at
 * most `maxAttempts` attempts and `maxTotalDelayMs` of waiting in all. When it may not retry
 * (attempts or delay budget spent) it returns the last response as it is: the caller still
 * sees the 429 and its headers.
 *
 * Options (third argument): `maxAttempts` (5), `baseDelayMs` (100), `maxDelayMs` (10000, the
 * ceiling of one backoff), `maxTotalDelayMs` (30000), `retryOn` ([429, 503]), `signal`
 * (defaults to `init.signal`; aborting rejects at once, also while waiting), `onRetry({
 * attempt, delayMs, response })`, `priority` ('high', 'normal' or 'low': sent as
 * `X-Sluice-Priority`; without it no such header is added), `retryNonIdempotent` (false), and
 * `fetch` / `random` for tests.
 *
 * A 429 is retried whatever the method: it says the request was not processed (sluice's
 * limiters answer it before the request goes anywhere). A 503 may come from a server that
 * started the work, so a method that is not idempotent (POST, PATCH, CONNECT and any other
 * outside GET, HEAD, OPTIONS, TRACE, PUT, DELETE) is not retried on 503 unless
 * `retryNonIdempotent` is true: the 503 is returned as it is.
 *
 * Network errors are not retried: a request that may have reached the server is never sent
 * twice behind the caller's back.
 *
 * With a signal, a same-origin request controlled by the sluice worker carries an
 * `X-Sluice-Request-Id` header, and an abort tells the worker (a `sluice:cancel` message) to
 * take that request out of its queue at once: Chromium does not abort the worker's copy of the
 * request when the page aborts it.
 *
 * @returns the Response
 * @throws the signal's reason on abort, or fetch's own errors
 */
export async function politeFetch(input, init = {}, options = {}) {
  const {
    maxAttempts = 5,
    baseDelayMs = 100,
    maxDelayMs = 10000,
    maxTotalDelayMs = 30000,
    retryOn = [429, 503],
    signal = init.signal,
    onRetry,
    priority,
    retryNonIdempotent = false,
    fetch: fetchImpl = globalThis.fetch.bind(globalThis),
    random = Math.random,
  } = options;
  if (priority !== undefined && !PRIORITIES.includes(priority)) {
    throw new TypeError(`sluice: priority must be one of ${PRIORITIES.join(', ')}, not ${JSON.stringify(priority)}`);
  }
  // One Request, cloned per attempt, so that a body can be sent again.
  let request = new Request(input, signal ? { ...init, signal } : init);
  const controller = signal ? workerFor(request.url) : null;
  const requestId = controller ? randomId() : null;
  if (priority !== undefined || requestId !== null) {
    const headers = new Headers(request.headers);
    if (priority !== undefined) headers.set('x-sluice-priority', priority);
    if (requestId !== null) headers.set('x-sluice-request-id', requestId);
    request = new Request(request, { headers });
  }
  const idempotent = IDEMPOTENT.has(request.method);
  const onAbort = () => controller.postMessage({ type: 'sluice:cancel', id: requestId });
  if (controller) signal.addEventListener('abort', onAbort, { once: true });
  try {
    let waited = 0;
    for (let attempt = 1; ; attempt++) {
      if (signal && signal.aborted) throw abortError(signal);
      const response = await fetchImpl(request.clone());
      if (!retryOn.includes(response.status) || attempt >= maxAttempts) return response;
      if (response.status === 503 && !idempotent && !retryNonIdempotent) return response;
      const retryAfterMs = await askedWait(response);
      const delayMs = backoffDelay(attempt, { baseDelayMs, maxDelayMs, retryAfterMs, random });
      if (waited + delayMs > maxTotalDelayMs) return response;
      if (onRetry) onRetry({ attempt, delayMs, response });
      if (response.body) response.body.cancel().catch(() => {});
      await sleep(delayMs, signal);
      waited += delayMs;
    }
  } finally {
    if (controller) signal.removeEventListener('abort', onAbort);
  }
}

const PRIORITIES = ['high', 'normal', 'low'];
// RFC 9110, 9.2.2: a repeated request of these methods has the effect of one.
const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']);

/** The sluice worker controlling this page, if `url` is same-origin (only those can be queued). */
function workerFor(url) {
  const container = globalThis.navigator && globalThis.navigator.serviceWorker;
  const controller = container && container.controller;
  if (!controller || !globalThis.location || new URL(url).origin !== globalThis.location.origin) return null;
  return controller;
}

function randomId() {
  return Math.random().toString(36).slice(2, 12) + Math.random().toString(36).slice(2, 12);
}
