// Pacing from the server's limits (`pace_from_server`) in Chromium: a stand-in server on
// loopback (packages/sluice-js/test/standin.mjs) enforces a hidden limit and announces it, as
// `sluice serve` does (the IETF fields) or as OpenAI does (x-ratelimit-*); three tabs of one
// origin fetch it concurrently through the worker, whose configured limit is far above the
// hidden one. The hidden limit changes mid-run. Counted: the server's 429s (from the tabs'
// answers), and the share of the hidden limit's sustained rate served in each phase's steady
// state (after its first window), counted from the server's own admission times, not from
// the times the tabs log their answers: a tab starved by a loaded machine logs late, which can move
// requests from one phase into the next (one run on this machine at load average 12 read 0.867
// before the change and 1.111 after it from the tabs' logs; the share is of what the server
// admitted, so it is counted where it happens). Each phase is 12 s, so that its 10 s of steady
// state hold enough requests for the server's bucket level at its two ends (a few requests) to
// weigh under 5 %. Each test prints both counts.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { standIn } from '../../packages/sluice-js/test/standin.mjs';
import { openTab, serveOnFreePort, setup, testConfig, workerState } from './harness.mjs';

const WINDOW = 2000;
const PHASE = 12000;
const TABS = 3;
const LOOPS_PER_TAB = 4;

/** Allowed answers in `ms` at `limit` per window: the sustained rate. */
const allowed = (limit, ms) => (limit * ms) / WINDOW;

/** The gateway's upstream: /api/ goes to the stand-in (every answer counted there), the rest is a page. */
function siteBefore(server) {
  const target = new URL(server.url);
  const front = http.createServer((req, res) => {
    if (!req.url.startsWith('/api/')) {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end('<!doctype html><meta charset="utf-8"><title>pacing</title>\n');
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

/** In `page`: `loops` fetch loops on /api/paced/ until `until` (ms since 1970): [[at, status, limiter]]. */
function loop(page, loops, until) {
  return page.evaluate(
    async ({ loops, until }) => {
      const log = [];
      let i = 0;
      await Promise.all(
        Array.from({ length: loops }, async () => {
          while (Date.now() < until) {
            const r = await fetch(`/api/paced/${i++}`, { cache: 'no-store' });
            await r.arrayBuffer();
            log.push([Date.now(), r.status, r.headers.get('x-sluice-limiter')]);
          }
        }),
      );
      return log;
    },
    { loops, until },
  );
}

for (const { style, before, after } of [
  { style: 'ietf', before: 20, after: 40 },
  { style: 'openai', before: 30, after: 15 },
]) {
  test(`${TABS} tabs through the worker follow a ${style}-style server's limit, and its change mid-run`, { timeout: 90000 }, async () => {
    const server = await standIn({ style, limit: before, windowMs: WINDOW });
    const site = await siteBefore(server);
    const upstream = { url: site.url, close: () => Promise.all([site.close(), server.close()]) };
    const config = testConfig({
      capacity: 1000,
      rate: '1000/s',
      queue: { depth: 1000, max_wait_ms: 30000 },
      pace_from_server: true,
    });
    const env = await setup(config, { upstream });
    let changed = null;
    try {
      const pages = [];
      for (let i = 0; i < TABS; i++) pages.push(await openTab(env.context, env.front, '/page/pacing'));
      const t0 = Date.now() + 200;
      const switchAt = t0 + PHASE;
      const end = switchAt + PHASE;
      changed = setTimeout(() => server.setLimit(after), switchAt - Date.now());
      const logs = await Promise.all(pages.map((p) => loop(p, LOOPS_PER_TAB, end)));
      const log = logs.flat();
      const count = (from, to, pick) => log.filter(([at, status, limiter]) => at >= from && at < to && pick(status, limiter)).length;
      const ok = (from, to) => count(from, to, (s) => s === 200);
      const fromServer429 = count(0, Infinity, (s, limiter) => s === 429 && limiter !== 'browser');
      const fromWorker429 = count(0, Infinity, (s, limiter) => s === 429 && limiter === 'browser');
      const admitted = (from, to) => server.stats.admittedAt.filter((at) => at >= from && at < to).length;
      const share1 = admitted(t0 + WINDOW, switchAt) / allowed(before, PHASE - WINDOW);
      const share2 = admitted(switchAt + WINDOW, end) / allowed(after, PHASE - WINDOW);
      const tabShare1 = ok(t0 + WINDOW, switchAt) / allowed(before, PHASE - WINDOW);
      const tabShare2 = ok(switchAt + WINDOW, end) / allowed(after, PHASE - WINDOW);
      const minutes = (end - t0) / 60000;
      const state = await workerState(pages[0]);
      console.log(
        `${style}: ${TABS} tabs x ${LOOPS_PER_TAB} loops, ${log.length} answers in ${end - t0} ms: ` +
          `${fromServer429} 429s from the server (${(fromServer429 / minutes).toFixed(1)}/min; server counted ${server.stats.limited}), ` +
          `${fromWorker429} from the worker; share of the hidden rate ${share1.toFixed(3)} at ${before}/${WINDOW} ms, ` +
          `${share2.toFixed(3)} after the change to ${after}/${WINDOW} ms (counted by the tabs' clocks: ${tabShare1.toFixed(3)}, ${tabShare2.toFixed(3)}); the worker knows ${JSON.stringify(state.pacing.limits)}`,
      );
      // One worker for the three tabs, and it read the server's limit.
      assert.equal(state.flows, TABS);
      assert.equal(state.pacing.limits[`${style}:${style === 'ietf' ? 'default' : 'requests'}`].limit, after);
      assert.ok(server.stats.limited <= 1, `${server.stats.limited} 429s from the server`);
      assert.equal(fromWorker429, 0);
      assert.ok(share1 >= 0.95 && share1 <= 1.1, `before: ${share1}`);
      assert.ok(share2 >= 0.95 && share2 <= 1.1, `after: ${share2}`);
    } finally {
      clearTimeout(changed);
      await env.close();
    }
  });
}
