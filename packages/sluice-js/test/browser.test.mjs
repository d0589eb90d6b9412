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

test('Chromium: a page whose CSP lacks \'wasm-unsafe-eval\' is told what to add; with it, ready() and sync compilation work', { timeout: 120000 }, async (t) => {
  if (!existsSync(CHROMIUM)) return missing(t, `chromium (${CHROMIUM})`);
  const strict = await serveStatic(PACKAGE, { 'content-security-policy': "script-src 'self'" });
  const allowed = await serveStatic(PACKAGE, { 'content-security-policy': "script-src 'self' 'wasm-unsafe-eval'" });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    await page.goto(`${strict.url}/`);
    const refused = await page.evaluate(async () => {
      try {
        const m = await import('/src/index.js');
        new m.RateLimiter({ capacity: 1, rate: '1/s' });
        return 'no error';
      } catch (e) {
        return String(e && e.message);
      }
    });
    t.diagnostic(`without 'wasm-unsafe-eval': ${refused}`);
    assert.match(refused, /'wasm-unsafe-eval'/, 'the error names what to add to the policy');
    await page.goto(`${allowed.url}/`);
    const works = await page.evaluate(async () => {
      const m = await import('/src/index.js');
      await m.ready();
      const l = new m.RateLimiter({ capacity: 2, rate: '1/s' });
      return [l.tryAcquire(), l.tryAcquire(), l.tryAcquire(), m.keyHash('Jefe', 'what do ya want for nothing?')];
    });
    assert.deepEqual(works, [true, true, false, '5bdcc146bf60754e6a042426089575c7']);
  } finally {
    await browser.close();
    await strict.close();
    await allowed.close();
  }
});
