// The behaviour suite (suite.mjs) in headless Chromium: the package's files served from
// 127.0.0.1, imported by a page as ES modules (the wasm core compiled in the page).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';

import { tests } from './suite.mjs';
import { CHROMIUM, PACKAGE, launchBrowser, missing, serveStatic } from './support.mjs';

test('the behaviour suite passes in Chromium', { timeout: 120000 }, async (t) => {
  if (!existsSync(CHROMIUM)) return missing(t, `chromium (${CHROMIUM})`);
  const site = await serveStatic(PACKAGE);
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${site.url}/`);
    const results = await page.evaluate(async () => {
      const { tests } = await import('/test/suite.mjs');
      const out = [];
      for (const { name, fn } of tests) {
        try {
          // A hang is a failure too, named, rather than a stuck page.
          await Promise.race([
            fn(),
            new Promise((_, reject) => setTimeout(() => reject(new Error('no result within 20 s')), 20000)),
          ]);
          out.push({ name, ok: true });
        } catch (e) {
          out.push({ name, ok: false, error: String(e && e.stack || e) });
        }
      }
      return out;
    });
    const failed = results.filter((r) => !r.ok);
    assert.deepEqual(failed, [], 'every test of the suite passes in Chromium');
    assert.equal(results.length, tests.length, 'Chromium ran the whole suite');
    t.diagnostic(`${results.length} behaviour tests passed in Chromium`);
  } finally {
    await browser.close();
    await site.close();
  }
});
