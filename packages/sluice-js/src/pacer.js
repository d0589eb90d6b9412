// The paced client: reads every response's limit fields (headers.js), keeps one limit per
// server policy in a state it does not own (a store: this process's memory, or Redis for a
// fleet), runs the pacing step (pacing.js) against it, and waits what the step says.

import { abortError } from './errors.js';
import { readRateLimits } from './headers.js';
import { admit, observe, abandon, reconcile, snapshot, newState, PROBE_MS } from './pacing.js';
import { durationNs, sleep } from './time.js';

const realClock = {
  now: () => globalThis.performance.now(),
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (t) => globalThis.clearTimeout(t),
};

/**
 * The state in this process's memory. `update(fn, fresh)` runs `fn(state, nowMs)` and returns
 * its answer; `fresh(nowMs)` makes the state the first time.
 */
export class MemoryPacerStore {
  #state = null;
  #now;
  constructor({ now = realClock.now } = {}) {
    this.#now = now;
  }
  update(fn, fresh) {
    const now = this.#now();
    this.#state ??= fresh(now);
    return fn(this.#state, now);
  }
  /** How long to wait at most before asking the state again: only this process changes it. */
  get pollMs() {
    return PROBE_MS;
  }
}

/** Reads `limits` (`{ requests: '60/min', tokens: '90000/min' }`) into `{ unit: { limit, windowMs } }`. */
function configuredLimits(limits = {}) {
  const out = {};
  for (const [unit, text] of Object.entries(limits)) {
    const m = /^\s*(\d+)\s*(?:\/|per)\s*(.+)$/.exec(String(text));
    const windowNs = m ? durationNs(/^\d/.test(m[2].trim()) ? m[2].trim() : `1${m[2].trim()}`, `limits.${unit}`) : null;
    if (!m || !windowNs || Number(m[1]) < 1) {
      throw new RangeError(`limits.${unit}: write a quota like "60/min" or "100 per 10s", got ${JSON.stringify(text)}`);
    }
    out[unit] = { limit: Number(m[1]), windowMs: Number(windowNs / 1000000n) };
  }
  return out;
}

/** The pacer's reading of an answer to one of its tickets (Ticket.observe's path). */
const OBSERVE = Symbol('observe');

/**
 * A request admitted by the pacer, to be settled once: `observe(response)` when its response
 * came, `abandon()` when none will (a network error, an abort). Either gives back what it
 * holds in flight; a second call does nothing. `reconcile(used)` corrects its declared cost
 * from the response's usage.
 */
export class Ticket {
  #pacer;
  #inner;
  #settled = false;
  constructor(pacer, inner) {
    this.#pacer = pacer;
    this.#inner = inner;
  }
  /** Reads the response's limit fields into the pacer and settles the ticket. */
  observe(response) {
    if (this.#settled) return this.#pacer.observe(response);
    this.#settled = true;
    return this.#pacer[OBSERVE](response, this.#inner);
  }
  /** Settles the ticket without a response. */
  abandon() {
    if (this.#settled) return undefined;
    this.#settled = true;
    return this.#pacer.update((s) => abandon(s, this.#inner));
  }
  /** Corrects the declared cost by what was used (`{ tokens: 812 }`). */
  reconcile(used) {
    return this.#pacer.update((s) => reconcile(s, this.#inner, used));
  }
}

/**
 * A client that paces itself from what servers say: each response's limit fields (IETF
 * RateLimit/RateLimit-Policy, OpenAI, Anthropic, GitHub, Retry-After) set one limit per server
 * policy, and requests are spread so that what remains lasts until its reset.
 *
 * Options: `limits` (`{ requests: '60/min' }`, what holds while the server says nothing; without
 * it, requests go one at a time until the first response), `store` (a MemoryPacerStore, the
 * default, or `sluice-limits/redis`'s RedisPacerStore for processes that pace as one client),
 * and for tests `now` (monotonic ms), `wallNow` (ms since 1970, what header times are read
 * against) and `timers` ({ setTimeout, clearTimeout } driven with `now`).
 */
export class Pacer {
  #store;
  #fresh;
  #clock;
  #wallNow;
  #skewMs = null;
  #tail = Promise.resolve();
  #news = null;
  #wake = null;

  constructor(options = {}) {
    const configured = configuredLimits(options.limits);
    this.#fresh = (now) => newState(configured, now);
    const now = options.now ?? realClock.now;
    const timers = options.timers ?? realClock;
    this.#clock = { now, setTimeout: (fn, ms) => timers.setTimeout(fn, ms), clearTimeout: (t) => timers.clearTimeout(t) };
    this.#wallNow = options.wallNow ?? (() => Date.now());
    this.#store = options.store ?? new MemoryPacerStore({ now });
  }

  /** Runs the step `fn(state, nowMs)` on the store's state. */
  update(fn) {
    return this.#store.update(fn, this.#fresh);
  }

  /**
   * Waits until a request of `cost` (`{ tokens: 800 }`; a request counts 1 for request limits)
   * may go, and returns its Ticket. Requests are admitted in the order they asked (in this
   * process).
   *
   * # Errors
   * AbortError when `signal` aborts first (nothing spent).
   *
   * # Cancel safety
   * An aborted wait spends nothing; a returned ticket must be settled (observe or abandon).
   */
  acquire({ cost = {}, signal } = {}) {
    const run = this.#tail.then(() => this.#take(cost, signal));
    this.#tail = run.then(() => undefined, () => undefined);
    return run;
  }

  async #take(cost, signal) {
    for (;;) {
      if (signal?.aborted) throw abortError(signal);
      const r = await this.update((s, now) => admit(s, now, cost));
      if (r.ticket) return new Ticket(this, r.ticket);
      await this.#wait(Math.min(r.waitMs, this.#store.pollMs), signal);
    }
  }

  /** Sleeps `ms`, or until a response is observed (which may change the answer). */
  async #wait(ms, signal) {
    this.#news ??= new Promise((resolve) => { this.#wake = resolve; });
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await Promise.race([sleep(ms, stop.signal, this.#clock).catch(() => {}), this.#news]);
    } finally {
      stop.abort();
      signal?.removeEventListener('abort', onAbort);
    }
    if (signal?.aborted) throw abortError(signal);
  }

  /**
   * Reads the limit fields of a response the pacer did not admit (another client's, a probe):
   * a ticket's own response goes to `ticket.observe`. Returns what was read
   * (readRateLimits' answer).
   */
  observe(response) {
    return this[OBSERVE](response, null);
  }

  async [OBSERVE](response, ticket) {
    const reading = readRateLimits(response, { now: this.#wallNow(), skewMs: this.#skewMs });
    this.#skewMs = reading.skewMs;
    await this.update((s, now) => observe(s, now, reading, response.status, ticket));
    const wake = this.#wake;
    this.#news = null;
    this.#wake = null;
    wake?.();
    return reading;
  }

  /**
   * Runs `fn()` once the pacer admits it; a Response it returns is observed (anything else
   * settles the ticket without one). Resolves to what `fn` returned.
   */
  async schedule(fn, { cost, signal } = {}) {
    const ticket = await this.acquire({ cost, signal });
    let result;
    try {
      result = await fn();
    } catch (e) {
      await ticket.abandon();
      throw e;
    }
    if (result && typeof result.status === 'number' && result.headers) await ticket.observe(result);
    else await ticket.abandon();
    return result;
  }

  /**
   * What the pacer knows now: `{ limits: { key: { unit, limit, remaining, resetInMs, windowMs,
   * inflight, configured } }, blockedForMs, skewMs }`. Keys are `family:policy` (`ietf:burst`,
   * `openai:tokens`, `github:core`, `configured:requests`).
   */
  async state() {
    return this.update((s, now) => ({
      limits: snapshot(s, now), blockedForMs: Math.max(0, s.blockedUntil - now), skewMs: this.#skewMs,
    }));
  }
}

/** A Pacer (see the class). */
export function pacer(options) {
  return new Pacer(options);
}

/** What an API's JSON body says it used, by provider: `{ tokens, 'input-tokens', 'output-tokens' }`. */
const USAGE = {
  openai: (body) => {
    const u = body?.usage;
    if (!u) return null;
    const total = u.total_tokens ?? ((u.prompt_tokens ?? u.input_tokens ?? 0) + (u.completion_tokens ?? u.output_tokens ?? 0));
    return { tokens: total };
  },
  anthropic: (body) => {
    const u = body?.usage;
    if (!u) return null;
    const input = (u.input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0) + (u.cache_read_input_tokens ?? 0);
    const output = u.output_tokens ?? 0;
    return { tokens: input + output, 'input-tokens': input, 'output-tokens': output };
  },
};

/**
 * `fetch`, paced: `paced(fetch, options)` returns `(input, init) => Promise<Response>` that
 * waits for the pacer before each call and reads each response. `init.cost` (`{ tokens: 800 }`)
 * declares what a request will spend of token limits; with `usage` ('openai', 'anthropic', or
 * `(json) => ({ tokens })`) a JSON response's usage reconciles it. Options are the Pacer's, or
 * `pacer` to share one. The function has a `pacer` property.
 */
export function paced(fetchFn = globalThis.fetch, options = {}) {
  const p = options.pacer ?? new Pacer(options);
  const usage = typeof options.usage === 'string' ? USAGE[options.usage] : options.usage;
  if (options.usage !== undefined && typeof usage !== 'function') {
    throw new RangeError(`usage must be 'openai', 'anthropic' or a function, got ${JSON.stringify(options.usage)}`);
  }
  const call = async (input, init = undefined) => {
    const { cost, ...rest } = init ?? {};
    const ticket = await p.acquire({ cost, signal: rest.signal });
    let response;
    try {
      response = await fetchFn(input, init === undefined ? undefined : rest);
    } catch (e) {
      await ticket.abandon();
      throw e;
    }
    await ticket.observe(response);
    if (usage && cost && response.ok && /json/.test(response.headers.get('content-type') ?? '')) {
      // Read a copy, so the caller's body is untouched; reconcile when it is in.
      response.clone().json().then((body) => {
        const used = usage(body);
        if (used) return ticket.reconcile(used);
        return undefined;
      }).catch(() => {});
    }
    return response;
  };
  call.pacer = p;
  return call;
}
