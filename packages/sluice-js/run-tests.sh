#!/usr/bin/env bash
# Every test of sluice-limits (packages/sluice-js), in one go:
#   - npm ci (exact versions from package-lock.json);
#   - the embedded wasm is a fresh build of the Rust sources (scripts/wasm-module check);
#   - node --test test/*.test.mjs: the behaviour suite in Node and in headless Chromium, the
#     generated modules (the wasm, the Redis scripts, cjs/), the types (tsc), the Redis store
#     with node-redis and ioredis on a real redis-server and on a three-master Redis Cluster,
#     its interop with `sluice serve`, the job queue (test/jobs*.test.mjs: worker processes
#     killed with SIGKILL, a group's bound across 2 Node and 2 Rust workers, the Rust worker
#     built by cargo from crates/sluice/tests/jobs_redis.rs, fairness, weighted costs,
#     Retry-After from a stand-in API, Redis Cluster), and the packed tarball in a fresh folder
#     (the README's examples, CommonJS, esbuild bundles, TypeScript consumers).
#
# Needs: node >= 20, npm, cargo with the wasm32-unknown-unknown target, redis-server and
# redis-cli (the Cluster is made with `redis-cli --cluster create`), Chromium
# ($SLUICE_CHROMIUM, default /usr/bin/chromium) and the sluice binary ($SLUICE_BIN; built here
# with `cargo build -p sluice-server --bin sluice` when unset). Under CI=true a missing tool
# fails the run, naming it; otherwise the test that needs it is skipped with a message.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    if [ "${CI:-}" = true ]; then
      echo "packages/sluice-js: $1 is missing ($2); CI=true, so this fails" >&2
      exit 1
    fi
    echo "packages/sluice-js: $1 is missing ($2); the tests that need it are skipped" >&2
  fi
}
need node "Node >= 20"
need npm "npm"
need cargo "the wasm freshness check, the sluice binary and the Rust job worker"
need redis-server "the Redis store and interop tests"
need redis-cli "the Redis Cluster tests"
need "${SLUICE_CHROMIUM:-/usr/bin/chromium}" "the browser run of the behaviour suite"

npm ci --no-audit --no-fund

if command -v cargo >/dev/null 2>&1; then
  (cd "$root" && packages/sluice-js/scripts/wasm-module check)
  if [ -z "${SLUICE_BIN:-}" ]; then
    (cd "$root" && cargo build -q -p sluice-server --bin sluice)
    export SLUICE_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/sluice"
  fi
fi

node --test --test-concurrency=1 test/*.test.mjs
