// The worker paces by the npm package's rules, not a second definition of them: its copies in
// web/sw/ are the package's files (web/gen-pacing.mjs), and the bundled worker holds them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { CLIENT, clientWith, COPIES, copyPath, generated } from '../gen-pacing.mjs';
import { WEB } from './harness.mjs';

test('web/sw/*.generated.js are the package\'s headers.js and pacing.js (node web/gen-pacing.mjs)', () => {
  for (const copy of COPIES) {
    assert.equal(readFileSync(copyPath(copy), 'utf8'), generated(copy), `web/sw/${copy.to} is stale: run node web/gen-pacing.mjs`);
  }
});

test('the bundled worker holds the copies', () => {
  const sw = readFileSync(join(WEB, 'sw.js'), 'utf8');
  for (const copy of COPIES) assert.ok(sw.includes(`// === web/sw/${copy.to} ===\n`), copy.to);
  assert.match(sw, /\nfunction admit\(state, now, cost = \{\}\) \{\n/);
  assert.match(sw, /\nfunction readRateLimits\(responseOrHeaders, options = \{\}\) \{\n/);
});

test('web/client.js holds the same rules for its page-side pacer (node web/gen-pacing.mjs)', () => {
  const client = readFileSync(CLIENT, 'utf8');
  assert.equal(client, clientWith(client), 'web/client.js holds a stale copy: run node web/gen-pacing.mjs');
  assert.match(client, /\nfunction admit\(state, now, cost = \{\}\) \{\n/);
});
