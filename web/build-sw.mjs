#!/usr/bin/env node
// Builds the served /sluice/sw.js: the generated prefix (configuration and module), then
// web/sw.js. The gateway does the same in Rust; the contract is in web/README.md.
//
//   node web/build-sw.mjs [--wasm FILE] [--config FILE.json] [--out FILE]
//
// Defaults: the release build of sluice-wasm, web/sluice.config.json, standard output.

import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

/** Where `cargo build -p sluice-wasm --target wasm32-unknown-unknown --release` puts the module. */
export const DEFAULT_WASM = join(here, '..', 'target', 'wasm32-unknown-unknown', 'release', 'sluice_wasm.wasm');
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

/** The whole served script. */
export function buildServiceWorker({ wasm, config, swSource = readFileSync(SW_SOURCE, 'utf8') }) {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) {
    throw new Error('the configuration must be a JSON object');
  }
  return prefix(wasm, config) + swSource;
}

function main(argv) {
  const args = { wasm: DEFAULT_WASM, config: DEFAULT_CONFIG, out: null };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in args) || argv[i + 1] === undefined) {
      console.error('usage: node web/build-sw.mjs [--wasm FILE] [--config FILE.json] [--out FILE]');
      process.exit(2);
    }
    args[key] = argv[i + 1];
  }
  const script = buildServiceWorker({
    wasm: readFileSync(args.wasm),
    config: JSON.parse(readFileSync(args.config, 'utf8')),
  });
  if (args.out) writeFileSync(args.out, script);
  else process.stdout.write(script);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) main(process.argv.slice(2));
