// The paced client against stand-in servers on loopback (test/standin.mjs), in real time: 8
// workers per provider style, the hidden limit changed mid-run; then 3 Node processes on one
// Redis pacing as one client. Bounds have margins for a loaded 2-core machine (a share of the
// hidden rate of at least 0.75 in each phase: a client that did not follow a doubled rate
// would get 0.5; one that did not follow a halved one would get 429s); each test prints its
// figures.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { paced } from '../src/index.js';
import { standIn, drive, tally } from './standin.mjs';
import { PACKAGE, freePort, missing, sluiceBin, startRedis, which } from './support.mjs';

const WINDOW = 2000;
const PHASE = 6000;

// Each style: the limit before and after the change (up for two, down for two), and for the
// token styles a token limit tighter than the request limit (100 tokens a request).
const STYLES = [
  { style: 'ietf', before: 20, after: 40 },
  { style: 'openai', before: 30, after: 15, tokens: (n) => n * 50 },
  { style: 'anthropic', before: 20, after: 40, tokens: (n) => n * 50 },
  { style: 'github', before: 30, after: 15, skewMs: 45000 },
];

/** Allowed answers in `ms` at `limit` per window: the sustained rate (a full bucket's burst aside). */
const allowed = (limit, ms) => (limit * ms) / WINDOW;

for (const { style, before, after, tokens, skewMs = 0 } of STYLES) {
  test(`8 workers against a ${style}-style server follow its limit, and its change mid-run`, { timeout: 60000 }, async () => {
    const server = await standIn({ style, limit: before, windowMs: WINDOW, tokens: tokens?.(before), skewMs });
    const f = paced(fetch, { usage: 'openai' });
    const send = async () => {
      // A token request declares 150 and uses 100: reconciled from the JSON usage.
      const r = await f(server.url, { headers: { 'x-use-tokens': '100' }, cost: { tokens: 150 } });
      await r.arrayBuffer();
      return r.status;
    };
    const changed = setTimeout(() => server.setLimit(after, tokens?.(after)), PHASE);
    try {
      const log = await drive(send, { workers: 8, ms: 2 * PHASE });
      // The binding limit per phase: requests, or tokens (100 a request) when tighter.
      const binding = (n) => Math.min(n, tokens ? tokens(n) / 100 : n);
      // Steady state of each phase: after the first window of it.
      const p1 = tally(log, WINDOW, PHASE);
      const p2 = tally(log, PHASE + WINDOW, 2 * PHASE);
      const all = tally(log);
      const share1 = p1.ok / allowed(binding(before), PHASE - WINDOW);
      const share2 = p2.ok / allowed(binding(after), PHASE - WINDOW);
      console.log(`${style}: ${all.ok} ok, ${all.limited} 429s in ${2 * PHASE} ms; share of the hidden rate ${share1.toFixed(3)} at ${binding(before)}/${WINDOW} ms, ${share2.toFixed(3)} after the change to ${binding(after)}/${WINDOW} ms`);
      assert.ok(all.limited <= 2, `${all.limited} 429s`);
      assert.ok(share1 >= 0.75 && share1 <= 1.25, `before: ${share1}`);
      assert.ok(share2 >= 0.75 && share2 <= 1.25, `after: ${share2}`);
    } finally {
      clearTimeout(changed);
      await server.close();
    }
  });
}

test('3 Node processes on one Redis pace as one client', { timeout: 90000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const limit = 30;
  const server = await standIn({ style: 'ietf', limit, windowMs: WINDOW });
  const ms = 10000;
  try {
    const runs = await Promise.all([0, 1, 2].map((i) => new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [join(PACKAGE, 'test', 'pace-worker.mjs'), redis.url, server.url, String(ms), 'fleet'], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      child.stdout.on('data', (d) => { out += d; });
      child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`worker ${i} exited ${code}`))));
    })));
    const ok = runs.reduce((n, r) => n + r.ok, 0);
    const limited = runs.reduce((n, r) => n + r.limited, 0);
    // The server's own count is the truth, against what its bucket allowed from its first
    // admission to its last: the burst, and the refill in between.
    const span = server.stats.lastAt - server.stats.firstAt;
    const share = server.stats.ok / (limit + allowed(limit, span));
    console.log(`3 processes, 8 workers each, one Redis: ${ok} ok (${runs.map((r) => r.ok).join(' + ')}), ${limited} 429s; ${(share * 100).toFixed(1)} % of what the bucket allowed in ${Math.round(span)} ms (a burst of ${limit} and ${limit}/${WINDOW} ms)`);
    assert.equal(ok, server.stats.ok);
    assert.ok(limited <= 2, `${limited} 429s`);
    assert.ok(share >= 0.75 && share <= 1.0, `share ${share}`);
    assert.ok(runs.every((r) => r.ok > 0), 'every process was served');
  } finally {
    await server.close();
    await redis.close();
  }
});

/** A `sluice serve` config: one policy (gcra, `capacity`, `rate`) on every path, the demo upstream. */
function gatewayConfig(listen, admin, capacity, rate) {
  return [
    '[server]', `listen = "127.0.0.1:${listen}"`, `admin_listen = "127.0.0.1:${admin}"`, 'workers = 1',
    '[[policy]]', 'name = "api"', 'algorithm = "gcra"', `capacity = ${capacity}`, `rate = "${rate}"`,
    '[[route]]', 'path_prefix = "/"', 'policies = ["api"]', 'upstream = "builtin:demo"', '',
  ].join('\n');
}

test('8 workers against sluice serve follow its RateLimit fields, and a reload that doubles the rate', { timeout: 90000 }, async (t) => {
  const bin = sluiceBin();
  if (!bin) return missing(t, 'the sluice binary (cargo build -p sluice-server --bin sluice; SLUICE_BIN)');
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-pacing-'));
  const [listen, admin] = [await freePort(), await freePort()];
  const config = join(dir, 'sluice.toml');
  // 20 a burst and 10/s (RateLimit-Policy: "api";q=20;w=2), then 20/s after a SIGHUP reload.
  await writeFile(config, gatewayConfig(listen, admin, 20, '10/s'));
  const gateway = spawn(bin, ['serve', '--config', config], { stdio: ['ignore', 'ignore', 'inherit'] });
  try {
    const deadline = Date.now() + 30000;
    while (!(await fetch(`http://127.0.0.1:${admin}/healthz`).then((r) => r.ok, () => false))) {
      if (Date.now() > deadline || gateway.exitCode !== null) throw new Error('sluice serve did not start');
      await new Promise((r) => setTimeout(r, 100));
    }
    const f = paced(fetch);
    const url = `http://127.0.0.1:${listen}/api/hello`;
    const send = async () => {
      const r = await f(url);
      await r.arrayBuffer();
      return r.status;
    };
    const reload = setTimeout(async () => {
      await writeFile(config, gatewayConfig(listen, admin, 20, '20/s'));
      gateway.kill('SIGHUP');
    }, PHASE);
    let log;
    try {
      log = await drive(send, { workers: 8, ms: 2 * PHASE });
    } finally {
      clearTimeout(reload);
    }
    const p1 = tally(log, WINDOW, PHASE);
    const p2 = tally(log, PHASE + WINDOW, 2 * PHASE);
    const all = tally(log);
    const share1 = p1.ok / ((10 * (PHASE - WINDOW)) / 1000);
    const share2 = p2.ok / ((20 * (PHASE - WINDOW)) / 1000);
    const state = await f.pacer.state();
    console.log(`sluice serve: ${all.ok} ok, ${all.limited} 429s in ${2 * PHASE} ms; share of the rate ${share1.toFixed(3)} at 10/s, ${share2.toFixed(3)} after the reload to 20/s; last read ${JSON.stringify(state.limits['ietf:api'])}`);
    assert.ok(all.limited <= 2, `${all.limited} 429s`);
    assert.ok(share1 >= 0.75 && share1 <= 1.25, `before: ${share1}`);
    assert.ok(share2 >= 0.75 && share2 <= 1.25, `after: ${share2}`);
  } finally {
    gateway.kill('SIGTERM');
    await new Promise((r) => (gateway.exitCode !== null ? r() : gateway.once('exit', r)));
    await rm(dir, { recursive: true, force: true });
  }
});

test('processes whose clocks disagree read one reset from Redis, on Redis\'s clock', { timeout: 30000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server');
  const redis = await startRedis();
  const { createClient } = await import('redis');
  const { RedisPacerStore } = await import('../src/redis.js');
  const client = await createClient({ url: redis.url }).connect();
  // A GitHub-style server whose clock is 45 s ahead: a window of 60 per 60 s.
  const server = await standIn({ style: 'github', limit: 60, windowMs: 60000, skewMs: 45000 });
  try {
    // Two processes' pacers: one whose wall clock is right, one whose clock is 30 s behind.
    const store = () => new RedisPacerStore({ client, key: 'pace:skew' });
    const right = paced(fetch, { store: store() });
    const behind = paced(fetch, { store: store(), wallNow: () => Date.now() - 30000 });
    // Resets are compared as instants (the look's time plus the time left): the second request
    // is paced, so it goes a second or so after the first.
    await (await right(server.url)).arrayBuffer();
    const first = (await right.pacer.state()).limits['github:core'];
    const firstAt = Date.now();
    await (await behind(server.url)).arrayBuffer();
    const a = (await right.pacer.state()).limits['github:core'];
    const aAt = Date.now();
    const b = (await behind.pacer.state()).limits['github:core'];
    console.log(`one reset in Redis: ${Math.round(first.resetInMs)} ms after the first answer; read by both: ${Math.round(a.resetInMs)} and ${Math.round(b.resetInMs)} ms; skews measured ${(await right.pacer.state()).skewMs} and ${(await behind.pacer.state()).skewMs} ms`);
    // One state: both see the same limit, the same reset (Redis's clock: the two looks are a
    // few ms apart), 2 requests spent.
    assert.ok(Math.abs(a.resetInMs - b.resetInMs) < 100, `${a.resetInMs} and ${b.resetInMs}`);
    assert.equal(a.remaining, 58);
    // The reset is the server's window end: the 30 s the second clock is off do not enter.
    const drift = (aAt + a.resetInMs) - (firstAt + first.resetInMs);
    assert.ok(Math.abs(drift) < 1500, `the reset moved by ${drift} ms`);
    assert.ok(first.resetInMs > 0 && first.resetInMs <= 61000, `${first.resetInMs}`);
  } finally {
    await client.quit();
    await server.close();
    await redis.close();
  }
});
