// What the Node-side tests share: the CI rule for missing tools, free ports, a static server
// for the package folder, Chromium, redis-server and the sluice binary.

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, extname, join, normalize, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

import { launchChromium } from '../../../scripts/chromium.mjs';

export const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), '..');
export const ROOT = join(PACKAGE, '..', '..');
export const CI = process.env.CI === 'true';
export { CHROMIUM } from '../../../scripts/chromium.mjs';

/** A test's tool is missing: fail under CI=true, else skip with a message naming it. */
export function missing(t, tool) {
  const message = `${tool} missing`;
  if (CI) throw new Error(`${message}; CI=true, so this fails instead of skipping`);
  t.skip(`skipped: ${message}`);
}

export function which(cmd) {
  return spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;
}

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const TYPES = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.html': 'text/html', '.json': 'application/json' };

/** Serves `dir` read-only on a free port of 127.0.0.1: { url, close() }. */
export function serveStatic(dir) {
  const server = http.createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
    const file = join(dir, path);
    if (!file.startsWith(dir + sep) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    if (path === '/') {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>sluice-limits</title>');
      return;
    }
    res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream' });
    res.end(readFileSync(file));
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
      });
    });
  });
}

/** A fresh headless Chromium with its own profile. Returns { context, close() }. */
export async function launchBrowser() {
  const { chromium } = await import('playwright-core');
  return launchChromium(chromium, 'sluice-js-chromium-');
}

/** A redis-server on a free port, in a temporary folder: { port, url, close() }. */
export async function startRedis() {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-redis-'));
  const child = spawn('redis-server', [
    '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
    '--protected-mode', 'no', '--dir', dir,
  ], { stdio: 'ignore' });
  const deadline = Date.now() + 10000;
  for (;;) {
    const up = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.end(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`redis-server did not start on port ${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    close: async () => {
      child.kill('SIGTERM');
      await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** The sluice binary: $SLUICE_BIN, else this checkout's debug build if present. */
export function sluiceBin() {
  const bin = process.env.SLUICE_BIN || join(process.env.CARGO_TARGET_DIR || join(ROOT, 'target'), 'debug', 'sluice');
  return existsSync(bin) ? bin : null;
}
