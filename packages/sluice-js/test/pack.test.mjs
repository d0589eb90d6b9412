// npm pack, the tarball installed in a fresh folder (with the redis client, the optional peer
// dependency), and every `js` block of the README run there as it stands.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { PACKAGE, missing, startRedis, which } from './support.mjs';

function sh(cmd, args, options) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 120000, ...options });
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} failed:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

test('the packed tarball installs in a fresh folder and every README example runs', { timeout: 300000 }, async (t) => {
  if (!which('redis-server')) return missing(t, 'redis-server (for the README\'s Redis example)');
  const readme = await readFile(join(PACKAGE, 'README.md'), 'utf8');
  const examples = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.ok(examples.length >= 7, `README examples found: ${examples.length}`);
  const dir = await mkdtemp(join(tmpdir(), 'sluice-js-pack-'));
  const redis = await startRedis();
  try {
    const packed = JSON.parse(sh('npm', ['pack', '--json', '--pack-destination', dir], { cwd: PACKAGE }));
    const files = packed[0].files.map((f) => f.path);
    assert.ok(files.includes('src/core-wasm.generated.js') && files.includes('src/index.d.ts'), files.join(', '));
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('wasm/')), `only what users need: ${files.join(', ')}`);
    const lock = JSON.parse(await readFile(join(PACKAGE, 'package-lock.json'), 'utf8'));
    const redisVersion = lock.packages['node_modules/redis'].version;
    await writeFile(join(dir, 'package.json'), JSON.stringify({ name: 'fresh', private: true, type: 'module' }));
    sh('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', join(dir, packed[0].filename), `redis@${redisVersion}`], { cwd: dir });
    for (const [i, code] of examples.entries()) {
      const file = join(dir, `example-${i}.mjs`);
      await writeFile(file, code);
      const r = spawnSync(process.execPath, [file], {
        cwd: dir, encoding: 'utf8', timeout: 30000, env: { ...process.env, REDIS_URL: redis.url },
      });
      assert.equal(r.status, 0, `README example ${i} failed:\n${code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`);
      t.diagnostic(`example ${i}: ${r.stdout.trim().split('\n').join(' | ')}`);
    }
  } finally {
    await redis.close();
    await rm(dir, { recursive: true, force: true });
  }
});
