// The limits a server announces in its response header fields, read without I/O: the IETF
// fields (RateLimit-Policy and RateLimit), OpenAI's, Anthropic's and GitHub's x-ratelimit-*
// fields, Retry-After and the Date field that measures the server's clock. pacer.js acts on
// what this module reads; nothing here reads a clock or keeps state (but a one-entry memo of
// the last Date field read, a pure cache).

/** The value of field `name` (lowercase) in a fetch Headers object or a plain object, or null. */
export function fieldOf(headers, name) {
  if (!headers) return null;
  if (typeof headers.get === 'function') return headers.get(name);
  const v = headers[name];
  if (v !== undefined) return Array.isArray(v) ? v.join(', ') : String(v);
  for (const k of Object.keys(headers)) if (k.toLowerCase() === name) return String(headers[k]);
  return null;
}

// === Structured field lists (RFC 9651) ===

// Character classes by code (a regular expression per character costs more than the parse).
const isDigit = (c) => c >= 48 && c <= 57;
const isAlpha = (c) => (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
const isLcAlpha = (c) => c >= 97 && c <= 122;
const TOKEN_EXTRA = new Set([...'!#$%&\'*+-.^_`|~:/'].map((ch) => ch.charCodeAt(0)));
const isTokenChar = (c) => isAlpha(c) || isDigit(c) || TOKEN_EXTRA.has(c);
/** a-z 0-9 _ - . * */
const isKeyChar = (c) => isLcAlpha(c) || isDigit(c) || c === 95 || c === 45 || c === 46 || c === 42;

/**
 * A structured field List (RFC 9651 §4.2.1): `[{ value, params }]`, where a value is a
 * string, a token ({ token }), a number, a boolean, a byte sequence ({ bytes }) or an inner
 * list (an array of items), and params an object. Null when the text is not a valid List: the
 * RFC fails the whole field then.
 */
export function parseList(text) {
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

/**
 * The IETF fields (draft-ietf-httpapi-ratelimit-headers, drafts 09 to 12):
 * `RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400` and
 * `RateLimit: "burst";r=50;t=30`. Each `RateLimit` member whose item names a policy (a String;
 * a Token is read as the same name) and carries a whole `r` is one limit; `t` (seconds to the
 * reset) and the policy's `q` (quota), `w` (window, seconds) and `qu` (quota unit, default
 * "requests") are added when present and valid. A policy that `RateLimit` does not mention is
 * returned with `remaining: null`. Members with another partition key (`pk`) are separate
 * limits. A field that is not a valid structured field List is ignored whole, as RFC 9651
 * says; a member whose required parameter is missing or not a whole number is ignored alone.
 */
export function parseIetf(policyText, limitText) {
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

// === Durations and times ===

const GO_UNITS = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
const GO_DURATION = /^(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h)/;

/**
 * A Go duration (OpenAI's resets: `6m0s`, `1s`, `12ms`, `1h2m3.5s`, `0s`) in milliseconds, or
 * null when it is not one. A bare number is seconds.
 */
export function parseDuration(text) {
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

/** An RFC 3339 time (Anthropic's resets: `2026-12-06T17:01:02Z`) in ms since 1970, or null. */
export function parseRfc3339(text) {
  if (text === null || text === undefined) return null;
  const s = String(text).trim();
  if (!/^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/.test(s)) return null;
  const ms = Date.parse(s.replace(' ', 'T'));
  return Number.isNaN(ms) ? null : ms;
}

// The last date read, and its value: successive answers mostly carry the same second.
let lastDate = { text: null, ms: null };

/** An HTTP date (RFC 9110 §5.6.7: IMF-fixdate, and the obsolete forms Date.parse reads), or null. */
export function parseHttpDate(text) {
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

/**
 * `Retry-After` (RFC 9110 §10.2.3) in milliseconds from now: delay-seconds (a fraction is
 * accepted), or an HTTP date, measured against the response's own `Date` when it has one (both
 * are the server's clock, so no skew enters) else against `nowMs`. Never below 0; null when the
 * value is neither.
 */
export function parseRetryAfter(text, nowMs, dateMs = null) {
  if (text === null || text === undefined) return null;
  const s = String(text).trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const at = parseHttpDate(s);
  if (at === null) return null;
  return Math.max(0, at - (dateMs ?? nowMs));
}

/** From 10^9 up a reset is a Unix time in seconds (September 2001): no delay of 31 years is meant. */
export const UNIX_TIME_FROM = 1e9;

/**
 * The server clock minus the local one, in ms, measured from a response's `Date` field: a
 * lower bound, since `Date` is whole seconds rounded down and was written before the response
 * travelled. The best estimate is the largest sample; `previous` (the estimate so far) is kept
 * unless this sample is larger, or more than 2 s smaller (a clock that was stepped back).
 */
export function measureSkew(dateText, nowMs, previous = null) {
  const date = parseHttpDate(dateText);
  if (date === null) return previous;
  const sample = date - nowMs;
  if (previous === null || sample > previous || sample < previous - 2000) return sample;
  return previous;
}

// === The providers ===

const num = (text) => {
  if (text === null) return null;
  const t = text.trim();
  return /^\d+$/.test(t) ? Number(t) : null;
};

/**
 * OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations
 * (time until the limit is full again). One limit per kind that has a `remaining`.
 */
export function parseOpenAI(get) {
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

/**
 * Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
 * resets as RFC 3339 times, measured against the local clock corrected by `skewMs` (server
 * minus local, see measureSkew): the server's clock on both sides, to better than the whole
 * second of one `Date` field.
 */
export function parseAnthropic(get, nowMs, skewMs = 0) {
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

/**
 * GitHub (and others' plain `x-ratelimit-*`): `x-ratelimit-{limit,remaining,reset,used}`, one
 * limit named by `x-ratelimit-resource` (else "default"). A reset from 10^9 up is Unix seconds,
 * turned into a wait with the local clock corrected by `skewMs` (server minus local); below, it
 * is seconds from now.
 */
export function parseGitHub(get, nowMs, skewMs = 0) {
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

/**
 * Everything a response says about its limits: `{ family, limits, retryAfterMs, skewMs }`.
 * `family` is 'ietf', 'openai', 'anthropic' or 'github' (the first whose fields are there, in
 * that order), or null; each limit is `{ id, unit, limit, windowMs, remaining, resetMs, refill }`
 * (times in ms from now; unknown values null; `refill` 'continuous' where the provider documents
 * a limit refilled evenly until the reset, OpenAI and Anthropic, else 'window': nothing comes
 * back before the reset, the safe reading of the IETF fields, which do not say). `skewMs` is the clock estimate after this
 * response's `Date` (see measureSkew), which GitHub's Unix resets are corrected by.
 *
 * `options.now` is the local wall clock in ms (default Date.now()), `options.skewMs` the
 * estimate so far.
 */
export function readRateLimits(responseOrHeaders, options = {}) {
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
