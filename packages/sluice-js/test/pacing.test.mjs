// The pacing step (src/pacing.js) and the Pacer over it, on a fake clock: every admission time
// is exact.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { admit, observe, abandon, reconcile, newState, RESET_MARGIN_MS, INFLIGHT_TTL_MS } from '../src/pacing.js';
import { pacer, paced, readRateLimits, AbortError } from '../src/index.js';
import { fakeTime } from './fake-time.mjs';

const ietf = (policy, limit, now = 0) => readRateLimits(new Headers({ 'ratelimit-policy': policy, ratelimit: limit }), { now });

/** Admits as soon as the step allows, `n` times, starting at `from`: the admission times. */
function admissions(state, n, from = 0, cost = {}) {
  const times = [];
  let now = from;
  for (let guard = 0; times.length < n && guard < 10000; guard++) {
    const r = admit(state, now, cost);
    if (r.ticket) {
      times.push(now);
      abandon(state, r.ticket);
    } else {
      assert.ok(Number.isFinite(r.waitMs) && r.waitMs > 0, `wait ${r.waitMs}`);
      now += r.waitMs;
    }
  }
  return times;
}

/**
 * A state that has heard `reading` in answer to one request at time `at`, with the spread
 * starting at `at` (the request that brought a limit counts as its first step: see the test
 * 'a new limit counts the request that brought it'; here each test starts its own spread).
 */
function heard(reading, at = 0, status = 200) {
  const state = newState();
  const first = admit(state, at);
  observe(state, at, reading, status, first.ticket);
  for (const l of Object.values(state.limits)) l.next = at;
  return state;
}

test('a new limit counts the request that brought it as its first step', () => {
  const state = newState();
  const first = admit(state, 0);
  observe(state, 10, ietf('"p";q=5;w=2', '"p";r=4;t=2'), 200, first.ticket);
  // 4 left over the 2 s to the reset, after the one that brought the figure: the next one
  // 2000 / 5 = 400 ms after the answer, not at once; then every 400 ms.
  assert.equal(admit(state, 10).waitMs, 400);
  assert.deepEqual(admissions(state, 4, 410).map((t) => Math.round(t)), [410, 810, 1210, 1610]);
});

test('what remains is spread evenly until the reset, not spent at once', () => {
  // 10 left, reset in 10 s: one a second, the last one second before the reset.
  const state = heard(ietf('"default";q=10;w=10', '"default";r=10;t=10'));
  const times = admissions(state, 10);
  assert.deepEqual(times.map((t) => Math.round(t)), [0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000]);
  // Then the quota is spent until the end of the effective window (plus the margin).
  assert.equal(admit(state, 9500).waitMs, 10000 + RESET_MARGIN_MS - 9500);
  // Past it, draft 12 says nothing of the quota (not even the policy's q): one request goes to
  // learn it, the others wait for its answer, which is spread again.
  const probe = admit(state, 10000 + RESET_MARGIN_MS);
  assert.ok(probe.ticket);
  assert.equal(admit(state, 10030).waitMs, Infinity);
  observe(state, 10040, ietf('"default";q=10;w=10', '"default";r=9;t=10'), 200, probe.ticket);
  const next = admissions(state, 3, 10040);
  assert.deepEqual(next.map((t) => Math.round(t)), [11040, 12040, 13040]);
});

test('a late timer is caught up by one step, never more', () => {
  const state = heard(ietf('"p";q=100;w=100', '"p";r=100;t=100'));
  assert.ok(admit(state, 0).ticket);
  // Due at 1000; the try comes at 1400: admitted, and the next is due about 1 s after the
  // due time (2000 less a little, the step being 98,600 ms / 99 now), not 1 s after the try.
  assert.ok(admit(state, 1400).ticket);
  assert.equal(Math.round(admit(state, 1500).waitMs), Math.round(1000 + 98600 / 99 - 1500));
  // Idle for 10 s: no burst of ten, at most one step of credit (two at once, not a third).
  assert.ok(admit(state, 12000).ticket);
  assert.ok(admit(state, 12000).ticket);
  assert.ok(admit(state, 12000).waitMs > 0);
});

test('several limits at once: the request waits on each that applies, tokens by its declared cost', () => {
  const state = heard(ietf('"rpm";q=100;w=10, "tpm";q=10000;w=10;qu="tokens"', '"rpm";r=100;t=10, "tpm";r=3000;t=10'));
  // 3,000 tokens over 10 s: a request of 1,000 tokens takes a third of the time.
  const times = admissions(state, 3, 0, { tokens: 1000 });
  assert.deepEqual(times.map((t) => Math.round(t)), [0, 3333, 6667]);
  // A request that declares no tokens is paced by the request limit alone.
  assert.ok(admit(state, 6800).ticket);
  // Out of tokens: a token request waits for the reset (a window gives nothing back before).
  assert.equal(Math.round(admit(state, 7000, { tokens: 1000 }).waitMs), 10000 + RESET_MARGIN_MS - 7000);
  // OpenAI's limits refill evenly until full at the reset: 500 missing of 9,500 takes 1/19 of the time.
  const openai = heard(readRateLimits(new Headers({
    'x-ratelimit-limit-requests': '100', 'x-ratelimit-remaining-requests': '100', 'x-ratelimit-reset-requests': '0s',
    'x-ratelimit-limit-tokens': '10000', 'x-ratelimit-remaining-tokens': '500', 'x-ratelimit-reset-tokens': '9.5s',
  })));
  const wait = admit(openai, 0, { tokens: 1000 }).waitMs;
  assert.equal(Math.round(wait), Math.round((500 * (9500 + RESET_MARGIN_MS)) / 9500));
  assert.ok(admit(openai, wait, { tokens: 1000 }).ticket, 'and then it has them');
});

test('two policies, burst and daily: the tighter one paces', () => {
  const state = heard(ietf('"burst";q=10;w=1, "daily";q=1000;w=86400', '"burst";r=10;t=1, "daily";r=100;t=3600'));
  const times = admissions(state, 4);
  // The daily policy's 100 over an hour (one per 36 s) is the tighter one.
  assert.deepEqual(times.map((t) => Math.round(t)), [0, 36000, 72000, 108000]);
});

test('a silent server: one request at a time until the first answer, then the configured limit', () => {
  const silent = readRateLimits(new Headers({ 'content-type': 'text/plain' }));
  const free = newState();
  const a = admit(free, 0);
  assert.ok(a.ticket);
  assert.equal(admit(free, 0).waitMs, Infinity, 'a second waits for the first answer');
  observe(free, 5, silent, 200, a.ticket);
  // No headers and no configured limit: nothing paces.
  assert.equal(admissions(free, 5, 5).at(-1), 5);
  // Configured 6/min: one every 10 s from the start, and it holds once the server was silent.
  const configured = newState({ requests: { limit: 6, windowMs: 60000 } }, 0);
  const first = admit(configured, 0);
  assert.ok(first.ticket);
  observe(configured, 10, silent, 200, first.ticket);
  assert.deepEqual(admissions(configured, 3, 10).map((t) => Math.round(t)), [10000, 20000, 30000]);
  // Once the server speaks, its limit replaces the configured one.
  const spoken = admit(configured, 40000);
  observe(configured, 40000, ietf('"x";q=1000;w=1', '"x";r=1000;t=1'), 200, spoken.ticket);
  assert.ok(admissions(configured, 5, 40000).at(-1) < 40010);
});

test('a 429 always wins: Retry-After, else the spent limit\'s reset, else a doubling backoff', () => {
  // The server says 50 remain but answers 429 with Retry-After: 30.
  const lying = readRateLimits(new Headers({ ratelimit: '"p";r=50;t=60', 'retry-after': '30' }));
  const state = heard(lying, 0, 429);
  assert.equal(admit(state, 0).waitMs, 30000);
  assert.ok(admit(state, 30000).ticket);
  // 429 with r=0 and no Retry-After: until the reset.
  const spent = heard(readRateLimits(new Headers({ ratelimit: '"p";r=0;t=8' })), 0, 429);
  assert.equal(admit(spent, 0).waitMs, 8000 + RESET_MARGIN_MS);
  // 429 with nothing: 1 s, 2 s, 4 s; a success ends the backoff.
  const bare = newState();
  const nothing = readRateLimits(new Headers({}));
  const waits = [];
  let now = 0;
  for (let i = 0; i < 3; i++) {
    const t = admit(bare, now);
    assert.ok(t.ticket, `try ${i} at ${now}`);
    observe(bare, now, nothing, 429, t.ticket);
    waits.push(admit(bare, now).waitMs);
    now += waits.at(-1);
  }
  assert.deepEqual(waits, [1000, 2000, 4000]);
  observe(bare, now, nothing, 200, admit(bare, now).ticket);
  observe(bare, now, nothing, 429, admit(bare, now).ticket);
  assert.equal(admit(bare, now).waitMs, 1000);
});

test('a remaining that rises without a reset is taken as given; an older answer does not undo a newer one', () => {
  const state = heard(ietf('"p";q=10;w=10', '"p";r=2;t=10'));
  // The server raised the quota: 9 remain, same reset. Believed, and the step shortens at once.
  const t1 = admit(state, 0);
  observe(state, 10, ietf('"p";q=100;w=10', '"p";r=90;t=10'), 200, t1.ticket);
  // Before, the next was due at 5 s (2 left over 10 s); now three go within 400 ms.
  assert.ok(admissions(state, 3, 10).at(-1) < 400);
  // Two requests in flight; the later one's answer (r=5) comes first, then the earlier one's (r=6).
  const s2 = heard(ietf('"p";q=10;w=100', '"p";r=10;t=100'));
  const early = admit(s2, 0);
  const late = admit(s2, 10000);
  observe(s2, 10100, ietf('"p";q=10;w=100', '"p";r=5;t=90'), 200, late.ticket);
  observe(s2, 10200, ietf('"p";q=10;w=100', '"p";r=6;t=90'), 200, early.ticket);
  // 5 less the earlier request, still out then (the server may not have counted it); the
  // earlier request's own answer, older, does not raise it back to 6.
  assert.equal(s2.limits['ietf:p'].remaining, 4);
});

test('in flight counts: an answer\'s remaining is less the requests still out; abandoned ones give theirs back', () => {
  const state = heard(ietf('"p";q=100;w=100', '"p";r=100;t=1'));
  const tickets = [admit(state, 0), admit(state, 100), admit(state, 200)].map((r) => r.ticket);
  assert.ok(tickets.every(Boolean));
  observe(state, 205, ietf('"p";q=100;w=100', '"p";r=97;t=1'), 200, tickets[0]);
  assert.equal(state.limits['ietf:p'].remaining, 95, '97 less the 2 still in flight');
  abandon(state, tickets[1]);
  abandon(state, tickets[2]);
  assert.equal(state.limits['ietf:p'].inflight, 0);
  assert.equal(state.inflight, 0);
});

test('a declared cost is reconciled from usage unless the server counted it since', () => {
  const reading = (remaining) => readRateLimits(new Headers({
    'x-ratelimit-remaining-requests': '100', 'x-ratelimit-reset-requests': '1s',
    'x-ratelimit-limit-tokens': '10000', 'x-ratelimit-remaining-tokens': String(remaining), 'x-ratelimit-reset-tokens': '10s',
  }));
  const state = heard(reading(10000));
  const t = admit(state, 0, { tokens: 2000 }).ticket;
  assert.equal(state.limits['openai:tokens'].remaining, 8000);
  // Answered by a response without token fields: 300 used of the 2,000 declared, 1,700 back.
  observe(state, 10, readRateLimits(new Headers({})), 200, t);
  reconcile(state, t, { tokens: 300 });
  assert.equal(state.limits['openai:tokens'].remaining, 9700);
  // Answered with the server's figure: that figure stands.
  const u = admit(state, 20000, { tokens: 2000 }).ticket;
  observe(state, 20010, reading(9200), 200, u);
  reconcile(state, u, { tokens: 800 });
  assert.equal(state.limits['openai:tokens'].remaining, 9200);
});

test('a configured limit of a unit the server does not announce keeps holding, and is reconciled', () => {
  const state = newState({ tokens: { limit: 1000, windowMs: 10000 } }, 0);
  const first = admit(state, 0, { tokens: 300 });
  // The server names its request limit only: the configured token limit still applies.
  observe(state, 5, readRateLimits(new Headers({ 'x-ratelimit-remaining-requests': '99', 'x-ratelimit-limit-requests': '100', 'x-ratelimit-reset-requests': '1s' })), 200, first.ticket);
  assert.equal(state.limits['configured:tokens'].remaining, 700);
  reconcile(state, first.ticket, { tokens: 100 });
  assert.equal(state.limits['configured:tokens'].remaining, 900);
  // 900 left: three more of 300 in this window, a fourth waits for its reset.
  const t = admissions(state, 4, 10, { tokens: 300 });
  assert.ok(t[2] < 10000 && t[3] >= 10000 + RESET_MARGIN_MS, t.join(', '));
  // A request limit the server announced replaces a configured request limit.
  const both = newState({ requests: { limit: 1, windowMs: 60000 } }, 0);
  observe(both, 1, readRateLimits(new Headers({ 'x-ratelimit-remaining-requests': '99', 'x-ratelimit-limit-requests': '100', 'x-ratelimit-reset-requests': '1s' })), 200, admit(both, 0).ticket);
  assert.ok(admissions(both, 3, 10).at(-1) < 100);
});

test('Pacer: acquire waits what the step says on injected timers; an abort spends nothing', async () => {
  const time = fakeTime();
  const p = pacer({ now: () => time.ms, timers: time.timers, wallNow: () => 0 });
  const first = await p.acquire();
  await first.observe(new Response(null, { headers: { 'ratelimit-policy': '"p";q=2;w=2', ratelimit: '"p";r=2;t=2' } }));
  // 2 left over 2 s after the first request: the next two at 2000/3 and 4000/3 ms.
  const started = [];
  const done = [0, 1].map((i) => p.acquire().then((t) => { started.push([i, time.ms]); return t; }));
  await time.advance(666);
  assert.deepEqual(started, []);
  await time.advance(1);
  assert.deepEqual(started, [[0, 667]]);
  await time.advance(665);
  assert.deepEqual(started, [[0, 667]]);
  await time.advance(2);
  assert.deepEqual(started, [[0, 667], [1, 1334]]);
  for (const t of await Promise.all(done)) t.abandon();
  const ac = new AbortController();
  const waiting = p.acquire({ signal: ac.signal });
  await time.advance(10);
  ac.abort();
  await assert.rejects(waiting, (e) => e instanceof AbortError);
  const s = await p.state();
  assert.equal(s.limits['ietf:p'].inflight, 0);
  assert.equal(s.limits['ietf:p'].remaining, 0);
});

test('paced(fetch): GitHub resets against a skewed server clock; cost stays out of fetch; the body is the caller\'s', async () => {
  const time = fakeTime();
  const local = Date.UTC(2026, 11, 6, 17, 0, 0);
  const server = local + 120000; // two minutes ahead
  const calls = [];
  const fakeFetch = async (url, init) => {
    calls.push([url, init?.headers ?? null]);
    return new Response(JSON.stringify({ usage: { total_tokens: 40 } }), {
      headers: {
        'content-type': 'application/json', date: new Date(server + time.ms).toUTCString(),
        'x-ratelimit-limit': '60', 'x-ratelimit-remaining': '30', 'x-ratelimit-reset': String(server / 1000 + 60), 'x-ratelimit-resource': 'core',
      },
    });
  };
  const f = paced(fakeFetch, { now: () => time.ms, timers: time.timers, wallNow: () => local + time.ms });
  const res = await f('https://api.example/x', { headers: { a: 'b' }, cost: { tokens: 100 } });
  assert.equal(res.status, 200);
  assert.deepEqual(calls, [['https://api.example/x', { a: 'b' }]], 'cost is not passed to fetch');
  const s = await f.pacer.state();
  assert.equal(s.skewMs, 120000);
  // Reset 60 s ahead on the server's clock: 60 s, not the 180 s the local clock would say.
  assert.equal(s.limits['github:core'].resetInMs, 60000);
  assert.equal(await res.json().then((b) => b.usage.total_tokens), 40, 'the caller\'s body is untouched');
});

test('Pacer.observe: an answer the pacer did not admit still informs it', async () => {
  const time = fakeTime();
  const p = pacer({ now: () => time.ms, timers: time.timers, wallNow: () => 0 });
  await p.observe(new Response(null, { status: 429, headers: { 'retry-after': '3', ratelimit: '"p";r=0;t=3' } }));
  const s = await p.state();
  assert.equal(s.blockedForMs, 3000);
  assert.equal(s.limits['ietf:p'].remaining, 0);
  const started = [];
  p.acquire().then(() => started.push(time.ms));
  await time.advance(2999);
  assert.deepEqual(started, []);
  await time.advance(100);
  assert.deepEqual(started, [3025], 'the Retry-After, then the reset and its margin');
});

test('a limit whose quota was never stated: after its reset, one request at a time learns it again', () => {
  const state = heard(readRateLimits(new Headers({ ratelimit: '"p";r=0;t=3' })));
  assert.equal(admit(state, 0).waitMs, 3000 + RESET_MARGIN_MS);
  const probe = admit(state, 3025);
  assert.ok(probe.ticket);
  assert.equal(admit(state, 3025).waitMs, Infinity, 'a second waits for the probe\'s answer');
  observe(state, 3030, readRateLimits(new Headers({ ratelimit: '"p";r=9;t=3' })), 200, probe.ticket);
  assert.ok(admit(state, 3400).ticket);
});

test('a ticket is given back once, and one never answered is given back after INFLIGHT_TTL_MS', () => {
  const state = heard(ietf('"p";q=100;w=1000', '"p";r=100;t=1000'));
  const a = admit(state, 0).ticket;
  abandon(state, a);
  abandon(state, a); // a retried compare-and-set runs the step again: nothing more
  assert.equal(state.limits['ietf:p'].inflight, 0);
  // A request whose process died: its count stays until INFLIGHT_TTL_MS, then goes.
  admit(state, 100000);
  assert.equal(state.limits['ietf:p'].inflight, 1);
  observe(state, 100000 + INFLIGHT_TTL_MS + 1, readRateLimits(new Headers({})), 200);
  assert.equal(state.limits['ietf:p'].inflight, 0);
  assert.equal(state.inflight, 0);
  assert.deepEqual(state.open, {});
});
