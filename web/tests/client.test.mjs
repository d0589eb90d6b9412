// client.js in node: Retry-After parsing, backoff, and politeFetch against a local server.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { backoffDelay, parseRetryAfter, politeFetch } from '../client.js';

let server;
let base;
const scripts = new Map(); // path -> list of [status, headers, body] answered in turn
const seen = new Map(); // path -> [{ t, body }]

before(async () => {
  server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const list = seen.get(req.url) || [];
      list.push({ t: performance.now(), body: Buffer.concat(chunks).toString(), priority: req.headers['x-sluice-priority'] });
      seen.set(req.url, list);
      const script = scripts.get(req.url) || [];
      const [status, headers, body] = script[Math.min(list.length - 1, script.length - 1)] || [200, {}, 'ok'];
      res.writeHead(status, headers);
      res.end(body);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => new Promise((r) => server.close(r)));

const sluice429 = (ms) => [429, { 'content-type': 'application/problem+json', 'retry-after': String(Math.ceil(ms / 1000)) }, JSON.stringify({ reason: 'timeout', retry_after_ms: ms })];
const noJitter = { random: () => 0 };

test('Retry-After: delta-seconds, HTTP-date, past dates, garbage', () => {
  const now = Date.parse('Wed, 21 Oct 2026 07:28:00 GMT');
  assert.equal(parseRetryAfter('3', now), 3000);
  assert.equal(parseRetryAfter(' 0 ', now), 0);
  assert.equal(parseRetryAfter('Wed, 21 Oct 2026 07:28:05 GMT', now), 5000);
  assert.equal(parseRetryAfter('Wed, 21 Oct 2026 07:27:00 GMT', now), 0);
  assert.equal(parseRetryAfter('soon', now), null);
  assert.equal(parseRetryAfter('-1', now), null);
  assert.equal(parseRetryAfter(null, now), null);
});

test('backoff: full jitter under an exponential ceiling, never before Retry-After', () => {
  assert.equal(backoffDelay(1, { random: () => 0.999999 }) < 100, true);
  assert.equal(Math.round(backoffDelay(4, { random: () => 0.5 })), 400);
  assert.equal(backoffDelay(30, { random: () => 1, maxDelayMs: 2000 }), 2000);
  assert.equal(backoffDelay(2, { random: () => 0, retryAfterMs: 3000 }), 3000);
  assert.equal(backoffDelay(2, { random: () => 1, retryAfterMs: 3000, baseDelayMs: 100 }), 3200);
});

test('429 then 200: waits what the server said, re-sends the body', async () => {
  scripts.set('/a', [sluice429(150), [503, { 'retry-after': '1' }, ''], [200, {}, 'done']]);
  const t0 = performance.now();
  const retries = [];
  const res = await politeFetch(`${base}/a`, { method: 'PUT', body: 'payload' }, { ...noJitter, onRetry: (r) => retries.push(r.delayMs) });
  assert.equal(res.status, 200);
  assert.equal(await res.text(), 'done');
  const hits = seen.get('/a');
  assert.equal(hits.length, 3);
  assert.deepEqual(hits.map((h) => h.body), ['payload', 'payload', 'payload']);
  assert.deepEqual(retries, [150, 1000]);
  assert.ok(hits[1].t - hits[0].t >= 145, `${hits[1].t - hits[0].t}`);
  assert.ok(hits[2].t - hits[1].t >= 995, `${hits[2].t - hits[1].t}`);
  assert.ok(performance.now() - t0 < 3000);
});

test('HTTP-date Retry-After is honoured', async () => {
  const when = new Date(Date.now() + 2000).toUTCString(); // second precision: 1-2 s from now
  scripts.set('/date', [[429, { 'retry-after': when }, ''], [200, {}, 'ok']]);
  const res = await politeFetch(`${base}/date`, {}, noJitter);
  assert.equal(res.status, 200);
  const [a, b] = seen.get('/date');
  assert.ok(b.t - a.t >= 900, `${b.t - a.t}`);
});

test('gives up after maxAttempts and returns the last 429 as it is', async () => {
  scripts.set('/always', [sluice429(10)]);
  const res = await politeFetch(`${base}/always`, {}, { ...noJitter, maxAttempts: 3 });
  assert.equal(res.status, 429);
  assert.equal(res.headers.get('retry-after'), '1');
  assert.equal((await res.json()).reason, 'timeout');
  assert.equal(seen.get('/always').length, 3);
});

test('a wait beyond maxTotalDelayMs is not taken', async () => {
  scripts.set('/long', [sluice429(60000)]);
  const t0 = performance.now();
  const res = await politeFetch(`${base}/long`, {}, { maxTotalDelayMs: 5000 });
  assert.equal(res.status, 429);
  assert.equal(seen.get('/long').length, 1);
  assert.ok(performance.now() - t0 < 1000);
});

test('backoff without Retry-After, and other statuses are not retried', async () => {
  scripts.set('/bare', [[503, {}, ''], [503, {}, ''], [200, {}, 'ok']]);
  const res = await politeFetch(`${base}/bare`, {}, { random: () => 1, baseDelayMs: 20 });
  assert.equal(res.status, 200);
  const [a, b, c] = seen.get('/bare').map((h) => h.t);
  assert.ok(b - a >= 18 && c - b >= 38, `${b - a} ${c - b}`);
  scripts.set('/500', [[500, {}, '']]);
  assert.equal((await politeFetch(`${base}/500`, {}, noJitter)).status, 500);
  assert.equal(seen.get('/500').length, 1);
});

test('abort while waiting rejects at once and sends nothing more', async () => {
  scripts.set('/abort', [sluice429(5000)]);
  const ac = new AbortController();
  const t0 = performance.now();
  setTimeout(() => ac.abort(), 200);
  await assert.rejects(politeFetch(`${base}/abort`, { signal: ac.signal }, noJitter), (e) => e.name === 'AbortError');
  assert.ok(performance.now() - t0 < 1000);
  assert.equal(seen.get('/abort').length, 1);
  const pre = new AbortController();
  pre.abort();
  await assert.rejects(politeFetch(`${base}/abort`, {}, { signal: pre.signal }), (e) => e.name === 'AbortError');
  assert.equal(seen.get('/abort').length, 1);
});

test('503 is not retried for POST and PATCH unless retryNonIdempotent; 429 is, for every method', async () => {
  for (const method of ['POST', 'PATCH']) {
    const path = `/post503-${method}`;
    scripts.set(path, [[503, { 'retry-after': '0' }, 'busy'], [200, {}, 'ok']]);
    const res = await politeFetch(`${base}${path}`, { method, body: 'once' }, noJitter);
    assert.equal(res.status, 503, method);
    assert.equal(await res.text(), 'busy');
    assert.equal(seen.get(path).length, 1, `${method} was sent again after a 503`);
  }
  scripts.set('/post503-opt', [[503, { 'retry-after': '0' }, ''], [200, {}, 'ok']]);
  const opted = await politeFetch(`${base}/post503-opt`, { method: 'POST', body: 'twice' }, { ...noJitter, retryNonIdempotent: true });
  assert.equal(opted.status, 200);
  assert.deepEqual(seen.get('/post503-opt').map((h) => h.body), ['twice', 'twice']);
  for (const method of ['PUT', 'DELETE', 'GET']) {
    const path = `/idem503-${method}`;
    scripts.set(path, [[503, { 'retry-after': '0' }, ''], [200, {}, 'ok']]);
    assert.equal((await politeFetch(`${base}${path}`, { method }, noJitter)).status, 200, method);
    assert.equal(seen.get(path).length, 2, method);
  }
  // A sluice 429 means the request was not processed: POST is retried.
  scripts.set('/post429', [sluice429(20), [200, {}, 'ok']]);
  const res = await politeFetch(`${base}/post429`, { method: 'POST', body: 'p' }, noJitter);
  assert.equal(res.status, 200);
  assert.deepEqual(seen.get('/post429').map((h) => h.body), ['p', 'p']);
});

test('X-Sluice-Priority only when asked for', async () => {
  scripts.set('/prio', [[200, {}, 'ok']]);
  await politeFetch(`${base}/prio`, {}, noJitter);
  await politeFetch(`${base}/prio`, { method: 'POST', body: 'x' }, { ...noJitter, priority: 'high' });
  await politeFetch(`${base}/prio`, { headers: { 'x-other': '1' } }, { ...noJitter, priority: 'low' });
  assert.deepEqual(seen.get('/prio').map((h) => h.priority), [undefined, 'high', 'low']);
  assert.deepEqual(seen.get('/prio').map((h) => h.body), ['', 'x', '']);
  await assert.rejects(politeFetch(`${base}/prio`, {}, { priority: 'urgent' }), /priority must be one of high, normal, low/);
});
