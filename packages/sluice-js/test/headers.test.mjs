// Every rule of the limit-field parsers (src/headers.js), and what a response costs to read.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  readRateLimits, parseIetf, parseList, parseDuration, parseRetryAfter, measureSkew, rateLimitHints,
} from '../src/index.js';
import { readUsage } from '../src/pacing.js';

const NOW = Date.UTC(2026, 11, 6, 17, 0, 0); // 2026-12-06T17:00:00Z
const read = (headers, options = {}) => readRateLimits(new Headers(headers), { now: NOW, ...options });

test('structured field lists: strings, tokens, numbers, booleans, bytes, inner lists, parameters', () => {
  assert.deepEqual(parseList('"default";q=100;w=60'), [{ value: 'default', params: { q: 100, w: 60 } }]);
  assert.deepEqual(parseList('"a,b;c";r=1, tok;t=2.5;f=?0;k=:AQI=:'), [
    { value: 'a,b;c', params: { r: 1 } },
    { value: { token: 'tok' }, params: { t: 2.5, f: false, k: { bytes: 'AQI=' } } },
  ]);
  assert.deepEqual(parseList('"esc\\"aped\\\\"'), [{ value: 'esc"aped\\', params: {} }]);
  assert.deepEqual(parseList('(1 2);x, 3'), [{ value: [{ value: 1, params: {} }, { value: 2, params: {} }], params: { x: true } }, { value: 3, params: {} }]);
  assert.deepEqual(parseList(''), []);
  assert.deepEqual(parseList('  "a"  ,\t"b"'), [{ value: 'a', params: {} }, { value: 'b', params: {} }]);
  // Invalid: the whole field fails.
  for (const bad of ['"unterminated', '"a",', '"a" "b"', '"a";Q=1', '1234567890123456', '"a";q=', '"bad\\x"', '?2', ':!!:', '"a";q=1.2345']) {
    assert.equal(parseList(bad), null, bad);
  }
});

test('IETF fields: policies joined by name, several policies, units, partition keys', () => {
  assert.deepEqual(parseIetf('"default";q=100;w=60', '"default";r=50;t=30'), [
    { id: 'default', unit: 'requests', limit: 100, windowMs: 60000, remaining: 50, resetMs: 30000, refill: 'window' },
  ]);
  const two = parseIetf('"burst";q=10;w=1, "daily";q=1000;w=86400;qu="requests"', '"burst";r=3;t=1, "daily";r=400;t=36000');
  assert.deepEqual(two.map((l) => [l.id, l.limit, l.windowMs, l.remaining, l.resetMs]), [
    ['burst', 10, 1000, 3, 1000], ['daily', 1000, 86400000, 400, 36000000],
  ]);
  // A unit other than requests; a policy without RateLimit; RateLimit without a policy.
  assert.deepEqual(parseIetf('"bytes";q=1000;qu="content-bytes", "idle";q=5', null).map((l) => [l.id, l.unit, l.remaining]), [
    ['bytes', 'content-bytes', null], ['idle', 'requests', null],
  ]);
  assert.deepEqual(parseIetf(null, '"x";r=2'), [{ id: 'x', unit: 'requests', limit: null, windowMs: null, remaining: 2, resetMs: null, refill: 'window' }]);
  // Partition keys keep members apart.
  assert.equal(parseIetf('"p";q=5;pk=:AQ==:, "p";q=9;pk=:Ag==:', '"p";r=1;pk=:Ag==:').find((l) => l.limit === 9).remaining, 1);
  // A member without its required parameter, or with a negative or fractional one, is skipped alone.
  assert.deepEqual(parseIetf('"a";w=5, "b";q=-1, "c";q=2.5, "d";q=4', '"d";r=1.5, "d2";t=3').map((l) => [l.id, l.remaining]), [['d', null]]);
  // A field that is not a List is ignored whole; the other field still counts.
  assert.deepEqual(parseIetf('"default";q=100;w=60', 'limit=100, remaining=50, reset=5').map((l) => l.remaining), [null]);
  // A token names the policy as a string would.
  assert.equal(parseIetf('api;q=3', 'api;r=1')[0].remaining, 1);
});

test('IETF via readRateLimits: family, t absent, Retry-After beside it', () => {
  const r = read({ 'RateLimit-Policy': '"default";q=100;w=60', RateLimit: '"default";r=0', 'Retry-After': '7' });
  assert.equal(r.family, 'ietf');
  assert.equal(r.limits[0].resetMs, null);
  assert.equal(r.retryAfterMs, 7000);
});

test('Go durations (OpenAI resets)', () => {
  const cases = { '6m0s': 360000, '1s': 1000, '12ms': 12, '1.5s': 1500, '1h2m3.5s': 3723500, '0s': 0, '500us': 0.5, '250µs': 0.25, '7': 7000, '.5s': 500, '2m': 120000 };
  for (const [text, ms] of Object.entries(cases)) assert.equal(parseDuration(text), ms, text);
  for (const bad of ['', 's', '1x', '-1s', '1s2', 'abc', null]) assert.equal(parseDuration(bad), null, String(bad));
});

test('OpenAI: requests and tokens, each with its limit, remaining and reset', () => {
  const r = read({
    'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '59', 'x-ratelimit-reset-requests': '1s',
    'x-ratelimit-limit-tokens': '150000', 'x-ratelimit-remaining-tokens': '149984', 'x-ratelimit-reset-tokens': '6m0s',
  });
  assert.equal(r.family, 'openai');
  assert.deepEqual(r.limits, [
    { id: 'requests', unit: 'requests', limit: 60, windowMs: null, remaining: 59, resetMs: 1000, refill: 'continuous' },
    { id: 'tokens', unit: 'tokens', limit: 150000, windowMs: null, remaining: 149984, resetMs: 360000, refill: 'continuous' },
  ]);
  // Tokens only; a reset that is not a duration is unknown, not zero.
  const t = read({ 'x-ratelimit-remaining-tokens': '10', 'x-ratelimit-reset-tokens': 'soon' });
  assert.deepEqual(t.limits.map((l) => [l.id, l.limit, l.resetMs]), [['tokens', null, null]]);
  assert.equal(read({ 'x-ratelimit-remaining-requests': '-1' }).limits.length, 0);
});

test('Anthropic: four kinds, RFC 3339 resets against the local clock corrected by the Date field\'s skew', () => {
  const headers = {
    date: new Date(NOW).toUTCString(),
    'anthropic-ratelimit-requests-limit': '50', 'anthropic-ratelimit-requests-remaining': '49',
    'anthropic-ratelimit-requests-reset': '2026-12-06T17:00:01Z',
    'anthropic-ratelimit-tokens-limit': '20000', 'anthropic-ratelimit-tokens-remaining': '19000',
    'anthropic-ratelimit-tokens-reset': '2026-12-06T17:00:03.500Z',
    'anthropic-ratelimit-input-tokens-limit': '10000', 'anthropic-ratelimit-input-tokens-remaining': '9000',
    'anthropic-ratelimit-input-tokens-reset': '2026-12-06T18:00:00+01:00',
    'anthropic-ratelimit-output-tokens-limit': '4000', 'anthropic-ratelimit-output-tokens-remaining': '3990',
    'anthropic-ratelimit-output-tokens-reset': '2026-12-06 17:00:10Z',
  };
  // The local clock runs 5 s behind the server: the Date field's skew corrects it.
  const r = read(headers, { now: NOW - 5000 });
  assert.equal(r.family, 'anthropic');
  assert.deepEqual(r.limits.map((l) => [l.id, l.limit, l.remaining, l.resetMs]), [
    ['requests', 50, 49, 1000], ['tokens', 20000, 19000, 3500], ['input-tokens', 10000, 9000, 0], ['output-tokens', 4000, 3990, 10000],
  ]);
  assert.equal(r.skewMs, 5000);
  delete headers.date;
  const noDate = read(headers, { now: NOW - 5000, skewMs: 5000 });
  assert.equal(noDate.limits[0].resetMs, 1000);
  assert.equal(read({ ...headers, 'anthropic-ratelimit-requests-reset': 'tomorrow' }).limits[0].resetMs, null);
});

test('GitHub: Unix resets corrected by the clock skew the Date field shows, the resource names the limit', () => {
  const serverNow = NOW + 37000; // the server's clock is 37 s ahead
  const headers = {
    date: new Date(serverNow).toUTCString(),
    'x-ratelimit-limit': '5000', 'x-ratelimit-remaining': '4999', 'x-ratelimit-used': '1',
    'x-ratelimit-reset': String(serverNow / 1000 + 600), 'x-ratelimit-resource': 'core',
  };
  const r = read(headers);
  assert.equal(r.family, 'github');
  assert.equal(r.skewMs, 37000);
  assert.deepEqual(r.limits, [{ id: 'core', unit: 'requests', limit: 5000, windowMs: null, remaining: 4999, resetMs: 600000, refill: 'window' }]);
  // Without Date: the estimate given; without it, the local clock (the reset looks 37 s later).
  delete headers.date;
  assert.equal(read(headers, { skewMs: 37000 }).limits[0].resetMs, 600000);
  assert.equal(read(headers).limits[0].resetMs, 637000);
  // No resource: 'default'; no limit: used + remaining; a small reset is seconds from now.
  const plain = read({ 'x-ratelimit-remaining': '3', 'x-ratelimit-used': '7', 'x-ratelimit-reset': '20' });
  assert.deepEqual(plain.limits, [{ id: 'default', unit: 'requests', limit: 10, windowMs: null, remaining: 3, resetMs: 20000, refill: 'window' }]);
  // A reset already past is 0, not negative.
  assert.equal(read({ 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': String(NOW / 1000 - 10) }).limits[0].resetMs, 0);
});

test('clock skew: the largest sample wins, a clock stepped back by over 2 s restarts the estimate', () => {
  const date = (ms) => new Date(ms).toUTCString();
  assert.equal(measureSkew(date(NOW + 10000), NOW), 10000);
  // A later sample that lost the sub-second part (Date is whole seconds) does not lower it.
  assert.equal(measureSkew(date(NOW + 9000), NOW, 10000), 10000);
  assert.equal(measureSkew(date(NOW + 10400), NOW - 300, 10000), 10300);
  assert.equal(measureSkew(date(NOW - 5000), NOW, 10000), -5000);
  assert.equal(measureSkew('not a date', NOW, 42), 42);
  assert.equal(measureSkew(null, NOW), null);
});

test('Retry-After: seconds or an HTTP date, the date against the response Date when there is one', () => {
  assert.equal(parseRetryAfter('120', NOW), 120000);
  assert.equal(parseRetryAfter(' 1.5 ', NOW), 1500);
  assert.equal(parseRetryAfter(new Date(NOW + 30000).toUTCString(), NOW), 30000);
  assert.equal(parseRetryAfter(new Date(NOW - 30000).toUTCString(), NOW), 0);
  // Server Date 17:00:00 and Retry-After 17:00:20: 20 s, whatever the local clock says.
  assert.equal(parseRetryAfter(new Date(NOW + 20000).toUTCString(), NOW + 99000, NOW), 20000);
  assert.equal(parseRetryAfter('Sunday, 06-Dec-26 17:00:05 GMT', NOW), 5000);
  for (const bad of ['-1', 'soon', '', '1e3']) assert.equal(parseRetryAfter(bad, NOW), null, bad);
  assert.equal(read({ 'retry-after': '3' }).retryAfterMs, 3000);
});

test('families: the first present in order ietf, openai, anthropic, github; none gives no limit', () => {
  assert.equal(read({ ratelimit: '"a";r=1', 'x-ratelimit-remaining': '5' }).family, 'ietf');
  assert.equal(read({ 'x-ratelimit-remaining-requests': '1', 'x-ratelimit-remaining': '5' }).family, 'openai');
  assert.deepEqual(read({ 'content-type': 'text/plain' }), { family: null, limits: [], retryAfterMs: null, skewMs: null });
  // A plain object of headers, any case, and a Response.
  assert.equal(readRateLimits({ 'X-RateLimit-Remaining': '4' }, { now: NOW }).limits[0].remaining, 4);
  assert.equal(readRateLimits(new Response(null, { headers: { ratelimit: '"a";r=2' } })).limits[0].remaining, 2);
});

test('rateLimitHints keeps reading the older forms beside the new parser', () => {
  const h = rateLimitHints({ RateLimit: 'limit=100, remaining=50, reset=5' }, NOW);
  assert.deepEqual([h.limit, h.remaining, h.resetMs], [100, 50, 5000]);
});

test('readUsage: OpenAI and Anthropic usage objects, nothing from anything else', () => {
  assert.deepEqual(readUsage({ usage: { prompt_tokens: 100, completion_tokens: 20, total_tokens: 120 } }), { tokens: 120 });
  assert.deepEqual(readUsage({ usage: { prompt_tokens: 100, completion_tokens: 20 } }), { tokens: 120 });
  assert.deepEqual(readUsage({ usage: { input_tokens: 50, cache_read_input_tokens: 10, output_tokens: 7 } }), { tokens: 67, 'input-tokens': 60, 'output-tokens': 7 });
  for (const body of [null, 'x', {}, { usage: null }, { usage: { total_tokens: -1 } }, { usage: { total_tokens: 1.5 } }, { usage: { note: 'none' } }]) {
    assert.equal(readUsage(body), null, JSON.stringify(body));
  }
});

test('per-response cost of reading the fields: a few microseconds', () => {
  const responses = {
    ietf: new Headers({ 'content-type': 'application/json', 'RateLimit-Policy': '"burst";q=100;w=60, "daily";q=10000;w=86400', RateLimit: '"burst";r=50;t=30, "daily";r=9000;t=40000' }),
    openai: new Headers({
      'content-type': 'application/json',
      'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '59', 'x-ratelimit-reset-requests': '1s',
      'x-ratelimit-limit-tokens': '150000', 'x-ratelimit-remaining-tokens': '149984', 'x-ratelimit-reset-tokens': '6m0s',
    }),
    github: new Headers({
      date: new Date(NOW).toUTCString(), 'x-ratelimit-limit': '5000', 'x-ratelimit-remaining': '4999',
      'x-ratelimit-used': '1', 'x-ratelimit-reset': String(NOW / 1000 + 600), 'x-ratelimit-resource': 'core',
    }),
  };
  const results = {};
  for (const [name, headers] of Object.entries(responses)) {
    for (let i = 0; i < 20000; i++) readRateLimits(headers, { now: NOW });
    const rounds = [];
    for (let round = 0; round < 5; round++) {
      const n = 20000;
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) readRateLimits(headers, { now: NOW });
      rounds.push(Number(process.hrtime.bigint() - t0) / n / 1000);
    }
    rounds.sort((a, b) => a - b);
    results[name] = rounds[2];
  }
  console.log(`per-response parse, median of 5 rounds of 20000 (µs): ${JSON.stringify(Object.fromEntries(Object.entries(results).map(([k, v]) => [k, Number(v.toFixed(2))])))}`);
  // A loaded 2-core machine: the bound is generous, the figure is printed.
  for (const [name, us] of Object.entries(results)) assert.ok(us < 50, `${name}: ${us} µs`);
});
