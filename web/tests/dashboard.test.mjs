// The gateway's live dashboard under load: the real `sluice serve` in front of a
// real upstream, loaded by the real `sluice stress`; the dashboard is opened in headless
// Chromium, its figures must move while the load runs, it must fetch nothing from elsewhere,
// and a screenshot is saved to web/test-results/dashboard.png.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { freePort, launchBrowser, ROOT, sleep, startUpstream, WEB } from './harness.mjs';

/** The `sluice` binary of this checkout, built (debug) if needed. */
function sluiceBinary() {
  const r = spawnSync('cargo', ['build', '-p', 'sluice-server', '--bin', 'sluice'], { cwd: ROOT, stdio: 'inherit' });
  if (r.status !== 0) throw new Error('cargo build of the sluice binary failed');
  const target = process.env.CARGO_TARGET_DIR || join(ROOT, 'target');
  const bin = join(target, 'debug', 'sluice');
  if (!existsSync(bin)) throw new Error(`no ${bin}`);
  return bin;
}

function config({ port, adminPort, upstream }) {
  return `
[server]
listen = "127.0.0.1:${port}"
admin_listen = "127.0.0.1:${adminPort}"

[[policy]]
name = "api"
algorithm = "token_bucket"
capacity = 8
rate = "4/s"
key = "header:X-Api-Key"
queue = { depth = 3, max_wait = "400ms" }

[[policy]]
name = "everyone"
algorithm = "gcra"
capacity = 100
rate = "50/s"
key = "global"
concurrency = 64

[[route]]
path_prefix = "/api/"
policies = ["api", "everyone"]
upstream = "${upstream.url}"

[[route]]
path_prefix = "/"
upstream = "${upstream.url}"
`;
}

async function startGateway(bin, upstream) {
  const dir = await mkdtemp(join(tmpdir(), 'sluice-dashboard-'));
  const port = await freePort();
  const adminPort = await freePort();
  const file = join(dir, 'sluice.toml');
  await writeFile(file, config({ port, adminPort, upstream }));
  const child = spawn(bin, ['serve', '--config', file], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, SLUICE_LOG: 'warn' },
  });
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const admin = `http://127.0.0.1:${adminPort}`;
  const deadline = Date.now() + 20000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`sluice serve exited with ${child.exitCode}: ${log}`);
    try {
      if ((await fetch(`${admin}/healthz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`sluice serve not ready: ${log}`);
    await sleep(50);
  }
  return {
    url: `http://127.0.0.1:${port}`,
    admin,
    close: async () => {
      child.kill('SIGTERM');
      await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** `sluice stress` for one key; resolves with its JSON summary. */
function stress(bin, url, key, { rate, duration }) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['stress', url, '--rate', String(rate), '--duration', duration, '--header', `X-Api-Key: ${key}`, '--json'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.on('error', reject);
    // 'close', not 'exit': the exit can be reported before stdout has been read to its end.
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`sluice stress exited with ${code}`));
      try {
        resolve(JSON.parse(out));
      } catch (e) {
        reject(new Error(`sluice stress printed no JSON summary (${e.message}): ${JSON.stringify(out)}`));
      }
    });
  });
}

/** What the page shows for one policy card. */
function readCard(page, name) {
  return page.evaluate((name) => {
    const card = document.querySelector(`article[data-policy="${name}"]`);
    if (!card) return null;
    const text = (sel) => card.querySelector(sel).textContent;
    return {
      admitted: Number(card.dataset.admitted),
      denied: Number(card.dataset.denied),
      admittedRate: text('.value.admittedRate'),
      deniedRate: text('.value.deniedRate'),
      keys: [...card.querySelectorAll('tr.key-row td.key')].map((td) => td.textContent),
      levels: [...card.querySelectorAll('tr.key-row .bar > span')].map((s) => s.style.width),
      reasons: text('.reasons'),
    };
  }, name);
}

test('dashboard: live figures under load, offline, with a screenshot', { timeout: 120000 }, async (t) => {
  const bin = sluiceBinary();
  const upstream = await startUpstream();
  const gateway = await startGateway(bin, upstream);
  const browser = await launchBrowser();
  const requests = [];
  const problems = [];
  try {
    const page = browser.context.pages()[0] || (await browser.context.newPage());
    await page.setViewportSize({ width: 1440, height: 1100 });
    page.on('request', (r) => requests.push(r.url()));
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
    await page.goto(`${gateway.admin}/dashboard`);
    await page.waitForFunction(() => window.sluiceDashboard && window.sluiceDashboard.polls >= 1, null, { timeout: 10000 });
    const idle = await readCard(page, 'api');
    assert.equal(idle.admitted, 0);
    assert.equal(await page.textContent('#status').then((s) => s.startsWith('live')), true);

    // Load: three keys at 10/s each for 8 s, beyond the per-key 4/s.
    const load = ['alice-key-0001', 'bob-key-0002', 'carol-key-0003'].map((key) => stress(bin, `${gateway.url}/api/items`, key, { rate: 10, duration: '8s' }));
    await sleep(3000);
    const early = await readCard(page, 'api');
    await sleep(2500);
    const later = await readCard(page, 'api');
    t.diagnostic(JSON.stringify({ early, later }));
    assert.ok(early.admitted > 0, `admitted shown: ${JSON.stringify(early)}`);
    assert.ok(later.admitted > early.admitted, 'the admitted count moves');
    assert.ok(later.denied > early.denied, 'the denied count moves');
    assert.ok(Number(later.admittedRate) > 0, `an admitted rate: ${later.admittedRate}`);
    assert.ok(Number(later.deniedRate) > 0, `a denied rate: ${later.deniedRate}`);
    assert.match(later.reasons, /timeout|queue_full/);
    assert.equal(later.keys.length, 3, `three hot keys: ${later.keys}`);
    for (const k of later.keys) assert.match(k, /^.{1,4}\u2026#[0-9a-f]{6}$/, `keys are masked: ${k}`);
    assert.ok(later.levels.every((w) => /%$/.test(w)));
    const tiles = await page.evaluate(() => ({
      admitted: document.getElementById('t-admitted-rate').textContent,
      denied: document.getElementById('t-denied-rate').textContent,
    }));
    assert.ok(Number(tiles.admitted) > 0 && Number(tiles.denied) > 0, JSON.stringify(tiles));

    mkdirSync(join(WEB, 'test-results'), { recursive: true });
    const shot = join(WEB, 'test-results', 'dashboard.png');
    await page.screenshot({ path: shot, fullPage: true });
    t.diagnostic(`screenshot: ${shot}`);

    // The page's totals and the load tool's agree once the load is over.
    const reports = await Promise.all(load);
    const sent2xx = reports.reduce((n, r) => n + r.admitted, 0);
    await page.waitForFunction(
      (n) => Number(document.querySelector('article[data-policy="api"]').dataset.admitted) === n,
      sent2xx,
      { timeout: 5000 },
    );
    assert.equal(upstream.hitsFor('/api/items').length, sent2xx);

    // Browser telemetry (sluice_browser_*) is listed when /v1/stats carries it: the gateway
    // has none here, so add two series to its real answers.
    let tick = 0;
    await page.route('**/v1/stats', async (route) => {
      const response = await route.fetch();
      const json = await response.json();
      tick += 1;
      json.browser = [
        { name: 'sluice_browser_admitted_total', labels: {}, value: 100 + 10 * tick },
        { name: 'sluice_browser_rejected_total', labels: { reason: 'limit' }, value: 3 },
      ];
      await route.fulfill({ response, json });
    });
    await page.waitForFunction(() => document.querySelectorAll('#browser tr.browser-row').length === 2, null, { timeout: 5000 });
    await page.waitForFunction(() => /\/s$/.test(document.querySelector('#browser tr.browser-row td:last-child').textContent), null, { timeout: 5000 });
    const rows = await page.$$eval('#browser tr.browser-row', (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    t.diagnostic(JSON.stringify(rows));
    assert.equal(rows[0][0], 'admitted_total');
    assert.ok(Number(rows[0][2]) >= 110);
    assert.ok(Number(rows[0][3].replace('/s', '')) > 0, 'a rate for a counter');
    assert.deepEqual(rows[1].slice(0, 3), ['rejected_total', 'reason=limit', '3']);
    await page.unroute('**/v1/stats');

    // Job queues ([jobs]) are shown when /v1/stats names some, read from /v1/jobs: the gateway
    // has none here (crates/sluice-server/tests/jobs_dashboard.rs reads real ones), so name
    // one and answer /v1/jobs with two of its three groups.
    const figures = (waiting, delayed, active, dead, completed, failed, retried) => ({ waiting, delayed, active, dead, completed, failed, retried, dead_lettered: dead, reclaimed: 0 });
    const jobsDoc = {
      v: 1,
      prefix: 'sluice:jobs',
      redis: 'jobs.redis',
      interval_ms: 100,
      queues: [
        {
          name: 'mail',
          error: null,
          groups_total: 3,
          groups: [
            { group: 'acme', ...figures(0, 1, 0, 1, 2, 2, 1), paused_ms: 0 },
            { group: 'zeta', ...figures(2, 0, 1, 0, 0, 0, 0), paused_ms: 0 },
          ],
          total: figures(2, 1, 1, 1, 2, 2, 1),
        },
      ],
    };
    await page.route('**/v1/stats', async (route) => {
      const response = await route.fetch();
      const json = await response.json();
      json.jobs = { queues: ['mail'], interval_ms: 100 };
      await route.fulfill({ response, json });
    });
    await page.route('**/v1/jobs', (route) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(jobsDoc) }));
    await page.waitForFunction(() => !document.getElementById('jobs').hidden && document.querySelectorAll('#jobs tr.job-row').length === 2, null, { timeout: 10000 });
    const jobRows = await page.$$eval('#jobs tr.job-row, #jobs tr.job-total', (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    t.diagnostic(JSON.stringify(jobRows));
    assert.deepEqual(jobRows, [
      ['acme', '0', '1', '0', '1', '2', '2', '1'],
      ['zeta', '2', '0', '1', '0', '0', '0', '0'],
      ['all shown', '2', '1', '1', '1', '2', '2', '1'],
    ]);
    assert.match(await page.textContent('#jobs'), /queue mail[\s\S]*1 more groups not shown/);
    await page.screenshot({ path: join(WEB, 'test-results', 'dashboard-jobs.png'), fullPage: true });
    await page.unroute('**/v1/stats');
    await page.unroute('**/v1/jobs');
    await page.waitForFunction(() => document.getElementById('jobs').hidden, null, { timeout: 5000 });

    // Nothing but this page and its data endpoint, all from the admin listener.
    const foreign = requests.filter((u) => !u.startsWith(gateway.admin + '/'));
    assert.deepEqual(foreign, []);
    assert.ok(requests.some((u) => u.endsWith('/v1/stats')));
    assert.ok(requests.some((u) => u.endsWith('/v1/jobs')));
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
    await gateway.close();
    await upstream.close();
  }
});
