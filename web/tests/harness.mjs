// Test harness: an upstream that counts what reaches it, a front that serves the browser files
// and proxies the rest (no limiting of its own on /api/), and a fresh headless Chromium per test.
//
// The front is the real gateway: startFront() writes a gateway config (TOML: `[server]`, one
// `[[route]]` for "/" to the test upstream with no policy, and `[browser]`) and runs
// `sluice serve --config FILE`. The binary is $SLUICE_BIN (run-tests.sh builds it and sets
// it), else this checkout's debug build, built here once; SLUICE_GATEWAY_CMD (e.g.
// "target/release/sluice serve") overrides the whole command. SLUICE_FRONT=dev selects the
// node dev front below instead (the same paths, for working on web/ without cargo).

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { launchChromium } from '../../scripts/chromium.mjs';
import { buildServiceWorker, DEFAULT_WASM } from '../build-sw.mjs';

const here = dirname(fileURLToPath(import.meta.url));
export const WEB = join(here, '..');
export const ROOT = join(WEB, '..');
export const CI = process.env.CI === 'true';
export { CHROMIUM } from '../../scripts/chromium.mjs';

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function listen(server, port = 0) {
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server.address().port));
  });
}

function closeServer(server) {
  return new Promise((resolve) => {
    server.closeAllConnections?.();
    server.close(() => resolve());
  });
}

/**
 * Starts a node http `server` on a free 127.0.0.1 port: `{ url, close(), ...extra }`, where
 * `close()` drops its open connections and stops it (for a test's own upstream or front).
 */
export async function serveOnFreePort(server, extra = {}) {
  const port = await listen(server);
  return { ...extra, url: `http://127.0.0.1:${port}`, close: () => closeServer(server) };
}

/** The sluice-wasm module, built if missing (run-tests.sh builds it first). */
export function wasmBytes() {
  if (!existsSync(DEFAULT_WASM)) {
    const r = spawnSync('cargo', ['build', '-p', 'sluice-wasm', '--target', 'wasm32-unknown-unknown', '--release'], {
      cwd: ROOT,
      stdio: 'inherit',
    });
    if (r.status !== 0) throw new Error('cargo build of sluice-wasm failed');
  }
  return readFileSync(DEFAULT_WASM);
}

// === upstream ===

/**
 * An upstream on a free port. It records every request ({ method, path, t }) with `t` from
 * this process's performance.now(), and answers:
 *   /api/slow/...?ms=N   200 JSON after N ms
 *   /api/...             200 JSON
 *   /static/...          200 text/css
 *   / and /page/...      200 text/html
 *   anything else        404
 */
export async function startUpstream({ port = 0 } = {}) {
  const hits = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://upstream');
    hits.push({ method: req.method, path: url.pathname, t: performance.now() });
    req.resume();
    const send = (status, type, body) => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (url.pathname.startsWith('/api/slow/')) {
      const ms = Number(url.searchParams.get('ms') || 1000);
      setTimeout(() => send(200, 'application/json', JSON.stringify({ ok: true, path: url.pathname })), ms);
    } else if (url.pathname.startsWith('/api/')) {
      send(200, 'application/json', JSON.stringify({ ok: true, path: url.pathname }));
    } else if (url.pathname.startsWith('/static/')) {
      send(200, 'text/css', 'body { color: #222 }\n');
    } else if (url.pathname === '/' || url.pathname.startsWith('/page/')) {
      send(200, 'text/html; charset=utf-8', '<!doctype html><meta charset="utf-8"><title>sluice test page</title><p>test page</p>\n');
    } else {
      send(404, 'text/plain', 'not found\n');
    }
  });
  const bound = await listen(server, port);
  return {
    url: `http://127.0.0.1:${bound}`,
    port: bound,
    hits,
    /** Hits whose path starts with `prefix`. */
    hitsFor: (prefix) => hits.filter((h) => h.path.startsWith(prefix)),
    close: () => closeServer(server),
  };
}

// === the front ===

const FILES = {
  '/sluice/client.js': ['client.js', 'text/javascript; charset=utf-8'],
  '/sluice/demo.html': ['demo.html', 'text/html; charset=utf-8'],
  '/sluice/demo.js': ['demo.js', 'text/javascript; charset=utf-8'],
};

/**
 * Starts the front for `config` (the [browser] JSON) in front of `upstream`: the real gateway,
 * or the dev front with SLUICE_FRONT=dev. Returns { url, admin, kind, telemetryTotals(),
 * close() }.
 */
export async function startFront({ upstream, config, maxBody }) {
  if (process.env.SLUICE_FRONT === 'dev') return startDevFront({ upstream, config });
  return startGateway({ upstream, config, maxBody, cmd: gatewayCommand() });
}

let builtBinary = null;

/** The `sluice` binary: $SLUICE_BIN, else this checkout's debug build (built once, here). */
export function sluiceBinary() {
  if (process.env.SLUICE_BIN) return process.env.SLUICE_BIN;
  if (builtBinary) return builtBinary;
  const r = spawnSync('cargo', ['build', '-p', 'sluice-server', '--bin', 'sluice'], { cwd: ROOT, stdio: 'inherit' });
  if (r.status !== 0) throw new Error('cargo build of the sluice binary failed');
  const bin = join(process.env.CARGO_TARGET_DIR || join(ROOT, 'target'), 'debug', 'sluice');
  if (!existsSync(bin)) throw new Error(`no ${bin}`);
  builtBinary = bin;
  return bin;
}

/** The command that runs the gateway, before `--config FILE`. */
export function gatewayCommand() {
  return process.env.SLUICE_GATEWAY_CMD || `"${sluiceBinary()}" serve`;
}

/** The dev front: what `sluice serve` will do for the browser, minus any limiting. */
export async function startDevFront({ upstream, config, port = 0 }) {
  let script = buildServiceWorker({ wasm: wasmBytes(), config });
  const telemetry = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://front');
    if (req.method === 'GET' && url.pathname === '/sluice/sw.js') {
      res.writeHead(200, {
        'content-type': 'text/javascript; charset=utf-8',
        'service-worker-allowed': '/',
        'cache-control': 'no-cache',
      });
      return res.end(script);
    }
    if (req.method === 'GET' && url.pathname === '/sluice/config.json') {
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-cache' });
      return res.end(JSON.stringify(config));
    }
    if (req.method === 'GET' && FILES[url.pathname]) {
      const [file, type] = FILES[url.pathname];
      res.writeHead(200, { 'content-type': type, 'cache-control': 'no-cache' });
      return res.end(readFileSync(join(WEB, file)));
    }
    if (url.pathname === '/v1/telemetry') return acceptTelemetry(req, res, telemetry);
    return proxy(req, res, upstream);
  });
  const bound = await listen(server, port);
  return {
    url: `http://127.0.0.1:${bound}`,
    kind: 'dev',
    telemetry,
    telemetryTotals: async () => sumTelemetry(telemetry),
    /** Serves `next` (the [browser] JSON) from now on, as the gateway does after a reload. */
    reload: async (next) => {
      config = next;
      script = buildServiceWorker({ wasm: wasmBytes(), config });
    },
    close: () => closeServer(server),
  };
}

function acceptTelemetry(req, res, store) {
  if (req.method !== 'POST') {
    res.writeHead(405, { allow: 'POST' });
    return res.end();
  }
  const chunks = [];
  let size = 0;
  req.on('data', (c) => {
    size += c.length;
    if (size <= 1024) chunks.push(c);
  });
  req.on('end', () => {
    if (size > 1024) {
      res.writeHead(413);
      return res.end();
    }
    try {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      if (body.v !== 1) throw new Error('version');
      store.push(body);
      res.writeHead(204);
    } catch (e) {
      res.writeHead(400);
    }
    res.end();
  });
}

/** Totals over the batches, as the gateway's /metrics would count them. */
export function sumTelemetry(batches) {
  const t = { batches: batches.length, admitted: 0, queued: 0, cancelled: 0, redispatched: 0, rejected: { queue_full: 0, timeout: 0, limit: 0 }, wait_ms_count: 0, wait_ms_sum: 0, wait_ms_max: 0 };
  for (const b of batches) {
    t.admitted += b.admitted;
    t.queued += b.queued;
    t.cancelled += b.cancelled;
    t.redispatched += b.redispatched;
    for (const k of Object.keys(t.rejected)) t.rejected[k] += b.rejected[k];
    t.wait_ms_count += b.wait_ms.count;
    t.wait_ms_sum += b.wait_ms.sum;
    t.wait_ms_max = Math.max(t.wait_ms_max, b.wait_ms.max);
  }
  return t;
}

function proxy(req, res, upstream) {
  const headers = { ...req.headers, 'x-forwarded-for': req.socket.remoteAddress };
  const out = http.request(`${upstream.url}${req.url}`, { method: req.method, headers }, (up) => {
    res.writeHead(up.statusCode, up.headers);
    up.pipe(res);
  });
  out.on('error', () => {
    if (!res.headersSent) res.writeHead(502);
    res.end();
  });
  req.pipe(out);
}

// === the real gateway ===

/**
 * The gateway config for a test: every path proxied to `upstream` with no policy (the gateway
 * itself limits nothing, so every limit the test sees is the browser's), plus [browser] from
 * `config`.
 */
export function gatewayToml({ listen, adminListen, upstream, config, maxBody }) {
  const str = (s) => JSON.stringify(s);
  const lines = [
    '[server]',
    `listen = ${str(listen)}`,
    `admin_listen = ${str(adminListen)}`,
    'shutdown_timeout = "2s"',
    // The gateway's own cap on request bodies (1 MiB by default), for tests that send more.
    ...(maxBody === undefined ? [] : [`max_body = ${str(maxBody)}`]),
    '',
    '[[route]]',
    'path_prefix = "/"',
    `upstream = ${str(upstream.url)}`,
    '',
    '[browser]',
    `path_prefixes = [${config.path_prefixes.map(str).join(', ')}]`,
    `algorithm = ${str(config.algorithm || 'token_bucket')}`,
    `capacity = ${config.capacity}`,
    `rate = ${str(config.rate)}`,
    `queue = { depth = ${config.queue.depth}, max_wait = "${config.queue.max_wait_ms}ms" }`,
    `queue_max_body = ${config.max_queued_body_bytes}`,
    `persist = ${config.persist}`,
  ];
  if (config.persist_debounce_ms !== undefined) lines.push(`persist_debounce = "${config.persist_debounce_ms}ms"`);
  if (config.fail !== undefined) lines.push(`fail = ${str(config.fail)}`);
  if (config.pace_from_server !== undefined) lines.push(`pace_from_server = ${config.pace_from_server}`);
  if (config.telemetry) {
    const t = config.telemetry;
    const sample = Number.isInteger(t.sample) ? t.sample.toFixed(1) : String(t.sample);
    lines.push(`telemetry = { endpoint = ${str(t.endpoint)}, interval = "${t.interval_ms}ms", sample = ${sample} }`);
  } else if (config.telemetry === null) {
    lines.push('telemetry = false');
  }
  return lines.join('\n') + '\n';
}

/**
 * Runs `cmd --config FILE` (the gateway) on two free ports and waits until it serves
 * /sluice/sw.js. FILE is `toml({ listen, adminListen })`, by default the config of
 * gatewayToml() for `upstream` and `config`.
 */
export async function startGateway({ upstream, config, maxBody, cmd = gatewayCommand(), toml }) {
  const dir = await mkdtemp(join(tmpdir(), 'sluice-gateway-'));
  const port = await freePort();
  let adminPort = await freePort();
  while (adminPort === port) adminPort = await freePort();
  const file = join(dir, 'sluice.toml');
  const listen = `127.0.0.1:${port}`;
  const adminListen = `127.0.0.1:${adminPort}`;
  await writeFile(file, toml ? toml({ listen, adminListen }) : gatewayToml({ listen, adminListen, upstream, config, maxBody }));
  const child = spawn('sh', ['-c', `exec ${cmd} --config "$1"`, 'sh', file], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { SLUICE_LOG: 'warn', ...process.env },
  });
  let log = '';
  child.stderr.on('data', (d) => {
    log += d;
    process.stderr.write(d);
  });
  const url = `http://127.0.0.1:${port}`;
  const admin = `http://127.0.0.1:${adminPort}`;
  const deadline = Date.now() + 30000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway exited with ${child.exitCode}: ${log}`);
    try {
      const r = await fetch(`${url}/sluice/sw.js`);
      if (r.ok) break;
    } catch (e) {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error('gateway did not serve /sluice/sw.js within 30 s');
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    admin,
    kind: 'gateway',
    /** The sluice_browser_* counters of the admin listener's /metrics. */
    telemetryTotals: async () => {
      const text = await (await fetch(`${admin}/metrics`)).text();
      const value = (name, labels = '') => {
        const re = new RegExp(`^${name}${labels.replace(/[{}"]/g, '\\$&')}\\s+([0-9.e+]+)`, 'm');
        const m = text.match(re);
        return m ? Number(m[1]) : 0;
      };
      return {
        batches: value('sluice_browser_telemetry_batches_total'),
        admitted: value('sluice_browser_admitted_total'),
        queued: value('sluice_browser_queued_total'),
        cancelled: value('sluice_browser_cancelled_total'),
        redispatched: value('sluice_browser_redispatched_total'),
        rejected: {
          queue_full: value('sluice_browser_rejected_total', '{reason="queue_full"}'),
          timeout: value('sluice_browser_rejected_total', '{reason="timeout"}'),
          limit: value('sluice_browser_rejected_total', '{reason="limit"}'),
        },
        // The wait series are in seconds; the workers report whole milliseconds.
        wait_ms_count: value('sluice_browser_queue_waits_total'),
        wait_ms_sum: Math.round(value('sluice_browser_queue_wait_seconds_total') * 1000),
        wait_ms_max: Math.round(value('sluice_browser_queue_wait_max_seconds') * 1000),
      };
    },
    /**
     * Rewrites the config file for `config` (the [browser] JSON) and sends SIGHUP; resolves once
     * /sluice/config.json serves it (so /sluice/sw.js has the new bytes).
     */
    reload: async (config) => {
      if (toml) throw new Error('reload() needs the config of gatewayToml()');
      await writeFile(file, gatewayToml({ listen, adminListen, upstream, config, maxBody }));
      child.kill('SIGHUP');
      const until = Date.now() + 10000;
      for (;;) {
        const served = await (await fetch(`${url}/sluice/config.json`)).json();
        if (served.capacity === config.capacity && served.rate === config.rate) return;
        if (Date.now() > until) throw new Error(`the gateway did not reload: ${JSON.stringify(served)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    close: async () => {
      child.kill('SIGTERM');
      await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

// === the browser ===

/** A fresh headless Chromium with its own profile. Returns { context, close() }. */
export async function launchBrowser() {
  const { chromium } = await import('playwright-core');
  return launchChromium(chromium, 'sluice-chromium-');
}

/** Opens a tab on the front's test page and waits until the worker controls it. */
export async function openTab(context, front, path = '/') {
  const page = context.pages().find((p) => p.url() === 'about:blank') || (await context.newPage());
  await page.goto(front.url + path);
  await page.evaluate(async () => {
    const { register } = await import('/sluice/client.js');
    await register();
  });
  return page;
}

/**
 * In `page`: fires `perSecond` requests per second for `durationMs` at `${path}${i}` (on a
 * schedule, not waiting for answers), then waits for every answer. Returns one result per
 * request: { i, status, start, ms, retryAfter, reason, limiter }, times in ms from the first.
 */
export function fire(page, { path, perSecond, durationMs, init = {} }) {
  return page.evaluate(
    async ({ path, perSecond, durationMs, init }) => {
      const n = Math.round((perSecond * durationMs) / 1000);
      const t0 = performance.now();
      const all = [];
      for (let i = 0; i < n; i++) {
        const due = t0 + (i * 1000) / perSecond;
        const delay = due - performance.now();
        if (delay > 0) await new Promise((r) => setTimeout(r, delay));
        const start = performance.now();
        all.push(
          fetch(`${path}${i}`, { cache: 'no-store', ...init })
            .then(async (r) => {
              const ms = performance.now() - start;
              let reason = null;
              if (r.status === 429) reason = (await r.json()).reason;
              else await r.text();
              return {
                i,
                status: r.status,
                start: start - t0,
                ms,
                retryAfter: r.headers.get('retry-after'),
                reason,
                limiter: r.headers.get('x-sluice-limiter'),
              };
            })
            // A network error, before the head or while the body is read (a worker stopped
            // mid-response), is status 0.
            .catch((e) => ({ i, status: 0, start: start - t0, ms: performance.now() - start, error: String(e) })),
        );
      }
      return Promise.all(all);
    },
    { path, perSecond, durationMs, init },
  );
}

/** The worker's own view: GET /sluice/state, answered by the worker. */
export function workerState(page) {
  return page.evaluate(async () => (await fetch('/sluice/state', { cache: 'no-store' })).json());
}

/** Stops every Service Worker of the browser through CDP, as the browser does to an idle worker. */
export async function stopWorkers(page) {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('ServiceWorker.enable');
  await cdp.send('ServiceWorker.stopAllWorkers');
  await cdp.detach();
}

/** A test config: the README's defaults with `overrides` (shallow, plus `queue`). */
export function testConfig(overrides = {}) {
  return {
    path_prefixes: ['/api/'],
    algorithm: 'token_bucket',
    capacity: 10,
    rate: '1/s',
    max_queued_body_bytes: 65536,
    persist: true,
    persist_debounce_ms: 150,
    telemetry: { endpoint: '/v1/telemetry', interval_ms: 1000, sample: 1.0 },
    fail: 'open',
    pace_from_server: false,
    ...overrides,
    queue: { depth: 100, max_wait_ms: 10000, ...(overrides.queue || {}) },
  };
}

/**
 * Starts upstream (`upstream`, else a `startUpstream()`), front (the gateway accepting bodies
 * up to `maxBody`, if given) and browser; `close()` stops all three.
 */
export async function setup(config, { upstream, maxBody } = {}) {
  upstream = upstream || (await startUpstream());
  const front = await startFront({ upstream, config, maxBody });
  const browser = await launchBrowser();
  return {
    upstream,
    front,
    context: browser.context,
    close: async () => {
      await browser.close();
      await front.close();
      await upstream.close();
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}
