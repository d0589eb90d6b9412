// politeFetch's page-side pacer (`pace: true`), without a Service Worker: three tabs of one
// origin share what the server said through IndexedDB and a BroadcastChannel, and pace as one
// client. A stand-in server on 127.0.0.1 (packages/sluice-js/test/standin.mjs) enforces a hidden
// limit, announces it in one provider's style, and changes it mid-run. Counted: the 429s the
// tabs got, and the share of the binding limit's sustained rate the server admitted in each
// phase's steady state (after its first window), from the server's own admission times. Each
// test prints its figures.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { test } from 'node:test';

import { standIn } from '../../packages/sluice-js/test/standin.mjs';
import { launchBrowser, serveOnFreePort, WEB } from './harness.mjs';

const WINDOW = 2000;
const PHASE = 8000;
const TABS = 3;
const LOOPS_PER_TAB = 4;

/** A site with no Service Worker: its pages, /sluice/client.js, and /api/ proxied to `server`. */
function site(server) {
  const target = new URL(server.url);
  const front = http.createServer((req, res) => {
    if (req.url === '/sluice/client.js') {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8', 'cache-control': 'no-store' });
      return res.end(readFileSync(join(WEB, 'client.js')));
    }
    if (!req.url.startsWith('/api/')) {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end('<!doctype html><meta charset="utf-8"><title>paced page</title>\n');
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

/**
 * In `page`: `loops` politeFetch loops (paced, one attempt each, so every 429 is seen) until
 * `until` (ms since 1970), each request declaring `tokens` (or nothing) and asking the server
 * to count `use` tokens: [[at, status]].
 */
function loop(page, { loops, until, tokens, use }) {
  return page.evaluate(
    async ({ loops, until, tokens, use }) => {
      const { politeFetch } = await import('/sluice/client.js');
      const log = [];
      let i = 0;
      await Promise.all(
        Array.from({ length: loops }, async () => {
          while (Date.now() < until) {
            const init = { cache: 'no-store', method: 'POST', body: '{}', headers: use === undefined ? {} : { 'x-use-tokens': String(use) } };
            const r = await politeFetch(`/api/paced/${i++}`, init, { pace: true, tokens, maxAttempts: 1 });
            await r.arrayBuffer();
            log.push([Date.now(), r.status]);
          }
        }),
      );
      return { log, controlled: navigator.serviceWorker.controller !== null };
    },
    { loops, until, tokens, use },
  );
}

/**
 * Three tabs against a stand-in of `style` at `before` per WINDOW, changed to `after` at
 * the end of the first phase. Returns the figures.
 */
async function run({ style, before, after, tokens, use, tokenLimit }) {
  const server = await standIn({ style, limit: before, windowMs: WINDOW, ...(tokenLimit ? { tokens: tokenLimit(before) } : {}) });
  const front = await site(server);
  const browser = await launchBrowser();
  let changed = null;
  try {
    const pages = [];
    for (let i = 0; i < TABS; i++) {
      const page = await browser.context.newPage();
      await page.goto(`${front.url}/page/${i}`);
      pages.push(page);
    }
    const t0 = Date.now() + 300;
    const switchAt = t0 + PHASE;
    const end = switchAt + PHASE;
    changed = setTimeout(() => server.setLimit(after, tokenLimit ? tokenLimit(after) : undefined), switchAt - Date.now());
    const results = await Promise.all(pages.map((p) => loop(p, { loops: LOOPS_PER_TAB, until: end, tokens, use })));
    const log = results.flatMap((r) => r.log);
    const ok = (from, to) => server.stats.admittedAt.filter((at) => at >= from && at < to).length;
    // The binding limit's sustained rate, in requests: the request limit, or the token limit at `use` each.
    const rate = (limit) => (tokenLimit ? Math.min(limit, tokenLimit(limit) / use) : limit);
    const share1 = ok(t0 + WINDOW, switchAt) / ((rate(before) * (PHASE - WINDOW)) / WINDOW);
    const share2 = ok(switchAt + WINDOW, end) / ((rate(after) * (PHASE - WINDOW)) / WINDOW);
    const limited = log.filter(([, s]) => s === 429).length;
    return { log, share1, share2, limited, serverLimited: server.stats.limited, controlled: results.some((r) => r.controlled), minutes: (end - t0) / 60000 };
  } finally {
    clearTimeout(changed);
    await browser.close();
    await front.close();
    await server.close();
  }
}

for (const { style, before, after } of [
  { style: 'ietf', before: 20, after: 40 },
  { style: 'openai', before: 30, after: 15 },
  { style: 'github', before: 20, after: 10 },
]) {
  test(`politeFetch in ${TABS} tabs without a Service Worker paces as one client from a ${style}-style server, and follows its change`, { timeout: 60000 }, async () => {
    const r = await run({ style, before, after });
    console.log(
      `politeFetch pace, ${style}: ${TABS} tabs x ${LOOPS_PER_TAB} loops, ${r.log.length} answers, ${r.limited} 429s ` +
        `(${(r.limited / r.minutes).toFixed(1)}/min; server counted ${r.serverLimited}); share of the hidden rate ` +
        `${r.share1.toFixed(3)} at ${before}/${WINDOW} ms, ${r.share2.toFixed(3)} after the change to ${after}/${WINDOW} ms`,
    );
    assert.equal(r.controlled, false, 'no Service Worker');
    assert.ok(r.limited <= 1, `${r.limited} 429s`);
    assert.ok(r.share1 >= 0.9 && r.share1 <= 1.1, `before: ${r.share1}`);
    assert.ok(r.share2 >= 0.9 && r.share2 <= 1.1, `after: ${r.share2}`);
  });
}

test('politeFetch with declared tokens waits on an OpenAI-style token limit and reconciles from the usage', { timeout: 60000 }, async () => {
  // Requests and tokens per window; each request declares 300 tokens and uses 100: the tokens
  // bind (10 requests per window of 1,000 tokens, where the request limit allows 40), and the
  // declared cost alone would allow a third of that.
  const r = await run({ style: 'openai', before: 40, after: 20, tokens: 300, use: 100, tokenLimit: (limit) => limit * 25 });
  console.log(
    `politeFetch pace, tokens 300 declared, 100 used: ${r.log.length} answers, ${r.limited} 429s (server counted ${r.serverLimited}); ` +
      `share of the token limit's rate ${r.share1.toFixed(3)} at 1000 tokens/${WINDOW} ms, ${r.share2.toFixed(3)} after the change to 500`,
  );
  assert.ok(r.limited <= 1, `${r.limited} 429s`);
  assert.ok(r.share1 >= 0.9 && r.share1 <= 1.1, `before: ${r.share1}`);
  assert.ok(r.share2 >= 0.9 && r.share2 <= 1.1, `after: ${r.share2}`);
});
