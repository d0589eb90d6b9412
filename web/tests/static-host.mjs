// Helpers for the tests of the files `sluice bundle` writes: run the bundle command, and serve a
// directory from a plain static host (`python3 -m http.server`, files only: every other path,
// `/api/*` included, is a 404 from it) on a free port of 127.0.0.1.

import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { freePort, sluiceBinary } from './harness.mjs';

/** Runs `sluice bundle` with `args`; returns { status, stdout, stderr }. */
export function bundle(args) {
  const r = spawnSync(sluiceBinary(), ['bundle', ...args], { encoding: 'utf8' });
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A fresh temporary directory; `remove()` deletes it. */
export async function tempDir(prefix = 'sluice-bundle-') {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** Writes `toml` to a file in `dir` and bundles it into `dir/out`; throws unless it exits 0. */
export async function bundleFrom(dir, toml) {
  const file = join(dir, 'sluice.toml');
  await writeFile(file, toml);
  const out = join(dir, 'out');
  const r = bundle(['--config', file, '--out', out]);
  if (r.status !== 0) throw new Error(`sluice bundle exited ${r.status}: ${r.stderr}`);
  return out;
}

function connects(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * Serves `dir` with `python3 -m http.server` on a free port of 127.0.0.1. Returns { url,
 * requests(prefix), close() }: `requests` lists the paths it was asked for (from its log),
 * e.g. to count the admitted `/api/` requests that reached it.
 */
export async function startStaticHost(dir) {
  const port = await freePort();
  const child = spawn('python3', ['-u', '-m', 'http.server', String(port), '--bind', '127.0.0.1', '--directory', dir], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => (log += d));
  const deadline = Date.now() + 10000;
  while (!(await connects(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill();
      throw new Error(`python3 -m http.server did not start: ${log}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    /** The request paths the host logged that start with `prefix`. */
    requests: (prefix) =>
      [...log.matchAll(/"(?:GET|HEAD|POST|PUT|DELETE|PATCH) (\S+) HTTP/g)].map((m) => m[1]).filter((p) => p.startsWith(prefix)),
    close: () =>
      new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill();
      }),
  };
}
