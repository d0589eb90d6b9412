// sluice client module: register the rate-limiting Service Worker, and fetch politely.
//
// One file, past 700 lines: the page fetches it as one module from /sluice/client.js (and
// `sluice bundle` writes it as one file for static hosts); about 400 of its lines are the
// generated copy of the npm package's headers.js and pacing.js (`node web/gen-pacing.mjs`),
// checked byte for byte by tests/pacing-copy.test.mjs, not code written twice.
//
//   import { register, politeFetch } from '/sluice/client.js';
//   await register();                       // resolves once this page is controlled
//   const res = await politeFetch('/api/items', {}, { maxAttempts: 4 });
//   const chat = await politeFetch('https://api.example.com/v1/chat', { method: 'POST', body },
//     { pace: true, tokens: 800 });         // paced from the server's limit fields, every tab as one

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
 * `X-Sluice-Priority`; without it no such header is added), `retryNonIdempotent` (false),
 * `pace` and `tokens` (below), and `fetch` / `random` for tests.
 *
 * **Pacing from the server's limits** (`pace: true`, or `pace: { key, limits }`): every answer's
 * limit fields (the IETF `RateLimit` and `RateLimit-Policy`, OpenAI's, Anthropic's and
 * GitHub's `x-ratelimit-*`, `Retry-After`) are read, and each attempt waits until the server's
 * remaining quota, spread evenly until its reset, gives it a turn: the rules of the npm
 * package's `paced(fetch)`, whose files this module holds a copy of. Every tab of the origin
 * paces as one client per `key` (default: the origin of the URL fetched): the state is one
 * IndexedDB record (database `sluice-pace`), read and written in one transaction per step, and
 * a BroadcastChannel (`sluice-pace`) wakes the other tabs' waiting requests when an answer
 * came. `limits` (`{ requests: { limit: 60, windowMs: 60000 } }`) hold for the units the server
 * announces nothing in. When the page is controlled by the sluice Service Worker with
 * `pace_from_server`, a same-origin request is paced there (every tab's, in one line) and not
 * again here.
 *
 * **A declared cost** (`tokens`: an LLM call's estimated tokens) waits on the server's token
 * limits as well as its request limits, and is reconciled from the answer: its token fields
 * (the drop in `x-ratelimit-remaining-tokens`) replace the estimate, and a JSON answer's
 * `usage` (OpenAI's `total_tokens`, Anthropic's input and output tokens) gives the difference
 * back to the limits its fields did not update. Through the Service Worker the cost is sent as
 * the request header `X-Sluice-Tokens: N`, which the worker reads the same way.
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
    pace = false,
    tokens,
    fetch: fetchImpl = globalThis.fetch.bind(globalThis),
    random = Math.random,
  } = options;
  if (priority !== undefined && !PRIORITIES.includes(priority)) {
    throw new TypeError(`sluice: priority must be one of ${PRIORITIES.join(', ')}, not ${JSON.stringify(priority)}`);
  }
  if (tokens !== undefined && !(Number.isSafeInteger(tokens) && tokens >= 0)) {
    throw new TypeError(`sluice: tokens must be a whole number of tokens, not ${JSON.stringify(tokens)}`);
  }
  if (pace !== false && pace !== true && (pace === null || typeof pace !== 'object')) {
    throw new TypeError(`sluice: pace must be true, false or { key, limits }, not ${JSON.stringify(pace)}`);
  }
  // One Request, cloned per attempt, so that a body can be sent again.
  let request = new Request(input, signal ? { ...init, signal } : init);
  const worker = workerFor(request.url);
  const controller = signal ? worker : null;
  const requestId = controller ? randomId() : null;
  // Paced here unless the controlling worker paces this request itself.
  const workerPaces = worker !== null && (pace !== false || tokens !== undefined) && (await workerPacing());
  const pacer = pace !== false && !workerPaces ? pagePacer(request.url, pace) : null;
  const declared = workerPaces && tokens !== undefined;
  if (priority !== undefined || requestId !== null || declared) {
    const headers = new Headers(request.headers);
    if (priority !== undefined) headers.set('x-sluice-priority', priority);
    if (requestId !== null) headers.set('x-sluice-request-id', requestId);
    if (declared) headers.set('x-sluice-tokens', String(tokens));
    request = new Request(request, { headers });
  }
  const cost = tokens === undefined ? {} : { tokens };
  const idempotent = IDEMPOTENT.has(request.method);
  const onAbort = () => controller.postMessage({ type: 'sluice:cancel', id: requestId });
  if (controller) signal.addEventListener('abort', onAbort, { once: true });
  try {
    let waited = 0;
    for (let attempt = 1; ; attempt++) {
      if (signal && signal.aborted) throw abortError(signal);
      const response = pacer === null ? await fetchImpl(request.clone()) : await pacer.send(() => fetchImpl(request.clone()), cost, signal);
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

// === The page-side pacer (politeFetch's `pace`) ===

const PACE_DB = 'sluice-pace';
const PACE_STORE = 'state';
const PACE_CHANNEL = 'sluice-pace';

/** Ms since 1970 with sub-ms steps, the same in every tab of this machine: the state's clock. */
const paceNow = () => performance.timeOrigin + performance.now();

let workerPacingAnswer = null;

/** Whether the controlling sluice worker paces from the server's fields (its /sluice/state says). */
function workerPacing() {
  workerPacingAnswer ??= fetch('/sluice/state', { cache: 'no-store' })
    .then((r) => (r.ok ? r.json() : null))
    .then((state) => state !== null && state.pacing !== undefined && state.pacing !== null)
    .catch(() => false);
  return workerPacingAnswer;
}

let paceDb = null;

function openPaceDb() {
  paceDb ??= new Promise((resolve, reject) => {
    const open = indexedDB.open(PACE_DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(PACE_STORE);
    open.onsuccess = () => resolve(open.result);
    open.onerror = () => reject(open.error);
  });
  return paceDb;
}

/**
 * Runs the step `fn(state, now)` on the state of `key` in one IndexedDB transaction (so the
 * tabs' steps never interleave) and resolves to its answer once written.
 */
async function paceUpdate(key, limits, fn) {
  const db = await openPaceDb();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(PACE_STORE, 'readwrite');
    const store = tx.objectStore(PACE_STORE);
    let answer;
    const get = store.get(key);
    get.onsuccess = () => {
      const now = paceNow();
      const state = get.result ?? pacingRules.newState(limits, now);
      answer = fn(state, now);
      store.put(state, key);
    };
    tx.oncomplete = () => resolve(answer);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

const pacers = new Map();

/** The page's pacer for the server of `url` (or `pace.key`). */
function pagePacer(url, pace) {
  const key = (typeof pace === 'object' && pace.key) || new URL(url).origin;
  let p = pacers.get(key);
  if (!p) {
    p = new PagePacer(key, (typeof pace === 'object' && pace.limits) || {});
    pacers.set(key, p);
  }
  return p;
}

/** One server's pacing state, shared by the tabs through IndexedDB; waits woken by any tab's answer. */
class PagePacer {
  constructor(key, limits) {
    this.key = key;
    this.limits = limits;
    this.skewMs = null;
    this.tail = Promise.resolve();
    this.news = null;
    this.wake = null;
    this.open = new Set();
    this.channel = typeof BroadcastChannel === 'function' ? new BroadcastChannel(PACE_CHANNEL) : null;
    if (this.channel) {
      this.channel.onmessage = (event) => {
        if (event.data && event.data.key === this.key) this.wakeAll();
      };
    }
    // A tab that goes gives back what it holds in flight, so the others need not wait for it.
    globalThis.addEventListener?.('pagehide', () => {
      for (const ticket of this.open) this.update((s) => pacingRules.abandon(s, ticket)).catch(() => {});
    });
  }

  update(fn) {
    return paceUpdate(this.key, this.limits, fn);
  }

  wakeAll() {
    const wake = this.wake;
    this.news = null;
    this.wake = null;
    if (wake) wake();
  }

  /** Waits for a turn (in this tab, in the order asked), then sends; reads the answer. */
  send(call, cost, signal) {
    const turn = this.tail.then(() => this.take(cost, signal));
    this.tail = turn.then(() => undefined, () => undefined);
    return turn.then(async (ticket) => {
      let response;
      try {
        response = await call();
      } catch (e) {
        this.open.delete(ticket);
        await this.update((s) => pacingRules.abandon(s, ticket));
        this.announce();
        throw e;
      }
      await this.answered(response, ticket, cost);
      return response;
    });
  }

  async take(cost, signal) {
    for (;;) {
      if (signal && signal.aborted) throw abortError(signal);
      const r = await this.update((s, now) => pacingRules.admit(s, now, cost));
      if (r.ticket) {
        this.open.add(r.ticket);
        return r.ticket;
      }
      this.news ??= new Promise((resolve) => {
        this.wake = resolve;
      });
      await Promise.race([sleep(Math.min(r.waitMs, pacingRules.PROBE_MS), signal), this.news]);
    }
  }

  async answered(response, ticket, cost) {
    this.open.delete(ticket);
    const reading = headerRules.readRateLimits(response, { now: Date.now(), skewMs: this.skewMs });
    this.skewMs = reading.skewMs;
    await this.update((s, now) => pacingRules.observe(s, now, reading, response.status, ticket));
    this.announce();
    if (!(cost.tokens > 0) || !response.ok || !/json/.test(response.headers.get('content-type') || '')) return;
    // Read a copy, so the caller's body is untouched; reconcile when it is in.
    response
      .clone()
      .json()
      .then((body) => {
        const used = pacingRules.readUsage(body);
        if (used === null) return undefined;
        return this.update((s) => pacingRules.reconcile(s, ticket, used)).then(() => this.announce());
      })
      .catch(() => {});
  }

  /** Wakes the waiting requests of this tab and the others. */
  announce() {
    this.wakeAll();
    if (this.channel) this.channel.postMessage({ key: this.key });
  }
}

// --- generated by web/gen-pacing.mjs from packages/sluice-js/src/headers.js and pacing.js: do not edit here ---
const headerRules = (() => {

function fieldOf(headers, name) {
  if (!headers) return null;
  if (typeof headers.get === 'function') return headers.get(name);
  const v = headers[name];
  if (v !== undefined) return Array.isArray(v) ? v.join(', ') : String(v);
  for (const k of Object.keys(headers)) if (k.toLowerCase() === name) return String(headers[k]);
  return null;
}

const isDigit = (c) => c >= 48 && c <= 57;
const isAlpha = (c) => (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
const isLcAlpha = (c) => c >= 97 && c <= 122;
const TOKEN_EXTRA = new Set([...'!#$%&\'*+-.^_`|~:/'].map((ch) => ch.charCodeAt(0)));
const isTokenChar = (c) => isAlpha(c) || isDigit(c) || TOKEN_EXTRA.has(c);
const isKeyChar = (c) => isLcAlpha(c) || isDigit(c) || c === 95 || c === 45 || c === 46 || c === 42;

function parseList(text) {
  const s = String(text);
  let i = 0;
  const fail = () => { throw new SyntaxError('structured field'); };
  const ows = () => { while (s[i] === ' ' || s[i] === '\t') i++; };
  const sp = () => { while (s[i] === ' ') i++; };
  function bare() {
    const c = s[i];
    if (c === '"') {
      let out = '';
      let from = ++i;
      for (; i < s.length; i++) {
        const code = s.charCodeAt(i);
        if (code === 92) {
          const n = s[i + 1];
          if (n !== '"' && n !== '\\') fail();
          out += s.slice(from, i) + n;
          from = ++i + 1;
        } else if (code === 34) {
          out += s.slice(from, i);
          i++;
          return out;
        } else if (code < 0x20 || code > 0x7e) {
          fail();
        }
      }
      return fail();
    }
    if (c === '-' || (c >= '0' && c <= '9')) {
      const start = i;
      if (c === '-') i++;
      const intStart = i;
      while (i < s.length && isDigit(s.charCodeAt(i))) i++;
      const intLen = i - intStart;
      if (intLen === 0) fail();
      if (s[i] === '.') {
        i++;
        const fracStart = i;
        while (i < s.length && isDigit(s.charCodeAt(i))) i++;
        const fracLen = i - fracStart;
        if (intLen > 12 || fracLen === 0 || fracLen > 3) fail();
      } else if (intLen > 15) {
        fail();
      }
      return Number(s.slice(start, i));
    }
    if (c === '?') {
      const b = s[i + 1];
      if (b !== '0' && b !== '1') fail();
      i += 2;
      return b === '1';
    }
    if (c === ':') {
      const end = s.indexOf(':', i + 1);
      if (end < 0) fail();
      const bytes = s.slice(i + 1, end);
      if (!/^[A-Za-z0-9+/=]*$/.test(bytes)) fail();
      i = end + 1;
      return { bytes };
    }
    if (c !== undefined && (isAlpha(s.charCodeAt(i)) || c === '*')) {
      const start = i;
      while (i < s.length && isTokenChar(s.charCodeAt(i))) i++;
      return { token: s.slice(start, i) };
    }
    return fail();
  }
  function params() {
    const out = {};
    while (s[i] === ';') {
      i++;
      sp();
      if (!(isLcAlpha(s.charCodeAt(i)) || s[i] === '*')) fail();
      const start = i;
      while (i < s.length && isKeyChar(s.charCodeAt(i))) i++;
      const key = s.slice(start, i);
      let value = true;
      if (s[i] === '=') {
        i++;
        value = bare();
      }
      out[key] = value;
    }
    return out;
  }
  function member() {
    if (s[i] === '(') {
      i++;
      const inner = [];
      for (;;) {
        sp();
        if (s[i] === ')') {
          i++;
          return { value: inner, params: params() };
        }
        inner.push({ value: bare(), params: params() });
        if (s[i] !== ' ' && s[i] !== ')') fail();
      }
    }
    return { value: bare(), params: params() };
  }
  try {
    const out = [];
    sp();
    while (i < s.length) {
      out.push(member());
      ows();
      if (i >= s.length) return out;
      if (s[i] !== ',') fail();
      i++;
      ows();
      if (i >= s.length) fail();
    }
    return out;
  } catch {
    return null;
  }
}

const isCount = (v) => Number.isSafeInteger(v) && v >= 0;

function parseIetf(policyText, limitText) {
  const policies = new Map();
  const nameOf = (v) => (typeof v === 'string' ? v : v && typeof v.token === 'string' ? v.token : null);
  const keyOf = (name, p) => (p.pk && typeof p.pk === 'object' && typeof p.pk.bytes === 'string' ? `${name}|${p.pk.bytes}` : name);
  for (const m of (policyText === null ? [] : parseList(policyText) ?? [])) {
    const name = nameOf(m.value);
    if (name === null || !isCount(m.params.q)) continue;
    const unit = typeof m.params.qu === 'string' ? m.params.qu : 'requests';
    const windowMs = isCount(m.params.w) ? m.params.w * 1000 : null;
    policies.set(keyOf(name, m.params), { id: name, unit, limit: m.params.q, windowMs, remaining: null, resetMs: null, refill: 'window' });
  }
  for (const m of (limitText === null ? [] : parseList(limitText) ?? [])) {
    const name = nameOf(m.value);
    if (name === null || !isCount(m.params.r)) continue;
    const key = keyOf(name, m.params);
    const p = policies.get(key) ?? { id: name, unit: 'requests', limit: null, windowMs: null, remaining: null, resetMs: null, refill: 'window' };
    p.remaining = m.params.r;
    p.resetMs = isCount(m.params.t) ? m.params.t * 1000 : null;
    policies.set(key, p);
  }
  return [...policies.values()];
}

const GO_UNITS = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
const GO_DURATION = /^(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h)/;

function parseDuration(text) {
  if (text === null || text === undefined) return null;
  let s = String(text).trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  if (s === '') return null;
  let ms = 0;
  while (s.length) {
    const m = GO_DURATION.exec(s);
    if (!m) return null;
    const unit = /[a-zµμ]+$/.exec(m[0])[0];
    ms += Number(m[0].slice(0, -unit.length)) * GO_UNITS[unit];
    s = s.slice(m[0].length);
  }
  return ms;
}

function parseRfc3339(text) {
  if (text === null || text === undefined) return null;
  const s = String(text).trim();
  if (!/^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/.test(s)) return null;
  const ms = Date.parse(s.replace(' ', 'T'));
  return Number.isNaN(ms) ? null : ms;
}

let lastDate = { text: null, ms: null };

function parseHttpDate(text) {
  if (text === null || text === undefined) return null;
  if (text === lastDate.text) return lastDate.ms;
  const s = String(text).trim();
  let ms = null;
  if (/^[A-Za-z]{3,9},? /.test(s)) {
    const parsed = Date.parse(s);
    if (!Number.isNaN(parsed)) ms = parsed;
  }
  lastDate = { text, ms };
  return ms;
}

function parseRetryAfter(text, nowMs, dateMs = null) {
  if (text === null || text === undefined) return null;
  const s = String(text).trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const at = parseHttpDate(s);
  if (at === null) return null;
  return Math.max(0, at - (dateMs ?? nowMs));
}

const UNIX_TIME_FROM = 1e9;

function measureSkew(dateText, nowMs, previous = null) {
  const date = parseHttpDate(dateText);
  if (date === null) return previous;
  const sample = date - nowMs;
  if (previous === null || sample > previous || sample < previous - 2000) return sample;
  return previous;
}

const num = (text) => {
  if (text === null) return null;
  const t = text.trim();
  return /^\d+$/.test(t) ? Number(t) : null;
};

function parseOpenAI(get) {
  const out = [];
  for (const unit of ['requests', 'tokens']) {
    const remaining = num(get(`x-ratelimit-remaining-${unit}`));
    if (remaining === null) continue;
    out.push({
      id: unit, unit, limit: num(get(`x-ratelimit-limit-${unit}`)), windowMs: null, remaining,
      resetMs: parseDuration(get(`x-ratelimit-reset-${unit}`)), refill: 'continuous',
    });
  }
  return out;
}

function parseAnthropic(get, nowMs, skewMs = 0) {
  const out = [];
  for (const unit of ['requests', 'tokens', 'input-tokens', 'output-tokens']) {
    const remaining = num(get(`anthropic-ratelimit-${unit}-remaining`));
    if (remaining === null) continue;
    const at = parseRfc3339(get(`anthropic-ratelimit-${unit}-reset`));
    const serverNow = nowMs + skewMs;
    out.push({
      id: unit, unit, limit: num(get(`anthropic-ratelimit-${unit}-limit`)), windowMs: null, remaining,
      resetMs: at === null ? null : Math.max(0, at - serverNow), refill: 'continuous',
    });
  }
  return out;
}

function parseGitHub(get, nowMs, skewMs = 0) {
  const remaining = num(get('x-ratelimit-remaining'));
  if (remaining === null) return [];
  const reset = get('x-ratelimit-reset');
  let resetMs = null;
  if (reset !== null && /^\d+(\.\d+)?$/.test(reset.trim())) {
    const v = Number(reset.trim());
    resetMs = v >= UNIX_TIME_FROM ? Math.max(0, v * 1000 - (nowMs + skewMs)) : v * 1000;
  }
  const used = num(get('x-ratelimit-used'));
  const limit = num(get('x-ratelimit-limit')) ?? (used === null ? null : used + remaining);
  return [{ id: get('x-ratelimit-resource')?.trim() || 'default', unit: 'requests', limit, windowMs: null, remaining, resetMs, refill: 'window' }];
}

function readRateLimits(responseOrHeaders, options = {}) {
  const headers = responseOrHeaders?.headers ?? responseOrHeaders;
  const nowMs = options.now ?? Date.now();
  const get = (name) => fieldOf(headers, name);
  const dateText = get('date');
  const skewMs = measureSkew(dateText, nowMs, options.skewMs ?? null);
  const dateMs = parseHttpDate(dateText);
  const ra = get('retry-after');
  const out = { family: null, limits: [], retryAfterMs: ra === null ? null : parseRetryAfter(ra, nowMs, dateMs), skewMs };
  const rl = get('ratelimit');
  const rp = get('ratelimit-policy');
  if (rl !== null || rp !== null) {
    out.limits = parseIetf(rp, rl);
    if (out.limits.length) out.family = 'ietf';
    return out;
  }
  if (get('x-ratelimit-remaining-requests') !== null || get('x-ratelimit-remaining-tokens') !== null) {
    out.family = 'openai';
    out.limits = parseOpenAI(get);
    return out;
  }
  if (get('anthropic-ratelimit-requests-remaining') !== null || get('anthropic-ratelimit-tokens-remaining') !== null
    || get('anthropic-ratelimit-input-tokens-remaining') !== null) {
    out.family = 'anthropic';
    out.limits = parseAnthropic(get, nowMs, skewMs ?? 0);
    return out;
  }
  if (get('x-ratelimit-remaining') !== null) {
    out.limits = parseGitHub(get, nowMs, skewMs ?? 0);
    if (out.limits.length) out.family = 'github';
  }
  return out;
}

return { readRateLimits };
})();
const pacingRules = (() => {

const SAME_WINDOW_MS = 1100;
const RESET_MARGIN_MS = 25;
const BACKOFF_MS = 1000;
const BACKOFF_MAX_MS = 60000;
const PROBE_MS = 1000;
const INFLIGHT_TTL_MS = 120000;

function newState(configured = {}, now = 0) {
  const state = { seq: 0, heard: {}, answered: false, inflight: 0, blockedUntil: 0, backoffMs: 0, limits: {}, open: {} };
  for (const [unit, q] of Object.entries(configured)) {
    state.limits[`configured:${unit}`] = {
      unit, limit: q.limit, windowMs: q.windowMs, remaining: q.limit, resetAt: now + q.windowMs,
      next: now, at: now, inflight: 0, seq: 0, configured: true, continuous: false,
    };
  }
  return state;
}

function costFor(cost, unit) {
  if (unit === 'requests') return 1;
  if (cost[unit] !== undefined) return cost[unit];
  if ((unit === 'input-tokens' || unit === 'output-tokens') && cost.tokens !== undefined) return cost.tokens;
  return 0;
}

function roll(l, now) {
  if (l.resetAt === null) return;
  if (now < l.resetAt + RESET_MARGIN_MS) {
    if (l.continuous && l.limit !== null && l.remaining !== null && l.remaining < l.limit && now > l.at) {
      const span = l.resetAt + RESET_MARGIN_MS - l.at;
      l.remaining += ((l.limit - l.remaining) * (now - l.at)) / span;
      l.at = now;
    }
    return;
  }
  if (l.effective) {
    l.remaining = null;
    l.resetAt = null;
    l.next = null; // the answer's figure starts a new spread, its request the first step
    l.at = now;
    return;
  }
  l.remaining = l.limit === null ? null : Math.max(0, l.limit - l.inflight);
  if (l.windowMs) {
    const periods = Math.floor((now - l.resetAt) / l.windowMs) + 1;
    l.resetAt += periods * l.windowMs;
  } else {
    l.resetAt = null;
  }
  l.next = now;
  l.at = now;
}

function* applying(state) {
  for (const [key, l] of Object.entries(state.limits)) {
    if (l.configured && state.heard?.[l.unit]) continue;
    yield [key, l];
  }
}

function admit(state, now, cost = {}) {
  prune(state, now);
  if (now < state.blockedUntil) return { waitMs: state.blockedUntil - now };
  if (!state.answered && state.inflight > 0 && Object.keys(state.limits).length === 0) return { waitMs: Infinity };
  let wait = 0;
  const charges = [];
  for (const [key, l] of applying(state)) {
    const c = costFor(cost, l.unit);
    if (c === 0 && l.unit !== 'requests') continue;
    roll(l, now);
    if (l.remaining !== null && l.remaining < c) {
      if (l.resetAt !== null && l.continuous && l.limit !== null && l.limit > l.remaining) {
        wait = Math.max(wait, ((c - l.remaining) * (l.resetAt + RESET_MARGIN_MS - now)) / (l.limit - l.remaining));
      } else if (l.resetAt !== null) wait = Math.max(wait, l.resetAt + RESET_MARGIN_MS - now);
      else if (l.inflight > 0) wait = Infinity;
      continue;
    }
    if (l.remaining === null && (l.limit === null || l.effective) && l.inflight > 0) wait = Infinity;
    if (l.next > now) wait = Math.max(wait, l.next - now);
    charges.push([key, l, c]);
  }
  if (wait > 0) return { waitMs: wait };
  const seq = ++state.seq;
  const spent = {};
  for (const [key, l, c] of charges) {
    const before = l.remaining;
    if (before !== null) l.remaining = before - c;
    l.inflight += c;
    spent[key] = c;
    if (l.resetAt !== null && before !== null && before > 0) {
      const step = ((l.resetAt - now) * c) / before;
      l.next = Math.max(l.next, now - step) + step;
    }
  }
  state.inflight++;
  state.open[seq] = { at: now, spent };
  return { ticket: { seq, spent } };
}

function release(state, ticket) {
  const record = state.open[ticket.seq];
  if (!record) return;
  delete state.open[ticket.seq];
  state.inflight = Math.max(0, state.inflight - 1);
  for (const [key, c] of Object.entries(record.spent)) {
    const l = state.limits[key];
    if (l) l.inflight = Math.max(0, l.inflight - c);
  }
}

function prune(state, now) {
  for (const [seq, record] of Object.entries(state.open)) {
    if (now - record.at > INFLIGHT_TTL_MS) release(state, { seq: Number(seq) });
  }
}

function observe(state, now, reading, status, ticket = null) {
  if (ticket) release(state, ticket);
  prune(state, now);
  state.answered = true;
  const seq = ticket?.seq ?? state.seq;
  let spentReset = null;
  for (const r of reading.limits) {
    const key = `${reading.family}:${r.id}`;
    let l = state.limits[key];
    if (!l) {
      l = state.limits[key] = {
        unit: r.unit, limit: r.limit, windowMs: r.windowMs, remaining: null, resetAt: null,
        next: null, at: now, inflight: 0, seq: -1, continuous: false,
      };
    }
    if (typeof state.heard !== 'object' || state.heard === null) state.heard = {};
    state.heard[r.unit] = true;
    l.continuous = r.refill === 'continuous';
    l.effective = reading.family === 'ietf';
    if (r.limit !== null) l.limit = r.limit;
    if (r.windowMs !== null) {
      l.windowMs = r.windowMs;
      l.windowStated = true;
    } else if (!l.windowStated && r.resetMs !== null && r.resetMs > (l.windowMs ?? 0)) {
      l.windowMs = r.resetMs;
    }
    const resetAt = r.resetMs === null ? (l.windowMs ? now + l.windowMs : null) : now + r.resetMs;
    const same = resetAt !== null && l.resetAt !== null && Math.abs(resetAt - l.resetAt) <= SAME_WINDOW_MS;
    if (seq < l.seq && (same || resetAt === null)) continue;
    l.seq = Math.max(l.seq, seq);
    l.resetAt = resetAt;
    if (r.remaining !== null) {
      l.remaining = Math.max(0, r.remaining - l.inflight);
      l.at = now;
      if (l.resetAt !== null && l.remaining > 0) {
        l.next = Math.min(l.next ?? Infinity, now + (l.resetAt - now) / (l.remaining + 1));
      }
    }
    l.next ??= now;
    if (r.remaining === 0 && l.resetAt !== null) spentReset = Math.max(spentReset ?? 0, l.resetAt);
  }
  if (reading.retryAfterMs !== null) {
    state.blockedUntil = Math.max(state.blockedUntil, now + reading.retryAfterMs);
  } else if (status === 429) {
    if (spentReset !== null) {
      state.blockedUntil = Math.max(state.blockedUntil, spentReset + RESET_MARGIN_MS);
    } else {
      state.backoffMs = Math.min(BACKOFF_MAX_MS, state.backoffMs ? state.backoffMs * 2 : BACKOFF_MS);
      state.blockedUntil = Math.max(state.blockedUntil, now + state.backoffMs);
    }
  }
  if (status !== 429) state.backoffMs = 0;
}

function abandon(state, ticket) {
  release(state, ticket);
}

const isTokens = (v) => Number.isSafeInteger(v) && v >= 0;

function readUsage(body) {
  const u = body && typeof body === 'object' ? body.usage : null;
  if (!u || typeof u !== 'object') return null;
  if (isTokens(u.total_tokens)) return { tokens: u.total_tokens };
  if (isTokens(u.prompt_tokens) || isTokens(u.completion_tokens)) {
    return { tokens: (isTokens(u.prompt_tokens) ? u.prompt_tokens : 0) + (isTokens(u.completion_tokens) ? u.completion_tokens : 0) };
  }
  if (!isTokens(u.input_tokens) && !isTokens(u.output_tokens)) return null;
  const count = (v) => (isTokens(v) ? v : 0);
  const input = count(u.input_tokens) + count(u.cache_creation_input_tokens) + count(u.cache_read_input_tokens);
  const output = count(u.output_tokens);
  return { tokens: input + output, 'input-tokens': input, 'output-tokens': output };
}

function reconcile(state, ticket, used) {
  for (const [key, declared] of Object.entries(ticket.spent)) {
    const l = state.limits[key];
    if (!l || l.unit === 'requests' || l.remaining === null) continue;
    const actual = costFor(used, l.unit);
    if (l.seq >= ticket.seq) continue; // the server's figure already counts the request
    l.remaining = Math.max(0, l.remaining + declared - actual);
  }
}

function snapshot(state, now) {
  const out = {};
  for (const [key, l] of Object.entries(state.limits)) {
    out[key] = {
      unit: l.unit, limit: l.limit, remaining: l.remaining, windowMs: l.windowMs, inflight: l.inflight,
      resetInMs: l.resetAt === null ? null : Math.max(0, l.resetAt - now), configured: !!l.configured,
    };
  }
  return out;
}

return { admit, observe, abandon, reconcile, readUsage, newState, snapshot, PROBE_MS };
})();
// --- end of the generated rules ---

