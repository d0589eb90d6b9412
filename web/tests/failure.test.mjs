// A wasm module that does not compile, does not instantiate, or traps inside offer/poll: every
// path (fast path, slow path, queued waiters, /sluice/state) follows `fail`; pages get a
// `sluice:failed` event; the gateway's metrics count it (web/README.md, "When the module fails").
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { CORRUPT_WASM, IMPORTING_WASM, setupCustom, TRAP_SHIM } from './custom-front.mjs';
import { sleep, testConfig, wasmBytes, workerState } from './harness.mjs';

/** Opens a controlled tab that records `sluice:failed` events (window) and onFailed calls. */
async function failureTab(env) {
  const page = await env.context.newPage();
  await page.goto(env.front.url + '/');
  await page.evaluate(async () => {
    window.failedEvents = [];
    window.failedCalls = [];
    addEventListener('sluice:failed', (e) => window.failedEvents.push(e.detail));
    const { register } = await import('/sluice/client.js');
    await register({ onFailed: (d) => window.failedCalls.push(d) });
  });
  return page;
}

async function failureSeen(page) {
  const deadline = Date.now() + 5000;
  for (;;) {
    const seen = await page.evaluate(() => ({ events: window.failedEvents, calls: window.failedCalls }));
    if (seen.events.length > 0 || Date.now() > deadline) return seen;
    await sleep(50);
  }
}

/** One request from the page: status, the worker's header, and the body (JSON when it is). */
function call(page, path, init = {}) {
  return page.evaluate(
    async ([path, init]) => {
      const r = await fetch(path, { cache: 'no-store', ...init });
      const text = await r.text();
      let body = text;
      try {
        body = JSON.parse(text);
      } catch (e) {
        // not JSON
      }
      return { status: r.status, limiter: r.headers.get('x-sluice-limiter'), type: r.headers.get('content-type'), body };
    },
    [path, init],
  );
}

function assertRefused(r, what, reasonPattern) {
  assert.equal(r.status, 503, `${what}: ${JSON.stringify(r)}`);
  assert.equal(r.limiter, 'browser', what);
  assert.equal(r.type, 'application/problem+json', what);
  assert.equal(r.body.reason, 'limiter_failed', what);
  assert.match(r.body.detail, reasonPattern, what);
}

function assertPassed(r, what) {
  assert.equal(r.status, 200, `${what}: ${JSON.stringify(r)}`);
  assert.equal(r.limiter, null, what);
  assert.equal(r.body.ok, true, what);
}

async function metricsReach(env, failures, failed) {
  const deadline = Date.now() + 8000;
  let got;
  for (;;) {
    got = {
      failures: await env.metric('sluice_browser_limiter_failures_total'),
      failed: await env.metric('sluice_browser_failed_requests_total'),
    };
    if ((got.failures >= failures && got.failed >= failed) || Date.now() > deadline) break;
    await sleep(200);
  }
  assert.ok(got.failures >= failures && got.failed >= failed, `gateway metrics ${JSON.stringify(got)}`);
  // The admin dashboard's data lists them with the other browser series.
  const stats = await (await fetch(`${env.gateway.admin}/v1/stats`)).json();
  const shown = Object.fromEntries(stats.browser.map((m) => [m.name, m.value]));
  assert.equal(shown.sluice_browser_limiter_failures_total, got.failures);
  assert.ok(shown.sluice_browser_failed_requests_total >= failed, JSON.stringify(shown));
}

test('a module that does not compile, fail = "closed": 503 on every path, reported', { timeout: 60000 }, async () => {
  const env = await setupCustom({ config: testConfig({ fail: 'closed' }), wasm: CORRUPT_WASM });
  try {
    const page = await failureTab(env);
    const seen = await failureSeen(page);
    assert.equal(seen.events.length, 1, 'no sluice:failed event');
    assert.deepEqual(seen.calls, seen.events);
    assert.equal(seen.events[0].mode, 'closed');
    assert.match(seen.events[0].reason, /CompileError/);
    assertRefused(await call(page, '/api/get'), 'GET', /CompileError/);
    assertRefused(await call(page, '/api/post', { method: 'POST', body: 'x' }), 'POST', /CompileError/);
    assert.equal((await call(page, '/static/app.css')).status, 200, 'assets are not limited');
    const state = await workerState(page);
    assert.equal(state.failure.mode, 'closed');
    assert.match(state.failure.reason, /CompileError/);
    assert.match(state.disabled, /CompileError/);
    assert.equal(state.totals.failures, 1);
    assert.equal(state.totals.failed, 2);
    assert.deepEqual(env.upstream.hitsFor('/api/'), []);
    await metricsReach(env, 1, 2);
  } finally {
    await env.close();
  }
});

test('a module that does not instantiate, fail left out (open): requests pass untouched, reported', { timeout: 60000 }, async () => {
  const config = testConfig();
  delete config.fail; // the default
  const env = await setupCustom({ config, wasm: IMPORTING_WASM });
  try {
    const page = await failureTab(env);
    const seen = await failureSeen(page);
    assert.equal(seen.events.length, 1, 'no sluice:failed event');
    assert.equal(seen.events[0].mode, 'open');
    assertPassed(await call(page, '/api/get'), 'GET');
    assertPassed(await call(page, '/api/post', { method: 'POST', body: 'x' }), 'POST');
    const state = await workerState(page);
    assert.equal(state.failure.mode, 'open');
    assert.match(state.failure.reason, /Import/);
    assert.equal(state.totals.failed, 2);
    assert.equal(env.upstream.hitsFor('/api/').length, 2);
    await metricsReach(env, 1, 2);
  } finally {
    await env.close();
  }
});

/** A tab with one admitted request and two waiting (a token per 10 s); returns their promises' key. */
async function queueTwo(page) {
  await page.evaluate(async () => {
    await (await fetch('/api/t/first', { cache: 'no-store' })).text();
    window.waiters = [1, 2].map((i) =>
      fetch(`/api/t/w${i}`, { cache: 'no-store' }).then(
        async (r) => ({ status: r.status, limiter: r.headers.get('x-sluice-limiter'), body: await r.text() }),
        (e) => ({ status: 0, error: String(e) }),
      ),
    );
  });
  await sleep(200);
  assert.equal((await workerState(page)).queued, 2);
}

/** Arms the trap in export `fn`; resolves once the worker says it is armed. */
function arm(page, fn) {
  return page.evaluate(
    (fn) =>
      new Promise((resolve) => {
        const sw = navigator.serviceWorker;
        const onMessage = (e) => {
          if (e.data && e.data.type === 'test:armed') {
            sw.removeEventListener('message', onMessage);
            resolve();
          }
        };
        sw.addEventListener('message', onMessage);
        sw.controller.postMessage({ type: 'test:trap', fn });
      }),
    fn,
  );
}

test('a trap in poll with requests waiting, fail = "closed": the waiters and every later request get 503', { timeout: 60000 }, async () => {
  const config = testConfig({ fail: 'closed', capacity: 1, rate: '6/min', queue: { depth: 10, max_wait_ms: 60000 } });
  const env = await setupCustom({ config, wasm: wasmBytes(), shim: TRAP_SHIM });
  try {
    const page = await failureTab(env);
    await queueTwo(page);
    await arm(page, 'sluice_poll');
    // Queued behind the two: its wait polls the module, which traps.
    const trigger = await call(page, '/api/t/trigger');
    assertRefused(trigger, 'the request that met the trap', /RuntimeError.*unreachable/);
    const waiters = await page.evaluate(() => Promise.all(window.waiters));
    for (const w of waiters) {
      assert.equal(w.status, 503, JSON.stringify(w));
      assert.equal(w.limiter, 'browser');
      assert.equal(JSON.parse(w.body).reason, 'limiter_failed');
    }
    assertRefused(await call(page, '/api/t/after'), 'a later GET (fast path)', /RuntimeError/);
    assertRefused(await call(page, '/api/t/post', { method: 'POST', body: 'x' }), 'a later POST (slow path)', /RuntimeError/);
    const seen = await failureSeen(page);
    assert.equal(seen.events.length, 1);
    assert.match(seen.events[0].reason, /RuntimeError/);
    const state = await workerState(page);
    assert.equal(state.failure.mode, 'closed');
    assert.equal(state.queued, undefined, 'the failed module was asked for its status');
    assert.equal(state.totals.failed, 5);
    assert.deepEqual(env.upstream.hitsFor('/api/').map((h) => h.path), ['/api/t/first']);
    await metricsReach(env, 1, 5);
  } finally {
    await env.close();
  }
});

test('a trap in offer with requests waiting, fail = "open": the waiters and every later request pass', { timeout: 60000 }, async () => {
  const config = testConfig({ fail: 'open', capacity: 1, rate: '6/min', queue: { depth: 10, max_wait_ms: 60000 } });
  const env = await setupCustom({ config, wasm: wasmBytes(), shim: TRAP_SHIM });
  try {
    const page = await failureTab(env);
    await queueTwo(page);
    await arm(page, 'sluice_offer');
    assertPassed(await call(page, '/api/t/trigger'), 'the request that met the trap (fast path)');
    const waiters = await page.evaluate(() => Promise.all(window.waiters));
    for (const w of waiters) assert.equal(w.status, 200, JSON.stringify(w));
    assertPassed(await call(page, '/api/t/after'), 'a later GET');
    assertPassed(await call(page, '/api/t/post', { method: 'POST', body: 'x' }), 'a later POST');
    const seen = await failureSeen(page);
    assert.equal(seen.events.length, 1);
    assert.equal(seen.events[0].mode, 'open');
    const state = await workerState(page);
    assert.equal(state.failure.mode, 'open');
    assert.match(state.failure.reason, /RuntimeError/);
    assert.equal(state.totals.failed, 5);
    const paths = env.upstream.hitsFor('/api/').map((h) => h.path).sort();
    assert.deepEqual(paths, ['/api/t/after', '/api/t/first', '/api/t/post', '/api/t/trigger', '/api/t/w1', '/api/t/w2']);
    await metricsReach(env, 1, 5);
  } finally {
    await env.close();
  }
});

test('a trap while /sluice/state asks for the status, fail = "closed": the state still answers, showing it', { timeout: 60000 }, async () => {
  const config = testConfig({ fail: 'closed', capacity: 1, rate: '6/min', queue: { depth: 10, max_wait_ms: 60000 } });
  const env = await setupCustom({ config, wasm: wasmBytes(), shim: TRAP_SHIM });
  try {
    const page = await failureTab(env);
    await queueTwo(page);
    await arm(page, 'sluice_status');
    const state = await workerState(page);
    assert.equal(state.failure.mode, 'closed');
    assert.match(state.failure.reason, /RuntimeError/);
    assert.equal(state.tokens, undefined);
    const waiters = await page.evaluate(() => Promise.all(window.waiters));
    assert.deepEqual(waiters.map((w) => w.status), [503, 503]);
    assertRefused(await call(page, '/api/t/after'), 'a later GET', /RuntimeError/);
    assert.equal((await failureSeen(page)).events.length, 1);
    assert.deepEqual(env.upstream.hitsFor('/api/').map((h) => h.path), ['/api/t/first']);
  } finally {
    await env.close();
  }
});
