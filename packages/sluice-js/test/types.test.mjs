// The hand-written declarations (src/*.d.ts, cjs/*.d.cts) under tsc --strict --noEmit:
// test/types/consumer.ts uses every documented API, consumer-cjs.cts as CommonJS, with the
// real node-redis and ioredis types; their @ts-expect-error lines must stay errors. The same
// files run against the packed tarball in test/pack.test.mjs (node10 too).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { PACKAGE, missing } from './support.mjs';

test('the type declarations check under tsc --strict --noEmit (nodenext)', (t) => {
  const tsc = join(PACKAGE, 'node_modules', '.bin', 'tsc');
  if (!existsSync(tsc)) return missing(t, 'typescript (npm ci in packages/sluice-js)');
  const r = spawnSync(tsc, ['--noEmit', '-p', join(PACKAGE, 'test', 'types')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});
