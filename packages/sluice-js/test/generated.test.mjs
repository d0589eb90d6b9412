// The generated modules are what the repository's sources make: the Lua scripts are the Rust
// crate's, byte for byte; the embedded wasm is the committed module, whose record matches the
// current Rust sources (a fresh build is compared by `scripts/wasm-module check`, which
// run-tests.sh runs too); cjs/ is the CommonJS form of src/; the license files are the
// repository's.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

import { generatedModule, GENERATED } from '../scripts/gen-redis-scripts.mjs';
import { generated as cjsFiles, CJS } from '../scripts/gen-cjs.mjs';
import { PACKAGE, ROOT } from './support.mjs';
import { WASM_BASE64 } from '../src/core-wasm.generated.js';
import { COPIES, copyPath, generated as swCopy } from '../../../web/gen-pacing.mjs';

// The inputs of the module, as in crates/sluice-js-wasm/tests/module.rs.
const INPUTS = [
  'Cargo.toml',
  'Cargo.lock',
  'crates/sluice-core/Cargo.toml',
  'crates/sluice-core/src',
  'crates/sluice-wasm-rt/Cargo.toml',
  'crates/sluice-wasm-rt/src',
  'crates/sluice-js-wasm/Cargo.toml',
  'crates/sluice-js-wasm/src',
];

function collect(rel, files) {
  const abs = join(ROOT, rel);
  const st = statSync(abs);
  if (st.isDirectory()) for (const e of readdirSync(abs)) collect(`${rel}/${e}`, files);
  else if (st.isFile()) files.push(rel);
}

/** The digest of crates/sluice-js-wasm/tests/module.rs: path NUL length NUL bytes, sorted. */
function sourceDigest() {
  const files = [];
  for (const input of INPUTS) collect(input, files);
  // Rust sorts Strings by bytes; these paths are ASCII, where that is code-unit order.
  files.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const hash = createHash('sha256');
  for (const rel of files) {
    const bytes = readFileSync(join(ROOT, rel));
    hash.update(rel);
    hash.update(Buffer.from([0]));
    hash.update(String(bytes.length));
    hash.update(Buffer.from([0]));
    hash.update(bytes);
  }
  return hash.digest('hex');
}

function field(record, name) {
  const line = record.split('\n').find((l) => l.split(':')[0].trim() === name);
  return line ? line.slice(line.indexOf(':') + 1).trim() : null;
}

test('the Redis scripts are the Rust crate\'s, byte for byte', () => {
  assert.equal(
    readFileSync(GENERATED, 'utf8'),
    generatedModule(),
    'src/redis-scripts.generated.js is stale: run node scripts/gen-redis-scripts.mjs',
  );
});

test('the embedded wasm is the committed module, and its record matches the Rust sources', () => {
  const wasm = readFileSync(join(PACKAGE, 'wasm', 'sluice_js_wasm.wasm'));
  const record = readFileSync(join(PACKAGE, 'wasm', 'sluice_js_wasm.sources'), 'utf8');
  const stale = 'run packages/sluice-js/scripts/wasm-module update and commit';
  assert.equal(field(record, 'sources'), sourceDigest(), `sluice-core or sluice-js-wasm changed: ${stale}`);
  assert.equal(field(record, 'module'), createHash('sha256').update(wasm).digest('hex'), `the record does not match the module: ${stale}`);
  assert.ok(Buffer.from(WASM_BASE64, 'base64').equals(wasm), `src/core-wasm.generated.js does not embed the committed module: ${stale}`);
});

test('cjs/ is the CommonJS form of src/ (node scripts/gen-cjs.mjs)', async () => {
  const files = await cjsFiles();
  const present = existsSync(CJS) ? readdirSync(CJS).sort() : [];
  assert.deepEqual(present, Object.keys(files).sort(), 'the files of cjs/: run node scripts/gen-cjs.mjs and commit');
  for (const [name, text] of Object.entries(files)) {
    assert.equal(readFileSync(join(CJS, name), 'utf8'), text, `cjs/${name} is stale: run node scripts/gen-cjs.mjs and commit`);
  }
});

test('the license files of the package are the repository\'s', () => {
  for (const name of ['LICENSE-MIT', 'LICENSE-APACHE']) {
    assert.ok(readFileSync(join(PACKAGE, name)).equals(readFileSync(join(ROOT, name))), `${name} differs from the repository's`);
  }
});

test('the Service Worker paces by these rules: web/sw/*.generated.js are src/headers.js and src/pacing.js', () => {
  for (const copy of COPIES) {
    assert.equal(readFileSync(copyPath(copy), 'utf8'), swCopy(copy), `web/sw/${copy.to} is stale: run node web/gen-pacing.mjs, then scripts/sw-bundle update`);
  }
});
