// `sluice bundle`: the browser limiter as static files, served by a plain static host
// (python3 -m http.server) with no gateway at all. A burst is limited as the [browser] table
// says, the queue admits one waiter, and the bucket survives a worker restart. The command's
// errors: a bad field (exit 2, file:line: field), no [browser] (2), an unwritable DIR (1).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'node:test';

import { buildServiceWorker, prefix } from '../build-sw.mjs';
import { fire, launchBrowser, sleep, stopWorkers, WEB, workerState } from './harness.mjs';
import { bundle, bundleFrom, startStaticHost, tempDir } from './static-host.mjs';

const SW_SOURCE = readFileSync(join(WEB, 'sw.js'), 'utf8');

/** The embedded module, read back from a bundled worker's third line. */
function moduleOf(script) {
  const m = /^self\.__SLUICE_WASM__ = .*\("([A-Za-z0-9+/=]+)"\);$/m.exec(script);
  return Buffer.from(m[1], 'base64');
}

test('sluice bundle writes the worker, its import forms, the client and the config; its errors', async () => {
  const tmp = await tempDir();
  try {
    // Without --config: the embedded defaults.
    const out = join(tmp.dir, 'defaults');
    const r = bundle(['--out', out]);
    assert.equal(r.status, 0, r.stderr);
    const read = (name) => readFileSync(join(out, name), 'utf8');
    const config = JSON.parse(read('sluice-config.json'));
    assert.deepEqual(config, JSON.parse(readFileSync(join(WEB, 'sluice.config.json'), 'utf8')));
    const sw = read('sluice-sw.js');
    // The served /sluice/sw.js contract: the three-line prefix, then web/sw.js unchanged.
    assert.ok(sw.endsWith(SW_SOURCE));
    const head = sw.slice(0, sw.length - SW_SOURCE.length);
    const lines = head.split('\n');
    assert.equal(lines.length, 4);
    const configLine = /^self\.__SLUICE_CONFIG__ = (.*);$/.exec(lines[1]);
    assert.deepEqual(JSON.parse(configLine[1]), config);
    const wasm = moduleOf(sw);
    assert.deepEqual(wasm, readFileSync(join(WEB, '..', 'crates', 'sluice-server', 'wasm', 'sluice_wasm.wasm')));
    assert.equal(head, prefix(wasm, config).split('\n')[0] + '\n' + lines.slice(1).join('\n'));
    assert.equal(read('sluice-sw-import.js'), head + 'self.__SLUICE_MODE__ = "import";\n' + SW_SOURCE);
    assert.equal(read('sluice-sw.mjs'), read('sluice-sw-import.js') + '\nexport const sluice = self.sluice;\nexport default self.sluice;\n');
    // build-sw.mjs, the reference, writes the same forms (after the config line, whose JSON
    // spacing may differ).
    const afterConfig = (text) => text.split('\n').slice(2).join('\n');
    for (const [mode, name] of [['worker', 'sluice-sw.js'], ['import', 'sluice-sw-import.js'], ['module', 'sluice-sw.mjs']]) {
      assert.equal(afterConfig(buildServiceWorker({ wasm, config, mode })), afterConfig(read(name)), name);
    }
    assert.equal(read('sluice-client.js'), readFileSync(join(WEB, 'client.js'), 'utf8'));
    for (const name of ['sluice-sw.js', 'sluice-client.js', 'sluice-config.json']) assert.match(r.stdout, new RegExp(name));

    // A bad field: exit 2, every error with file, line and field, nothing written.
    const bad = join(tmp.dir, 'bad.toml');
    await writeFile(bad, '[browser]\ncapacity = 0\nrate = "fast"\n');
    const e = bundle(['--config', bad, '--out', join(tmp.dir, 'never')]);
    assert.equal(e.status, 2);
    assert.match(e.stderr, /bad\.toml:2:\d+: browser\.capacity: /);
    assert.match(e.stderr, /bad\.toml:3:\d+: browser\.rate: /);
    // No [browser] table: nothing to bundle.
    const none = join(tmp.dir, 'none.toml');
    await writeFile(none, '[store]\nbackend = "memory"\n');
    const n = bundle(['--config', none, '--out', join(tmp.dir, 'never')]);
    assert.equal(n.status, 2);
    assert.match(n.stderr, /none\.toml: browser: no \[browser\] table/);
    // An unwritable DIR (below a regular file): exit 1, naming it.
    const file = join(tmp.dir, 'a-file');
    await writeFile(file, '');
    const u = bundle(['--out', join(file, 'dir')]);
    assert.equal(u.status, 1);
    assert.match(u.stderr, /cannot create the directory .*a-file\/dir/);
  } finally {
    await tmp.remove();
  }
});

const TOML = `
[browser]
path_prefixes = ["/api/"]
capacity = 4
rate = "1/s"
queue = { depth = 2, max_wait = "1500ms" }
persist = true
persist_debounce = "50ms"
telemetry = false
`;

const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>an app on a static host</title>
<script type="module">
  import { register } from './sluice-client.js';
  window.sluiceReady = register({ url: '/sluice-sw.js', scope: '/' }).then(() => true);
</script>
`;

test('bundled files on a static host: a burst is limited, the queue admits, the bucket persists', { timeout: 60000 }, async (t) => {
  const tmp = await tempDir();
  const out = await bundleFrom(tmp.dir, TOML);
  await writeFile(join(out, 'index.html'), PAGE);
  const host = await startStaticHost(out);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(host.url + '/index.html');
    assert.equal(await page.evaluate(() => window.sluiceReady), true);
    const before = await workerState(page);
    assert.equal(before.disabled, null);
    assert.equal(before.config.capacity, 4);
    assert.equal(before.restored_from, 'install');

    // 4 at once from the bucket, the 5th waits about 1 s in the queue, the 6th would wait
    // 2 s > 1.5 s: 429 timeout, as would the rest.
    const burst = await fire(page, { path: '/api/burst/', perSecond: 1000, durationMs: 10 });
    const admitted = burst.filter((r) => r.status !== 429);
    const refused = burst.filter((r) => r.status === 429);
    t.diagnostic(`admitted ${admitted.map((r) => `${r.status}@${Math.round(r.ms)}ms`).join(' ')}; refused ${refused.length}`);
    assert.ok(admitted.every((r) => r.status === 404), 'the static host answered the admitted ones (404)');
    assert.ok(admitted.length >= 5 && admitted.length <= 6, `${admitted.length} admitted`);
    assert.equal(admitted.filter((r) => r.ms > 700).length, 1, 'one waited for the next token');
    assert.ok(refused.every((r) => r.limiter === 'browser' && r.reason === 'timeout' && Number(r.retryAfter) >= 1));
    assert.equal(host.requests('/api/burst/').length, admitted.length, 'each admitted request reached the host once');

    // A worker restart: the bucket comes back (nearly) empty from IndexedDB, no new burst.
    await sleep(300);
    await stopWorkers(page);
    const after = await fire(page, { path: '/api/after/', perSecond: 1000, durationMs: 10 });
    const state = await workerState(page);
    assert.notEqual(state.worker, before.worker, 'the worker restarted');
    assert.equal(state.restored_from, 'record');
    const again = after.filter((r) => r.status !== 429).length;
    t.diagnostic(`after the restart: ${again} of 10 admitted`);
    assert.ok(again <= 2, `${again} admitted right after the restart`);
  } finally {
    await browser.close();
    await host.close();
    await tmp.remove();
  }
});
