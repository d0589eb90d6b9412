#!/usr/bin/env bash
# Decisions per second against one local Redis with 50 concurrent callers: sluice's RedisStore
# beside rate-limiter-flexible (RateLimiterRedis over ioredis), on the same Redis, in one run.
#
#   scripts/bench-redis.sh [seconds per run, default 5] [rounds, default 5]
#
# Two scenarios, the same quotas on both sides:
#   random  every request a new random key (1000 per second each): every decision allowed
#   hot     one key, 10 per minute: after 10, every decision denied
# Each client is one thread (tokio current_thread; Node's one thread); Redis gets the other
# core. The median of the rounds is reported, as a markdown table with the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-5}"
rounds="${2:-5}"

command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 1; }
command -v node >/dev/null || { echo "node is not installed" >&2; exit 1; }
if [ ! -d scripts/bench/node_modules ]; then
  (cd scripts/bench && npm ci --no-audit --no-fund --loglevel=error)
fi
cargo build --release -q -p sluice --example bench_redis
target_dir="$(cargo metadata --format-version 1 --no-deps | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).target_directory))')"
sluice_bin="$target_dir/release/examples/bench_redis"

# One Redis on a free port, no persistence, in a temporary directory; stopped on exit.
dir="$(mktemp -d)"
port="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" --daemonize no >/dev/null &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done

results="$dir/results.jsonl"
for round in $(seq "$rounds"); do
  for scenario in random hot; do
    redis-cli -p "$port" flushall >/dev/null
    "$sluice_bin" --port "$port" --scenario "$scenario" --seconds "$seconds" | tee -a "$results"
    redis-cli -p "$port" flushall >/dev/null
    node scripts/bench-redis-flexible.mjs --port "$port" --scenario "$scenario" --seconds "$seconds" | tee -a "$results"
    redis-cli -p "$port" flushall >/dev/null
    node scripts/bench-redis-flexible.mjs --port "$port" --scenario "$scenario" --seconds "$seconds" --auto-pipelining | tee -a "$results"
  done
done >&2

redis_version="$(redis-server --version | sed -E 's/.*v=([^ ]+).*/\1/')"
node - "$results" "$seconds" "$rounds" "$redis_version" <<'JS'
const [file, seconds, rounds, redisVersion] = process.argv.slice(2);
const rows = require('fs').readFileSync(file, 'utf8').trim().split('\n').map(JSON.parse);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const impls = ['sluice RedisStore', 'rate-limiter-flexible', 'rate-limiter-flexible (ioredis autopipelining)'];
const scenarios = { random: 'allowed, random keys', hot: 'denied, one hot key' };
const per = {};
for (const s of Object.keys(scenarios)) for (const i of impls)
  per[s + i] = median(rows.filter((r) => r.scenario === s && r.impl === i).map((r) => r.per_sec));
const fmt = (n) => n.toLocaleString('en-US');
console.log(`Redis ${redisVersion}, Node ${process.version}, 50 concurrent callers, ${seconds} s per run, median of ${rounds} rounds.\n`);
console.log('| scenario | sluice RedisStore | rate-limiter-flexible | ratio | rate-limiter-flexible, ioredis autopipelining | ratio |');
console.log('|---|---:|---:|---:|---:|---:|');
for (const [s, label] of Object.entries(scenarios)) {
  const ours = per[s + impls[0]];
  const rlf = per[s + impls[1]];
  const rlfp = per[s + impls[2]];
  console.log(`| ${label} | ${fmt(ours)}/s | ${fmt(rlf)}/s | ${(ours / rlf).toFixed(1)}x | ${fmt(rlfp)}/s | ${(ours / rlfp).toFixed(1)}x |`);
}
JS
