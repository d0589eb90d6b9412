// The pacing step: what a client may send now, given what servers said. Pure functions over a
// plain, JSON-able state and a `now` in ms handed in by the store (the process's monotonic
// clock, or Redis's clock when processes share the state), so that the same step runs in
// memory and in a compare-and-set loop on Redis. No clock, no timer, no I/O here.
//
// A limit is one quota a server announced (a policy, or OpenAI's requests or tokens, or a
// GitHub resource): { unit, limit, windowMs, remaining, resetAt, next, inflight, seq,
// continuous }. `continuous`: the server refills it evenly until it is full at the reset (a
// token bucket: OpenAI, Anthropic), rather than all at once at the reset (a window: GitHub).
// `remaining` is the server's figure less what was sent since; `inflight` what was sent and
// not answered (the server may not have counted it yet); `next` the earliest time for the next
// request, so that what remains is spread evenly until `resetAt`. `effective`: the IETF
// fields' `t`, which draft 12 of draft-ietf-httpapi-ratelimit-headers calls the effective
// window (no more than `r` within it) where draft 9 called it a reset: past it nothing says the
// quota is back, so the limit is unknown again until an answer tells (one request at a time).

/** Read a reset as "the same window" when it moved by less than this (resets come in whole seconds). */
const SAME_WINDOW_MS = 1100;
/** After a reset, wait this much longer before spending the new quota (the server's reset may lag ours). */
export const RESET_MARGIN_MS = 25;
/** A 429 without Retry-After and without an exhausted limit: wait this, doubling up to BACKOFF_MAX_MS. */
const BACKOFF_MS = 1000;
const BACKOFF_MAX_MS = 60000;
/** No request waits longer than this for news before it is sent to learn the limit. */
export const PROBE_MS = 1000;
/**
 * A request in flight for longer than this is taken as lost (its process died, its answer
 * never read): its in-flight counts are given back, so a shared state does not keep them.
 */
export const INFLIGHT_TTL_MS = 120000;

/** A fresh state. `configured`: `{ unit: { limit, windowMs } }`, what applies while the server says nothing. */
export function newState(configured = {}, now = 0) {
  const state = { seq: 0, heard: {}, answered: false, inflight: 0, blockedUntil: 0, backoffMs: 0, limits: {}, open: {} };
  for (const [unit, q] of Object.entries(configured)) {
    state.limits[`configured:${unit}`] = {
      unit, limit: q.limit, windowMs: q.windowMs, remaining: q.limit, resetAt: now + q.windowMs,
      next: now, at: now, inflight: 0, seq: 0, configured: true, continuous: false,
    };
  }
  return state;
}

/** The cost of a request for a limit of `unit`: 1 request; declared tokens for token units. */
function costFor(cost, unit) {
  if (unit === 'requests') return 1;
  if (cost[unit] !== undefined) return cost[unit];
  if ((unit === 'input-tokens' || unit === 'output-tokens') && cost.tokens !== undefined) return cost.tokens;
  return 0;
}

/**
 * Brings a limit to `now`: past its reset the quota is full again, less what is in flight; a
 * continuous one before its reset has regained its share of what it lacked (evenly, full at
 * the reset).
 */
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
  // A quota never stated, or an IETF effective window past, is unknown again: the next answer
  // tells (one request at a time).
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

/**
 * The limits that apply now: the server's, and the configured ones of a unit the server has
 * not announced a limit in (`state.heard`: `{ unit: true }`).
 */
function* applying(state) {
  for (const [key, l] of Object.entries(state.limits)) {
    if (l.configured && state.heard?.[l.unit]) continue;
    yield [key, l];
  }
}

/**
 * One try to send a request of `cost` (`{ tokens, 'input-tokens', ... }`; a request counts 1
 * for request limits). Returns `{ ticket }` when it may go now (the state has spent it), or
 * `{ waitMs }`: try again after that long, or sooner if a response came. `waitMs` is Infinity
 * when only a response can tell (nothing known, or a quota spent without a known reset, while
 * requests are in flight).
 */
export function admit(state, now, cost = {}) {
  prune(state, now);
  if (now < state.blockedUntil) return { waitMs: state.blockedUntil - now };
  // Before any answer, one request at a time learns the limits (unless some are configured).
  if (!state.answered && state.inflight > 0 && Object.keys(state.limits).length === 0) return { waitMs: Infinity };
  let wait = 0;
  const charges = [];
  for (const [key, l] of applying(state)) {
    const c = costFor(cost, l.unit);
    if (c === 0 && l.unit !== 'requests') continue;
    roll(l, now);
    if (l.remaining !== null && l.remaining < c) {
      if (l.resetAt !== null && l.continuous && l.limit !== null && l.limit > l.remaining) {
        // A bucket refilled evenly until it is full at the reset: wait for the part missing.
        wait = Math.max(wait, ((c - l.remaining) * (l.resetAt + RESET_MARGIN_MS - now)) / (l.limit - l.remaining));
      } else if (l.resetAt !== null) wait = Math.max(wait, l.resetAt + RESET_MARGIN_MS - now);
      else if (l.inflight > 0) wait = Infinity;
      // Nothing in flight and no reset known: send one to learn (a 429 will say when).
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
      // The remaining quota, spread evenly until the reset: this request takes c/before of the
      // time left. A timer that fired late is caught up by at most one step.
      const step = ((l.resetAt - now) * c) / before;
      l.next = Math.max(l.next, now - step) + step;
    }
  }
  state.inflight++;
  state.open[seq] = { at: now, spent };
  return { ticket: { seq, spent } };
}

/**
 * Gives back what a ticket holds in flight (a response came, or the request failed), as the
 * state recorded it when it granted the ticket: once, since the record goes with it (a step
 * run again on a retried compare-and-set, or a ticket already taken as lost, gives nothing).
 */
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

/** Gives back the requests in flight for longer than INFLIGHT_TTL_MS. */
function prune(state, now) {
  for (const [seq, record] of Object.entries(state.open)) {
    if (now - record.at > INFLIGHT_TTL_MS) release(state, { seq: Number(seq) });
  }
}

/**
 * A response to the request of `ticket` (null for a response the pacer did not send):
 * `reading` is readRateLimits()'s answer, `status` the HTTP status. Each limit it announces
 * replaces what was known, less what is in flight besides this request: a `remaining` that
 * rose without a reset is taken as given (the server may have raised the quota); the newest
 * reset read wins, but an answer older than one already read for the limit (its request sent
 * before) is ignored while it names the same window. A 429 or
 * a Retry-After holds every request back: for Retry-After, else until the reset of a limit the
 * answer says is spent, else a backoff from 1 s doubling to 60 s.
 */
export function observe(state, now, reading, status, ticket = null) {
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
      // Unstated: the longest reset seen is the best lower bound of the window.
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
      // A quota raised (or a reset moved closer) shortens the step at once. The request that
      // brought the figure is the first of the spread: `remaining` more follow it, one every
      // (time to the reset) / (remaining + 1), as admit() then spaces them.
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

/**
 * Settles a ticket whose request got no response (a network error, an abort): its in-flight
 * counts are given back, its spending stays (the server may have counted it).
 */
export function abandon(state, ticket) {
  release(state, ticket);
}

const isTokens = (v) => Number.isSafeInteger(v) && v >= 0;

/**
 * What a JSON answer's `usage` says a request used, for reconciling a declared cost:
 * OpenAI's (`total_tokens`, else `prompt_tokens` + `completion_tokens`, or the Responses API's
 * `input_tokens` + `output_tokens`) as `{ tokens }`, Anthropic's (`input_tokens` with its cache
 * counts, `output_tokens`) as `{ tokens, 'input-tokens', 'output-tokens' }`. Null when the body
 * has no `usage` object with whole counts.
 */
export function readUsage(body) {
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

/**
 * Reconciles a request's declared cost with its use (`used`: `{ tokens, ... }`, e.g. from
 * OpenAI's `usage.total_tokens`), for limits whose latest figure did not come after it: the
 * difference goes back to (or is taken from) what remains.
 */
export function reconcile(state, ticket, used) {
  for (const [key, declared] of Object.entries(ticket.spent)) {
    const l = state.limits[key];
    if (!l || l.unit === 'requests' || l.remaining === null) continue;
    const actual = costFor(used, l.unit);
    if (l.seq >= ticket.seq) continue; // the server's figure already counts the request
    l.remaining = Math.max(0, l.remaining + declared - actual);
  }
}

/** What is known, for a look: `{ key: { unit, limit, remaining, resetInMs, windowMs, inflight } }`. */
export function snapshot(state, now) {
  const out = {};
  for (const [key, l] of Object.entries(state.limits)) {
    out[key] = {
      unit: l.unit, limit: l.limit, remaining: l.remaining, windowMs: l.windowMs, inflight: l.inflight,
      resetInMs: l.resetAt === null ? null : Math.max(0, l.resetAt - now), configured: !!l.configured,
    };
  }
  return out;
}
