// Declared token costs through the Service Worker (`pace_from_server`): politeFetch's `tokens`
// goes out as `X-Sluice-Tokens`, which the worker reads as the request's cost, so that a
// request waits on the server's token limit as well as its request limit; the answer's token
// fields and JSON usage reconcile it. Against an OpenAI-style stand-in on loopback
// (packages/sluice-js/test/standin.mjs): 40 requests and 1,000 tokens per 2 s window, each
// request using 100 tokens (so the tokens bind: 10 a window) and declaring 300. Three tabs; the
// limits are halved mid-run. Paced on requests alone the tabs would send 20 a second, twice
// what the tokens allow.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { standIn } from '../../packages/sluice-js/test/standin.mjs';
import { openTab, serveOnFreePort, setup, testConfig, workerState } from './harness.mjs';

const WINDOW = 2000;
const PHASE = 8000;
const TABS = 3;
const LOOPS_PER_TAB = 4;

/** The gateway's upstream: /api/ goes to the stand-in, the rest is a page. */
function siteBefore(server) {
  const target = new URL(server.url);
  const front = http.createServer((req, res) => {
    if (!req.url.startsWith('/api/')) {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end('<!doctype html><meta charset="utf-8"><title>tokens</title>\n');
    }
    const out = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    out.on('error', () => res.writeHead(502).end());
    req.pipe(out);
  });
  front.keepAliveTimeout = 60000;
  return serveOnFreePort(front);
}

test(`${TABS} tabs declaring token costs through the worker wait on an OpenAI-style token limit`, { timeout: 60000 }, async () => {
  const server = await standIn({ style: 'openai', limit: 40, tokens: 1000, windowMs: WINDOW });
  const site = await siteBefore(server);
  const upstream = { url: site.url, close: () => Promise.all([site.close(), server.close()]) };
  const config = testConfig({ capacity: 1000, rate: '1000/s', queue: { depth: 1000, max_wait_ms: 30000 }, pace_from_server: true });
  const env = await setup(config, { upstream });
  let changed = null;
  try {
    const pages = [];
    for (let i = 0; i < TABS; i++) pages.push(await openTab(env.context, env.front, '/page/tokens'));
    const t0 = Date.now() + 200;
    const switchAt = t0 + PHASE;
    const end = switchAt + PHASE;
    changed = setTimeout(() => server.setLimit(20, 500), switchAt - Date.now());
    const logs = await Promise.all(
      pages.map((page) =>
        page.evaluate(
          async ({ loops, until }) => {
            const { politeFetch } = await import('/sluice/client.js');
            const log = [];
            let i = 0;
            await Promise.all(
              Array.from({ length: loops }, async () => {
                while (Date.now() < until) {
                  const r = await politeFetch(
                    `/api/chat/${i++}`,
                    { method: 'POST', body: '{}', cache: 'no-store', headers: { 'content-type': 'application/json', 'x-use-tokens': '100' } },
                    { tokens: 300, maxAttempts: 1 },
                  );
                  await r.arrayBuffer();
                  log.push([Date.now(), r.status, r.headers.get('x-sluice-limiter')]);
                }
              }),
            );
            return log;
          },
          { loops: LOOPS_PER_TAB, until: end },
        ),
      ),
    );
    const log = logs.flat();
    // Counted from the server's own admission times (see pacing.test.mjs).
    const ok = (from, to) => server.stats.admittedAt.filter((at) => at >= from && at < to).length;
    // The token limits' sustained rate at 100 tokens a request: 10, then 5, per window.
    const share1 = ok(t0 + WINDOW, switchAt) / ((10 * (PHASE - WINDOW)) / WINDOW);
    const share2 = ok(switchAt + WINDOW, end) / ((5 * (PHASE - WINDOW)) / WINDOW);
    const fromServer = log.filter(([, s, limiter]) => s === 429 && limiter !== 'browser').length;
    const fromWorker = log.filter(([, s, limiter]) => s === 429 && limiter === 'browser').length;
    const state = await workerState(pages[0]);
    console.log(
      `tokens through the worker: ${log.length} answers, ${fromServer} 429s from the server (server counted ${server.stats.limited}), ${fromWorker} from the worker; ` +
        `share of the token limit's rate ${share1.toFixed(3)} at 1000 tokens/${WINDOW} ms, ${share2.toFixed(3)} after the change to 500; ` +
        `the worker knows ${JSON.stringify(state.pacing.limits['openai:tokens'])}`,
    );
    assert.equal(state.flows, TABS);
    assert.equal(state.pacing.limits['openai:tokens'].limit, 500);
    assert.ok(server.stats.limited <= 1, `${server.stats.limited} 429s from the server`);
    assert.equal(fromWorker, 0);
    assert.ok(share1 >= 0.9 && share1 <= 1.1, `before: ${share1}`);
    assert.ok(share2 >= 0.9 && share2 <= 1.1, `after: ${share2}`);
  } finally {
    clearTimeout(changed);
    await env.close();
  }
});
