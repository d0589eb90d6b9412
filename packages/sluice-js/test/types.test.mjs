// The hand-written declarations (src/*.d.ts) under tsc --noEmit: test/types/check.ts uses the
// API as the README does, and its @ts-expect-error lines must stay errors.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { PACKAGE, missing } from './support.mjs';

test('the type declarations check under tsc --noEmit', (t) => {
  const tsc = join(PACKAGE, 'node_modules', '.bin', 'tsc');
  if (!existsSync(tsc)) return missing(t, 'typescript (npm ci in packages/sluice-js)');
  const r = spawnSync(tsc, ['--noEmit', '-p', join(PACKAGE, 'test', 'types')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});
