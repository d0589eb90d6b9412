#!/usr/bin/env node
// Added latency of the sluice Service Worker, and the size of what it ships.
//
//   node web/bench/latency.mjs [--rounds 60] [--per-round 20] [--append ../BENCHMARKS-history.md]
//
// One headless Chromium, three origins in front of one upstream (127.0.0.1): a page without a
// worker, one controlled by a trivial worker (respondWith(fetch(request)): what any worker
// that answers costs), and one controlled by the sluice worker. Sequential fetches in small
// blocks, rotating through the series, so that load from elsewhere hits all alike; the added
// latencies are medians of block-to-block differences. Series:
//   direct GET|POST /api/        no worker
//   trivial worker GET /api/     respondWith(fetch(request))
//   sluice worker GET /api/      admitted at once (an effectively unlimited bucket): decided
//                                synchronously, then left to the browser (no respondWith),
//                                its block reserved ahead in IndexedDB (web/README.md)
//   sluice persist:false GET     the same without persistence: nothing reserved ahead, so the
//                                difference is what reserving ahead costs
//   sluice worker POST /api/     admitted, sent by the worker after the journal is written
//   direct|sluice GET /static/   a path outside the prefixes (the worker does not respond)
// Also: the cost of one offer (+ status) through the wasm ABI in node (same V8), and the sizes.

import { readFileSync, appendFileSync, existsSync } from 'node:fs';
import http from 'node:http';
import { gzipSync } from 'node:zlib';
import vm from 'node:vm';
import { execSync } from 'node:child_process';

import { buildServiceWorker } from '../build-sw.mjs';
import { launchBrowser, median, openTab, startDevFront, startUpstream, wasmBytes, CHROMIUM } from '../tests/harness.mjs';

const args = { rounds: 60, 'per-round': 20, append: null };
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const ROUNDS = Number(args.rounds);
const PER_ROUND = Number(args['per-round']);

const CONFIG = {
  path_prefixes: ['/api/'],
  algorithm: 'token_bucket',
  capacity: 1000000,
  rate: '1000000/s',
  queue: { depth: 100, max_wait_ms: 10000 },
  max_queued_body_bytes: 65536,
  persist: true,
  persist_debounce_ms: 150,
  telemetry: { endpoint: '/v1/telemetry', interval_ms: 5000, sample: 1.0 },
};

function sequential(page, path, n, method = 'GET') {
  return page.evaluate(
    async ({ path, n, method }) => {
      const out = [];
      for (let i = 0; i < n; i++) {
        const start = performance.now();
        const init = method === 'GET' ? { cache: 'no-store' } : { method, body: '{"n":1}', cache: 'no-store' };
        const r = await fetch(`${path}${i}`, init);
        await r.arrayBuffer();
        if (r.status !== 200) throw new Error(`status ${r.status}`);
        out.push(performance.now() - start);
      }
      return out;
    },
    { path, n, method },
  );
}

function wasmOfferCost() {
  const script = buildServiceWorker({ wasm: wasmBytes(), config: CONFIG });
  const g = { atob, WebAssembly, TextEncoder, TextDecoder, console, Uint8Array, Float64Array };
  g.self = g;
  vm.createContext(g);
  vm.runInContext(script, g);
  const { SluiceLimiter } = g.__sluice_internals__;
  const l = new SluiceLimiter(new WebAssembly.Module(wasmBytes()), { capacity: 1e6, rate: '1000000/s', depth: 100, maxWaitMs: 10000 });
  const n = 200000;
  let now = 0;
  for (let i = 0; i < 10000; i++) l.offer((now += 0.01), 1, 1);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) l.offer((now += 0.01), 1, i & 7);
  const offerUs = ((performance.now() - t0) * 1000) / n;
  const t1 = performance.now();
  for (let i = 0; i < n; i++) l.poll((now += 0.01));
  const pollUs = ((performance.now() - t1) * 1000) / n;
  return { offerUs, pollUs };
}

/** A reference front whose worker only does respondWith(fetch(request)) under /api/. */
async function startTrivialFront(upstream) {
  const sw =
    "self.addEventListener('install', (e) => e.waitUntil(self.skipWaiting()));\n" +
    "self.addEventListener('activate', (e) => e.waitUntil(self.clients.claim()));\n" +
    "self.addEventListener('fetch', (e) => { if (new URL(e.request.url).pathname.startsWith('/api/')) e.respondWith(fetch(e.request)); });\n";
  const client = readFileSync(new URL('../client.js', import.meta.url));
  const server = http.createServer((req, res) => {
    if (req.url === '/sluice/sw.js' || req.url === '/sluice/client.js') {
      res.writeHead(200, { 'content-type': 'text/javascript', 'service-worker-allowed': '/', 'cache-control': 'no-cache' });
      return res.end(req.url === '/sluice/sw.js' ? sw : client);
    }
    const out = http.request(upstream.url + req.url, { method: req.method, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    req.pipe(out);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

const upstream = await startUpstream();
const plain = await startDevFront({ upstream, config: CONFIG });
const trivialFront = await startTrivialFront(upstream);
const limited = await startDevFront({ upstream, config: CONFIG });
const unpersisted = await startDevFront({ upstream, config: { ...CONFIG, persist: false } });
const browser = await launchBrowser();
const SERIES = [
  ['direct GET /api/', 'direct', '/api/', 'GET'],
  ['trivial worker GET /api/', 'trivial', '/api/', 'GET'],
  ['sluice worker GET /api/', 'sluice', '/api/', 'GET'],
  ['sluice worker persist:false GET /api/', 'unpersisted', '/api/', 'GET'],
  ['direct POST /api/', 'direct', '/api/', 'POST'],
  ['sluice worker POST /api/', 'sluice', '/api/', 'POST'],
  ['direct GET /static/', 'direct', '/static/', 'GET'],
  ['sluice worker GET /static/', 'sluice', '/static/', 'GET'],
];
const series = Object.fromEntries(SERIES.map(([name]) => [name, []]));
const blockMedians = Object.fromEntries(SERIES.map(([name]) => [name, []]));
try {
  const direct = await browser.context.newPage();
  await direct.goto(plain.url + '/');
  const pages = {
    direct,
    trivial: await openTab(browser.context, trivialFront),
    sluice: await openTab(browser.context, limited),
    unpersisted: await openTab(browser.context, unpersisted),
  };
  // Warm up connections, the workers and the JIT.
  for (const [, page, path, method] of SERIES) await sequential(pages[page], `${path}warm/`, 30, method);
  // Rotate through the series in small blocks so that load from elsewhere hits all alike.
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, page, path, method] of SERIES) {
      const block = await sequential(pages[page], `${path}b${r}/`, PER_ROUND, method);
      series[name].push(...block);
      blockMedians[name].push(median(block));
    }
  }
  const state = await pages.sluice.evaluate(async () => (await fetch('/sluice/state')).json());
  if (state.totals.admitted < 2 * ROUNDS * PER_ROUND) throw new Error('the worker did not handle the /api/ fetches');
} finally {
  await browser.close();
  await plain.close();
  await trivialFront.close();
  await limited.close();
  await unpersisted.close();
  await upstream.close();
}

/** Median over blocks of (a - b), blocks run back to back. */
const paired = (a, b) => median(blockMedians[a].map((v, i) => v - blockMedians[b][i]));

const wasm = wasmBytes();
const sw = buildServiceWorker({ wasm, config: CONFIG });
const cost = wasmOfferCost();
const p90 = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length * 0.9)];
const addedApi = paired('sluice worker GET /api/', 'direct GET /api/');
const addedTrivial = paired('trivial worker GET /api/', 'direct GET /api/');
const versusTrivial = paired('sluice worker GET /api/', 'trivial worker GET /api/');
const addedPost = paired('sluice worker POST /api/', 'direct POST /api/');
const addedStatic = paired('sluice worker GET /static/', 'direct GET /static/');
const addedReserve = paired('sluice worker GET /api/', 'sluice worker persist:false GET /api/');

const chromium = execSync(`${CHROMIUM} --version`, { encoding: 'utf8' }).trim();
const rows = [
  '| series | n | median ms | p90 ms |',
  '|---|---|---|---|',
  ...Object.entries(series).map(([k, v]) => `| ${k} | ${v.length} | ${median(v).toFixed(3)} | ${p90(v).toFixed(3)} |`),
];
const summary = [
  '| figure | value |',
  '|---|---|',
  `| added latency, admitted GET: sluice worker vs no worker | **${addedApi.toFixed(2)} ms** (target < 1 ms) |`,
  `| for scale: a trivial respondWith(fetch(request)) worker vs no worker | ${addedTrivial.toFixed(2)} ms |`,
  `| sluice worker vs that trivial worker, admitted GET | ${versusTrivial.toFixed(2)} ms |`,
  `| reserve ahead: admitted GET, persist true vs persist false | ${addedReserve.toFixed(2)} ms |`,
  `| added latency, admitted POST (sent by the worker, journal written first) | ${addedPost.toFixed(2)} ms |`,
  `| pass-through (path outside the prefixes): sluice worker vs no worker | ${addedStatic.toFixed(2)} ms |`,
  `| one offer through the wasm ABI (node ${process.version}, same V8) | ${cost.offerUs.toFixed(2)} µs |`,
  `| one poll through the wasm ABI | ${cost.pollUs.toFixed(2)} µs |`,
  `| sluice_wasm.wasm | ${wasm.length} bytes (${gzipSync(wasm, { level: 9 }).length} gzipped) |`,
  `| served /sluice/sw.js (prefix with base64 module + sw.js) | ${Buffer.byteLength(sw)} bytes (${gzipSync(sw, { level: 9 }).length} gzipped) |`,
  `| web/sw.js alone | ${readFileSync(new URL('../sw.js', import.meta.url)).length} bytes |`,
];
console.log(rows.join('\n'));
console.log();
console.log(summary.join('\n'));

if (args.append) {
  const date = new Date().toISOString().slice(0, 10);
  const section = [
    '',
    '## Browser: Service Worker overhead',
    '',
    `Command: \`cargo build -p sluice-wasm --target wasm32-unknown-unknown --release && node web/bench/latency.mjs --rounds ${ROUNDS} --per-round ${PER_ROUND}\``,
    `Date: ${date}. ${chromium} headless, playwright-core, node ${process.version}, 2 cores; upstream and dev front on 127.0.0.1 (HTTP/1.1).`,
    'Sequential fetches in blocks of ' + PER_ROUND + ', rotating through the series; added latencies are medians of block-to-block differences.',
    'The sluice worker admits every request (bucket large enough) with persistence and the in-flight journal on; the trivial',
    'worker only does `respondWith(fetch(request))`; "direct" is an origin without a worker.',
    '',
    ...rows,
    '',
    ...summary,
    '',
  ].join('\n');
  const target = args.append;
  if (!existsSync(target)) appendFileSync(target, '# Benchmarks\n');
  appendFileSync(target, section);
  console.log(`\nappended to ${target}`);
}
