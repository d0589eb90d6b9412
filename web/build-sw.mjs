#!/usr/bin/env node
// Builds the served /sluice/sw.js: the generated prefix (configuration and module), then
// web/sw.js. The gateway does the same in Rust; the contract is in web/README.md.
//
//   node web/build-sw.mjs [--wasm FILE] [--config FILE.json] [--out FILE] [--mode worker|import|module]
//
// Defaults: the release build of sluice-wasm ($CARGO_TARGET_DIR or target/), web/sluice.config.json,
// standard output.

import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

/**
 * Where `cargo build -p sluice-wasm --target wasm32-unknown-unknown --release` puts the module:
 * under $CARGO_TARGET_DIR when it is set (as run-tests.sh builds it), else the checkout's target/.
 */
export const DEFAULT_WASM = join(
  resolve(process.env.CARGO_TARGET_DIR || join(here, '..', 'target')),
  'wasm32-unknown-unknown',
  'release',
  'sluice_wasm.wasm',
);
export const DEFAULT_CONFIG = join(here, 'sluice.config.json');
export const SW_SOURCE = join(here, 'sw.js');

/**
 * The prefix: exactly three lines.
 *
 *   // sluice: generated prefix (configuration and module); web/sw.js follows
 *   self.__SLUICE_CONFIG__ = <the configuration as JSON>;
 *   self.__SLUICE_WASM__ = (function (s) { ... })("<the module, standard base64 with padding>");
 */
export function prefix(wasmBytes, config) {
  const json = JSON.stringify(config);
  const base64 = Buffer.from(wasmBytes).toString('base64');
  return (
    '// sluice: generated prefix (configuration and module); web/sw.js follows\n' +
    `self.__SLUICE_CONFIG__ = ${json};\n` +
    'self.__SLUICE_WASM__ = (function (s) { var b = atob(s), u = new Uint8Array(b.length); ' +
    'for (var i = 0; i < b.length; i++) u[i] = b.charCodeAt(i); return u; })' +
    `("${base64}");\n`
  );
}

/** The line after the prefix in the import forms (`sw-import.js`, `sw.mjs`). */
export const IMPORT_MODE_LINE = 'self.__SLUICE_MODE__ = "import";\n';

/** What follows `web/sw.js` in the ES module form. */
export const MODULE_EXPORTS = '\nexport const sluice = self.sluice;\nexport default self.sluice;\n';

/**
 * The whole served script. `mode`: 'worker' (`/sluice/sw.js`), 'import' (`/sluice/sw-import.js`,
 * for `importScripts()` in an app's worker) or 'module' (`/sluice/sw.mjs`).
 */
export function buildServiceWorker({ wasm, config, swSource = readFileSync(SW_SOURCE, 'utf8'), mode = 'worker' }) {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) {
    throw new Error('the configuration must be a JSON object');
  }
  if (mode === 'worker') return prefix(wasm, config) + swSource;
  if (mode === 'import') return prefix(wasm, config) + IMPORT_MODE_LINE + swSource;
  if (mode === 'module') return prefix(wasm, config) + IMPORT_MODE_LINE + swSource + MODULE_EXPORTS;
  throw new Error(`mode must be worker, import or module, not ${mode}`);
}

function main(argv) {
  const args = { wasm: DEFAULT_WASM, config: DEFAULT_CONFIG, out: null, mode: 'worker' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in args) || argv[i + 1] === undefined) {
      console.error('usage: node web/build-sw.mjs [--wasm FILE] [--config FILE.json] [--out FILE] [--mode worker|import|module]');
      process.exit(2);
    }
    args[key] = argv[i + 1];
  }
  const script = buildServiceWorker({
    wasm: readFileSync(args.wasm),
    config: JSON.parse(readFileSync(args.config, 'utf8')),
    mode: args.mode,
  });
  if (args.out) writeFileSync(args.out, script);
  else process.stdout.write(script);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) main(process.argv.slice(2));
