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
 * Options: `url` ('/sluice/sw.js'), `scope` ('/'), `timeoutMs` (10000).
 *
 * @throws Error when Service Workers are unavailable (they need a secure context: https, or
 *   http on localhost / 127.0.0.1) or the page is not controlled within `timeoutMs`.
 */
export async function register(options = {}) {
  const { url = '/sluice/sw.js', scope = '/', timeoutMs = 10000 } = options;
  const container = globalThis.navigator && navigator.serviceWorker;
  if (!container) {
    throw new Error('sluice: Service Workers are unavailable here (a secure context is needed)');
  }
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
  return registration;
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
 * attempt, delayMs, response })`, and `fetch` / `random` for tests.
 *
 * Network errors are not retried: a request that may have reached the server is never sent
 * twice behind the caller's back.
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
    fetch: fetchImpl = globalThis.fetch.bind(globalThis),
    random = Math.random,
  } = options;
  // One Request, cloned per attempt, so that a body can be sent again.
  const request = new Request(input, signal ? { ...init, signal } : init);
  let waited = 0;
  for (let attempt = 1; ; attempt++) {
    if (signal && signal.aborted) throw abortError(signal);
    const response = await fetchImpl(request.clone());
    if (!retryOn.includes(response.status) || attempt >= maxAttempts) return response;
    const retryAfterMs = await askedWait(response);
    const delayMs = backoffDelay(attempt, { baseDelayMs, maxDelayMs, retryAfterMs, random });
    if (waited + delayMs > maxTotalDelayMs) return response;
    if (onRetry) onRetry({ attempt, delayMs, response });
    if (response.body) response.body.cancel().catch(() => {});
    await sleep(delayMs, signal);
    waited += delayMs;
  }
}
