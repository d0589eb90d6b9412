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

/**
 * Serves `dir` read-only on a free port of 127.0.0.1: { url, close() }. `headers` go on the
 * page at / (a Content-Security-Policy, say).
 */
export function serveStatic(dir, headers = {}) {
  const server = http.createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
    const file = join(dir, path);
    if (!file.startsWith(dir + sep) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    if (path === '/') {
      res.writeHead(200, { 'content-type': 'text/html', ...headers }).end('<!doctype html><title>sluice-limits</title>');
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

/** Whether `port` on 127.0.0.1 is free now. */
function portFree(port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

/** A free port whose Cluster bus port (+10000) is free too. */
async function freeClusterPort() {
  for (;;) {
    const port = await freePort();
    if (port < 55000 && await portFree(port + 10000)) return port;
  }
}

/**
 * A redis-server on a free port, in a temporary folder: { port, url, close() }. With
 * `cluster`, a Cluster node (its bus port free too), not yet joined.
 */
export async function startRedis({ cluster = false } = {}) {
  const port = cluster ? await freeClusterPort() : await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-redis-'));
  const args = [
    '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
    '--protected-mode', 'no', '--dir', dir,
  ];
  if (cluster) args.push('--cluster-enabled', 'yes', '--cluster-node-timeout', '5000', '--cluster-config-file', join(dir, 'nodes.conf'));
  const child = spawn('redis-server', args, { stdio: 'ignore' });
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

/** redis-cli against 127.0.0.1:`port`: its output. */
export function redisCli(port, ...args) {
  const r = spawnSync('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`redis-cli ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/**
 * A Redis Cluster of three masters, every slot assigned (as crates/sluice/tests do it: three
 * `redis-server --cluster-enabled yes` joined by `redis-cli --cluster create`), once every
 * node says cluster_state:ok: { nodes: [{ port, url }], close() }.
 */
export async function startRedisCluster() {
  const nodes = [];
  try {
    while (nodes.length < 3) {
      const node = await startRedis({ cluster: true });
      if (nodes.some((n) => n.port === node.port)) await node.close();
      else nodes.push(node);
    }
    const create = spawnSync('redis-cli', [
      '--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes',
    ], { encoding: 'utf8', timeout: 60000 });
    if (create.status !== 0) throw new Error(`redis-cli --cluster create failed:\n${create.stdout}${create.stderr}`);
    const deadline = Date.now() + 30000;
    while (!nodes.every((n) => redisCli(n.port, 'CLUSTER', 'INFO').includes('cluster_state:ok'))) {
      if (Date.now() > deadline) throw new Error('cluster_state:ok not reached in 30 s');
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (e) {
    await Promise.all(nodes.map((n) => n.close()));
    throw e;
  }
  return { nodes, close: () => Promise.all(nodes.map((n) => n.close())) };
}

/** The sluice binary: $SLUICE_BIN, else this checkout's debug build if present. */
export function sluiceBin() {
  const bin = process.env.SLUICE_BIN || join(process.env.CARGO_TARGET_DIR || join(ROOT, 'target'), 'debug', 'sluice');
  return existsSync(bin) ? bin : null;
}
