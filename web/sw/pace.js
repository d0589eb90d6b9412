// Pacing from the server's own limits (`pace_from_server`): every limited request the
// configured limit admits then waits its turn here, where the limit fields of every response
// (RateLimit/RateLimit-Policy, OpenAI's, Anthropic's and GitHub's x-ratelimit-*, Retry-After)
// set one limit per server policy and what remains is spread evenly until its reset. The rules
// are the npm package's (pacing.generated.js and headers.generated.js, copies of its files);
// this worker sees every tab's requests, so the tabs of an origin pace as one client.
//
// Owns: paceState (the pacing state, in memory: a restarted worker learns again from the next
// response), the server's clock skew read from its Date fields, and the line of requests
// waiting their turn (first come, first served).
// Must not touch: the configured limit (the module decides first, fetch.js), the queue,
// IndexedDB, the responses (read, never changed).

import { readRateLimits } from './headers.generated.js';
import { abandon, admit, newState, observe, readUsage, reconcile, snapshot, PROBE_MS } from './pacing.generated.js';
import { config } from './worker.js';

/** Whether this worker paces from the server's fields. */
export const pacing = config !== null && config.pace_from_server === true;

// Nothing configured: until the server speaks the configured limit (the module's) is all.
let paceState = null;
let skewMs = null;
let line = Promise.resolve();
let news = null;
let wakeAll = null;

function stateAt(now) {
  paceState ??= newState({}, now);
  return paceState;
}

/** Resolves after `ms`, or sooner when a response was read (which may change the answer). */
function nextNews(ms) {
  news ??= new Promise((resolve) => {
    wakeAll = resolve;
  });
  let timer;
  const slept = new Promise((resolve) => {
    timer = setTimeout(resolve, Math.max(0, ms));
  });
  return Promise.race([slept, news]).finally(() => clearTimeout(timer));
}

async function take(deadline, cost) {
  for (;;) {
    const now = performance.now();
    const r = admit(stateAt(now), now, cost);
    if (r.ticket) return { ticket: r.ticket };
    // A wait the server's fields say ends past the request's deadline: refused now, with it.
    if (r.waitMs !== Infinity && now + r.waitMs > deadline) return { ticket: null, waitMs: r.waitMs };
    if (now >= deadline) return { ticket: null, waitMs: PROBE_MS };
    await nextNews(Math.min(r.waitMs, PROBE_MS, deadline - now));
  }
}

/** The request header that declares a request's cost in tokens (an LLM call's estimate). */
export const TOKENS_HEADER = 'x-sluice-tokens';

/**
 * A request's declared cost: `X-Sluice-Tokens: N` (a whole number of tokens) is `{ tokens: N }`,
 * which waits on the server's token limits as well as its request limits; absent or not a
 * whole number, the request costs one request and no tokens.
 */
export function costOf(req) {
  const text = (req.headers.get(TOKENS_HEADER) || '').trim();
  if (!/^\d{1,15}$/.test(text)) return {};
  return { tokens: Number(text) };
}

/**
 * Waits for a request's turn: `{ ticket }` once the server's fields let it go (settle it with
 * paceResponse or paceLost), or `{ ticket: null, waitMs }` when its turn would come after
 * `maxWaitMs` (`queue.max_wait_ms`): the caller answers 429 with that wait. Turns are taken
 * in the order requests ask. `cost` is costOf()'s.
 */
export function paceTurn(maxWaitMs, cost = {}) {
  const deadline = performance.now() + maxWaitMs;
  const turn = line.then(() => take(deadline, cost));
  line = turn.then(
    () => undefined,
    () => undefined,
  );
  return turn;
}

function wake() {
  const wakeUp = wakeAll;
  news = null;
  wakeAll = null;
  if (wakeUp) wakeUp();
}

/**
 * Reads a response's limit fields into the state and settles its ticket. A request that
 * declared tokens is then reconciled from the usage of a JSON answer (OpenAI's
 * `usage.total_tokens`, Anthropic's input and output tokens), read from a copy of the body
 * while the page reads its own: for the limits whose latest figure came before it (a figure
 * that came with its answer already counts what it used).
 */
export function paceResponse(response, ticket) {
  const reading = readRateLimits(response, { now: Date.now(), skewMs });
  skewMs = reading.skewMs;
  const now = performance.now();
  observe(stateAt(now), now, reading, response.status, ticket);
  wake();
  const declared = Object.entries(ticket.spent).some(([key, c]) => c > 0 && paceState.limits[key]?.unit !== 'requests');
  if (!declared || !response.ok || !/json/.test(response.headers.get('content-type') || '')) return;
  response
    .clone()
    .json()
    .then((body) => {
      const used = readUsage(body);
      if (used === null) return;
      reconcile(paceState, ticket, used);
      wake();
    })
    .catch(() => {});
}

/** Settles a ticket whose request got no response (a network error). */
export function paceLost(ticket) {
  if (paceState !== null) abandon(paceState, ticket);
}

/** What the worker knows of the server's limits, for `/sluice/state` (null when not pacing). */
export function paceSnapshot() {
  if (!pacing) return null;
  const now = performance.now();
  const s = stateAt(now);
  return { limits: snapshot(s, now), blocked_for_ms: Math.max(0, s.blockedUntil - now), skew_ms: skewMs };
}
