// The gateway sends the browser files compressed (br for Chromium, which accepts it): the
// worker still installs and controls the page, the scripts decode to the plain bytes, and the
// bytes a page downloads for sluice (sw.js + client.js) are reported as Chromium counts them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { openTab, setup, testConfig, WEB, workerState } from './harness.mjs';

test('compressed assets: the worker installs; sw.js and client.js arrive as br', { timeout: 60000 }, async (t) => {
  const env = await setup(testConfig({ capacity: 5 }));
  try {
    const page = await openTab(env.context, env.front);
    const state = await workerState(page);
    assert.equal(state.disabled, null);
    assert.equal(state.capacity, 5);
    const files = await page.evaluate(async () => {
      const out = {};
      for (const path of ['/sluice/sw.js', '/sluice/client.js', '/sluice/sw-import.js']) {
        const r = await fetch(path, { cache: 'no-store' });
        const text = await r.text();
        const entry = performance.getEntriesByName(new URL(path, location.href).href).at(-1);
        out[path] = {
          encoding: r.headers.get('content-encoding'),
          vary: r.headers.get('vary'),
          cache: r.headers.get('cache-control'),
          text,
          encoded: entry.encodedBodySize,
          decoded: entry.decodedBodySize,
        };
      }
      return out;
    });
    const sw = readFileSync(join(WEB, 'sw.js'), 'utf8');
    for (const [path, f] of Object.entries(files)) {
      assert.equal(f.encoding, 'br', path);
      assert.equal(f.vary, 'Accept-Encoding', path);
      assert.equal(f.cache, 'no-cache', path);
      assert.equal(f.decoded, Buffer.byteLength(f.text), path);
      assert.ok(f.encoded < f.decoded / 2, `${path}: ${f.encoded} of ${f.decoded}`);
    }
    assert.ok(files['/sluice/sw.js'].text.endsWith(sw));
    assert.equal(files['/sluice/client.js'].text, readFileSync(join(WEB, 'client.js'), 'utf8'));
    const total = files['/sluice/sw.js'].encoded + files['/sluice/client.js'].encoded;
    const plain = files['/sluice/sw.js'].decoded + files['/sluice/client.js'].decoded;
    t.diagnostic(`sw.js + client.js: ${total} bytes br (${plain} plain)`);
  } finally {
    await env.close();
  }
});
