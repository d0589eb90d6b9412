// npm pack, the tarball installed in a fresh folder (with the Redis clients, esbuild and Node's
// types, at the versions of package-lock.json), and there: every example of the README (`js`
// blocks as ES modules, `cjs` blocks as CommonJS), a CommonJS consumer, three esbuild bundles,
// and a TypeScript consumer of every documented API under nodenext and node10.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { PACKAGE, missing, startRedis, which } from './support.mjs';

function sh(cmd, args, options) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 180000, ...options });
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} failed:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** Runs a file with node in the fresh folder: { status, stdout, stderr }. */
function node(file, env = {}) {
  return spawnSync(process.execPath, [file], {
    cwd: fresh.dir, encoding: 'utf8', timeout: 30000, env: { ...process.env, ...env },
  });
}

const fresh = { dir: null, files: [], manifest: null };

before(async () => {
  fresh.dir = await mkdtemp(join(tmpdir(), 'sluice-js-pack-'));
  const packed = JSON.parse(sh('npm', ['pack', '--json', '--pack-destination', fresh.dir], { cwd: PACKAGE }));
  fresh.files = packed[0].files.map((f) => f.path);
  const lock = JSON.parse(await readFile(join(PACKAGE, 'package-lock.json'), 'utf8'));
  const at = (name) => `${name}@${lock.packages[`node_modules/${name}`].version}`;
  await writeFile(join(fresh.dir, 'package.json'), JSON.stringify({ name: 'fresh', private: true, type: 'module' }));
  sh('npm', [
    'install', '--no-audit', '--no-fund', '--prefer-offline', join(fresh.dir, packed[0].filename),
    at('redis'), at('ioredis'), at('esbuild'), at('@types/node'),
  ], { cwd: fresh.dir });
  fresh.manifest = JSON.parse(await readFile(join(fresh.dir, 'node_modules', 'sluice-limits', 'package.json'), 'utf8'));
});

after(async () => {
  if (fresh.dir) await rm(fresh.dir, { recursive: true, force: true });
});

test('the tarball holds what users need: both module forms, the types, the licenses, where it comes from', () => {
  const files = fresh.files;
  for (const f of ['src/core-wasm.generated.js', 'src/index.d.ts', 'cjs/index.cjs', 'cjs/index.mjs', 'cjs/index.d.cts', 'cjs/redis.cjs', 'LICENSE-MIT', 'LICENSE-APACHE']) {
    assert.ok(files.includes(f), `${f} in ${files.join(', ')}`);
  }
  assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('wasm/') || f.startsWith('scripts/')), `only what users need: ${files.join(', ')}`);
  const m = fresh.manifest;
  assert.equal(m.license, 'MIT OR Apache-2.0');
  assert.ok(m.repository?.url && m.homepage && m.bugs?.url, 'repository, homepage, bugs');
  assert.equal(m.main, './cjs/index.cjs');
  assert.equal(m.types, './src/index.d.ts');
});

test('every README example runs from the tarball: js blocks as ES modules, cjs blocks as CommonJS', { timeout: 300000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server (for the README\'s Redis examples)');
  const readme = await readFile(join(PACKAGE, 'README.md'), 'utf8');
  const examples = [...readme.matchAll(/```(js|cjs)\n([\s\S]*?)```/g)].map((m) => ({ kind: m[1], code: m[2] }));
  assert.ok(examples.filter((e) => e.kind === 'js').length >= 7, 'at least 7 ES module examples');
  assert.ok(examples.filter((e) => e.kind === 'cjs').length >= 2, 'at least 2 CommonJS examples');
  const redis = await startRedis();
  try {
    for (const [i, { kind, code }] of examples.entries()) {
      const file = join(fresh.dir, `example-${i}.${kind === 'js' ? 'mjs' : 'cjs'}`);
      await writeFile(file, code);
      const r = node(file, { REDIS_URL: redis.url });
      assert.equal(r.status, 0, `README example ${i} (${kind}) failed:\n${code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`);
      t.diagnostic(`example ${i} (${kind}): ${r.stdout.trim().split('\n').join(' | ')}`);
    }
  } finally {
    await redis.close();
  }
});

test('CommonJS: require() works without top-level await, one copy of each class with import', async (t) => {
  const file = join(fresh.dir, 'consumer.cjs');
  await writeFile(file, `
const { RateLimiter, TimeoutError, keyed, keyHash } = require('sluice-limits');
const { RedisStore } = require('sluice-limits/redis');
const l = new RateLimiter({ capacity: 2, rate: '10/s', queue: false });
const got = [l.tryAcquire(), l.tryAcquire(), l.tryAcquire()];
l.schedule(() => 1).catch((e) => {
  import('sluice-limits').then((esm) => {
    console.log(JSON.stringify({
      got,
      timeout: e instanceof TimeoutError && e instanceof esm.TimeoutError,
      sameClass: esm.RateLimiter === RateLimiter && esm.keyed === keyed,
      store: typeof RedisStore,
      hash: keyHash('Jefe', 'what do ya want for nothing?'),
    }));
  });
});
`);
  const r = node(file);
  assert.equal(r.status, 0, r.stderr);
  t.diagnostic(`node consumer.cjs: ${r.stdout.trim()}`);
  assert.deepEqual(JSON.parse(r.stdout), {
    got: [true, true, false], timeout: true, sameClass: true, store: 'function', hash: '5bdcc146bf60754e6a042426089575c7',
  });
});

test('bundlers: esbuild --format=cjs, --format=iife and --target=es2020 bundle it, and the bundles run', async (t) => {
  // No top-level await in the entry: es2020 has none. The package must not need one either.
  const entry = join(fresh.dir, 'entry.mjs');
  await writeFile(entry, `
import { RateLimiter, limit } from 'sluice-limits';
(async () => {
  const l = new RateLimiter({ capacity: 1, rate: '100/s' });
  const started = [];
  const t0 = performance.now();
  await Promise.all([1, 2, 3].map((i) => l.schedule(() => started.push(i))));
  const both = limit({ concurrency: 1, capacity: 5, rate: '5/s' });
  console.log(started.join(','), await both.schedule(() => 'ok'), performance.now() - t0 >= 19);
})();
`);
  const esbuild = join(fresh.dir, 'node_modules', '.bin', 'esbuild');
  const bundles = [
    ['out.cjs', ['--format=cjs', '--platform=node']],
    ['out.iife.js', ['--format=iife', '--platform=browser']],
    ['out.es2020.mjs', ['--format=esm', '--platform=browser', '--target=es2020']],
  ];
  for (const [out, flags] of bundles) {
    sh(esbuild, [entry, '--bundle', `--outfile=${join(fresh.dir, out)}`, ...flags], { cwd: fresh.dir });
    const r = node(join(fresh.dir, out));
    assert.equal(r.status, 0, `${out}: ${r.stderr}`);
    assert.equal(r.stdout.trim(), '1,2,3 ok true', `${out} printed ${r.stdout}`);
    t.diagnostic(`esbuild ${flags.join(' ')}: ${out} printed ${r.stdout.trim()}`);
  }
});

test('TypeScript consumers: tsc --strict --noEmit, nodenext (TypeScript 7 and 5) and node10 (TypeScript 5)', { timeout: 180000 }, async (t) => {
  const tsc7 = join(PACKAGE, 'node_modules', 'typescript', 'bin', 'tsc');
  const tsc5 = join(PACKAGE, 'node_modules', 'typescript-5', 'bin', 'tsc');
  for (const f of ['consumer.ts', 'consumer-cjs.cts']) await copyFile(join(PACKAGE, 'test', 'types', f), join(fresh.dir, f));
  const base = { target: 'es2022', strict: true, noEmit: true, skipLibCheck: false, lib: ['es2022', 'dom'], types: ['node'] };
  const configs = {
    'tsconfig.nodenext.json': { compilerOptions: { ...base, module: 'nodenext', moduleResolution: 'nodenext' }, files: ['consumer.ts', 'consumer-cjs.cts'] },
    // node10 reads main, types and typesVersions (not exports), as TypeScript before 5 did.
    'tsconfig.node10.json': { compilerOptions: { ...base, module: 'commonjs', moduleResolution: 'node10', skipLibCheck: true }, files: ['consumer.ts'] },
  };
  for (const [name, config] of Object.entries(configs)) await writeFile(join(fresh.dir, name), JSON.stringify(config, null, 2));
  const runs = [[tsc7, 'tsconfig.nodenext.json'], [tsc5, 'tsconfig.nodenext.json'], [tsc5, 'tsconfig.node10.json']];
  for (const [tsc, config] of runs) {
    const r = spawnSync(process.execPath, [tsc, '-p', config], { cwd: fresh.dir, encoding: 'utf8' });
    const version = spawnSync(process.execPath, [tsc, '--version'], { encoding: 'utf8' }).stdout.trim();
    assert.equal(r.status, 0, `${version} -p ${config}:\n${r.stdout}${r.stderr}`);
    t.diagnostic(`${version}, ${config}: no errors`);
  }
});
