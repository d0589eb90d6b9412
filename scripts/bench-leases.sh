#!/usr/bin/env bash
# Three gateways sharing limits, side by side in one run: leased slices of Redis (`lease`),
# one Redis script per request (`redis`), and no sharing at all (`memory`, each gateway its
# own buckets).
#
#   scripts/bench-leases.sh [seconds per run, default 5] [rounds, default 3]
#
# Each gateway (`workers = 1`) runs two policies: `hot`, one global key, and `cool`, a key per
# `x-user` header among 10,000 (wrk picks one at random for each request). nginx (`return
# 200`) is the upstream. Two wrk per gateway, one connection each: one on the hot key, one on
# the cool keys.
#
# Scenarios:
#   open   quotas no request reaches (1,000,000 and 1,000,000/s): the cost of deciding.
#   bound  the hot key at 2,000 and 4,000/s for the three together: admitted against the
#          bound (never above) and how far under.
#   steady the hot key at 250 and 1,000/s, offered 1.5x and 3x the rate in random (Poisson)
#          arrivals (wrk's `delay`, four connections per gateway), the burst spent first: the
#          admitted rate with a lease (`lease`) and without (`redis`), and their ratio.
#
# Reports per mode and key: requests/s (all three gateways), p50/p99 (the gateways' worst),
# Redis scripts per admitted request (the gateways' own count of round trips for the policy,
# `sluice_store_round_trips_total`), and for the hot key admitted against the bound. Needs
# redis-server, nginx (nginx-light), wrk, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${1:-5}
ROUNDS=${2:-3}

for tool in redis-server redis-cli nginx wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench-leases: $tool is not installed" >&2; exit 1; }
done
# free_port, wait_port
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

cargo build --release -q -p sluice-server
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Redis, no persistence.
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
  --logfile "$WORK/redis.log" >/dev/null &
PIDS+=($!)
until redis-cli -p "$RPORT" ping >/dev/null 2>&1; do sleep 0.05; done

# The upstream: nginx answering 200 at once.
UPORT=$(free_port)
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/tmp/body;
  proxy_temp_path $WORK/nginx/tmp/proxy;
  fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
  uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
  scgi_temp_path $WORK/nginx/tmp/scgi;
  server { listen 127.0.0.1:$UPORT; keepalive_requests 100000; location / { return 200 "ok"; } }
}
CONF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/logs/error.log" &
PIDS+=($!)
wait_port "$UPORT"

# wrk: the hot key, or one of 10,000 users at random.
cat > "$WORK/hot.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %.3f %.3f %d\n", summary.requests,
    summary.errors.status, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.duration))
end
LUA
cat > "$WORK/cool.lua" <<'LUA'
request = function()
  return wrk.format("GET", "/cool/x", { ["x-user"] = "u" .. math.random(1, 10000) })
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %.3f %.3f %d\n", summary.requests,
    summary.errors.status, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.duration))
end
LUA

# Random arrivals: each connection waits an exponential time (mean MEAN_MS) between requests.
cat > "$WORK/paced.lua" <<'LUA'
local mean = tonumber(os.getenv("MEAN_MS"))
-- Each wrk draws its own stretch of the sequence: SKIP draws thrown away first.
for _ = 1, tonumber(os.getenv("SKIP") or "0") do math.random() end
delay = function()
  return math.floor(-math.log(1 - math.random()) * mean + 0.5)
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %.3f %.3f %d\n", summary.requests,
    summary.errors.status, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.duration))
end
LUA

config() { # mode capacity rate port admin
  local mode=$1 cap=$2 rate=$3 port=$4 admin=$5 store="" lease=""
  case $mode in
    lease) store="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$RPORT\"
timeout = \"200ms\"
prefix = \"bench\""
      lease='lease = { max = "5%", ttl = "100ms" }' ;;
    redis) store="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$RPORT\"
timeout = \"200ms\"
prefix = \"bench\"" ;;
    memory) ;;
  esac
  cat <<CONF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
workers = 1
request_id = false

$store

[[policy]]
name = "hot"
algorithm = "token_bucket"
capacity = $cap
rate = "$rate/s"
$lease

[[policy]]
name = "cool"
algorithm = "token_bucket"
capacity = 1000000
rate = "1000000/s"
key = "header:x-user"
$lease

[[route]]
path_prefix = "/hot/"
policies = ["hot"]
upstream = "http://127.0.0.1:$UPORT"

[[route]]
path_prefix = "/cool/"
policies = ["cool"]
upstream = "http://127.0.0.1:$UPORT"
CONF
}

# The round trips gateway $1's admin port counted for policy $2.
round_trips() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk -v p="bench:$2" 'index($0, "sluice_store_round_trips_total{") == 1 && index($0, "prefix=\"" p "\"") {s += $NF} END {print s + 0}'
}

# One run: three gateways in `mode`, two wrk on each; prints one line per key: "mode scenario
# key req/s p50 p99 admitted round_trips seconds cap rate".
run() {
  local mode=$1 scenario=$2 cap=$3 rate=$4
  local gws=() ports=() admins=()
  redis-cli -p "$RPORT" flushall >/dev/null
  for i in 1 2 3; do
    local port admin
    port=$(free_port); admin=$(free_port)
    config "$mode" "$cap" "$rate" "$port" "$admin" > "$WORK/gw$i.toml"
    SLUICE_LOG=warn "$BIN" serve --config "$WORK/gw$i.toml" 2>"$WORK/gw$i.log" &
    gws+=($!); ports+=("$port"); admins+=("$admin")
  done
  for p in "${ports[@]}"; do wait_port "$p"; done
  # Until each reaches Redis (a 200 from a cool key), then a full bucket again.
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: warm' "http://127.0.0.1:$p/cool/x")" = 200 ] && break
      sleep 0.05
    done
  done
  sleep 1
  local hot0=0 cool0=0 a
  for a in "${admins[@]}"; do
    hot0=$((hot0 + $(round_trips "$a" hot))); cool0=$((cool0 + $(round_trips "$a" cool)))
  done
  local waits=()
  for i in 0 1 2; do
    wrk -t1 -c1 -d"${SECS}s" --latency -s "$WORK/hot.lua" "http://127.0.0.1:${ports[$i]}/hot/x" \
      > "$WORK/hot$i.out" 2>&1 &
    waits+=($!)
    wrk -t1 -c1 -d"${SECS}s" --latency -s "$WORK/cool.lua" "http://127.0.0.1:${ports[$i]}" \
      > "$WORK/cool$i.out" 2>&1 &
    waits+=($!)
  done
  for pid in "${waits[@]}"; do wait "$pid"; done
  local hot1=0 cool1=0
  for a in "${admins[@]}"; do
    hot1=$((hot1 + $(round_trips "$a" hot))); cool1=$((cool1 + $(round_trips "$a" cool)))
  done
  for pid in "${gws[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  python3 - "$mode" "$scenario" "$cap" "$rate" "$((hot1 - hot0))" "$((cool1 - cool0))" "$WORK" <<'PY'
import sys
mode, scenario, cap, rate, hot_trips, cool_trips, work = sys.argv[1:8]
for key, trips in (("hot", hot_trips), ("cool", cool_trips)):
    total = bad = 0; p50 = p99 = 0.0; secs = 0.0
    for i in range(3):
        for line in open(f"{work}/{key}{i}.out"):
            if line.startswith("RESULT"):
                _, req, nb, a, b, us = line.split()
                total += int(req); bad += int(nb)
                p50 = max(p50, float(a)); p99 = max(p99, float(b)); secs = max(secs, int(us) / 1e6)
    print(f"{mode} {scenario} {key} {total / secs:.0f} {p50:.3f} {p99:.3f} {total - bad} {trips} {secs:.3f} {cap} {rate}")
PY
}

# A steady load on the hot key: three gateways in `mode`, four paced connections each offering
# `factor` x the rate in all; one second to spend the burst, then SECS measured. Prints "mode
# steady-FACTOR hot offered/s admitted/s p50 p99 seconds".
steady() {
  local mode=$1 factor=$2 cap=250 rate=1000
  local gws=() ports=()
  redis-cli -p "$RPORT" flushall >/dev/null
  for i in 1 2 3; do
    local port admin
    port=$(free_port); admin=$(free_port)
    config "$mode" "$cap" "$rate" "$port" "$admin" > "$WORK/gw$i.toml"
    SLUICE_LOG=warn "$BIN" serve --config "$WORK/gw$i.toml" 2>"$WORK/gw$i.log" &
    gws+=($!); ports+=("$port")
  done
  for p in "${ports[@]}"; do wait_port "$p"; done
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: warm' "http://127.0.0.1:$p/cool/x")" = 200 ] && break
      sleep 0.05
    done
  done
  # Twelve connections in all, each offering rate x factor / 12 a second.
  local mean
  mean=$(python3 -c "print(1000 * 12 / ($rate * $factor))")
  local waits=() i
  for i in 0 1 2; do
    MEAN_MS=$mean SKIP=$((RANDOM * 3 + i)) wrk -t1 -c4 -d1s -s "$WORK/paced.lua" "http://127.0.0.1:${ports[$i]}/hot/x" >/dev/null 2>&1 &
    waits+=($!)
  done
  for pid in "${waits[@]}"; do wait "$pid"; done
  waits=()
  for i in 0 1 2; do
    MEAN_MS=$mean SKIP=$((RANDOM * 3 + i)) wrk -t1 -c4 -d"${SECS}s" --latency -s "$WORK/paced.lua" "http://127.0.0.1:${ports[$i]}/hot/x" \
      > "$WORK/steady$i.out" 2>&1 &
    waits+=($!)
  done
  for pid in "${waits[@]}"; do wait "$pid"; done
  for pid in "${gws[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  python3 - "$mode" "$factor" "$WORK" <<'PY'
import sys
mode, factor, work = sys.argv[1:4]
total = bad = 0; p50 = p99 = 0.0; secs = 0.0
for i in range(3):
    for line in open(f"{work}/steady{i}.out"):
        if line.startswith("RESULT"):
            _, req, nb, a, b, us = line.split()
            total += int(req); bad += int(nb)
            p50 = max(p50, float(a)); p99 = max(p99, float(b)); secs = max(secs, int(us) / 1e6)
print(f"{mode} steady-{factor} hot {total / secs:.1f} {(total - bad) / secs:.1f} {p50:.3f} {p99:.3f} {secs:.3f}")
PY
}

RESULTS="$WORK/results.txt"
for round in $(seq "$ROUNDS"); do
  for mode in lease redis memory; do
    run "$mode" open 1000000 1000000 | tee -a "$RESULTS" >&2
    run "$mode" bound 2000 4000 | tee -a "$RESULTS" >&2
  done
  for factor in 1.5 3; do
    for mode in lease redis; do
      steady "$mode" "$factor" | tee -a "$RESULTS" >&2
    done
  done
  echo "round $round done" >&2
done

python3 - "$RESULTS" "$SECS" "$ROUNDS" <<'PY'
import statistics, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in lines if not r[1].startswith("steady-")]
steady = [r for r in lines if r[1].startswith("steady-")]
secs, rounds = sys.argv[2], sys.argv[3]
med = statistics.median
print(f"Three gateways (workers = 1 each), one Redis, nginx upstream; per gateway one wrk connection on the hot key and one on 10,000 cool keys; {secs} s per run, median of {rounds} rounds (min to max).\n")
print("| scenario | key | mode | req/s (3 gateways) | p50 / p99 ms (worst gateway) | Redis round trips per admitted | admitted vs bound |")
print("|---|---|---|---:|---|---:|---|")
base = {}
for scenario in ["open", "bound"]:
    for key in ["hot", "cool"]:
        for mode in ["lease", "redis", "memory"]:
            rs = [r for r in rows if r[0] == mode and r[1] == scenario and r[2] == key]
            if not rs:
                continue
            rps = [float(r[3]) for r in rs]
            p50 = med([float(r[4]) for r in rs]); p99 = med([float(r[5]) for r in rs])
            per = med([int(r[7]) / max(int(r[6]), 1) for r in rs])
            base[(scenario, key, mode)] = (med(rps), p99)
            trips = "none (not shared)" if mode == "memory" else (f"1/{1 / per:,.0f}" if per > 0 else "0")
            bound = "n/a"
            if scenario == "bound" and key == "hot":
                bound = " ".join(f"{int(r[6])}/{int(r[9]) + int(r[10]) * float(r[8]):.0f}" for r in rs)
            print(f"| {scenario} | {key} | {mode} | {med(rps):,.0f} ({min(rps):,.0f} to {max(rps):,.0f}) | {p50:.2f} / {p99:.2f} | {trips} | {bound} |")
print()
for scenario in ["open", "bound"]:
    for key in ["hot", "cool"]:
        l, r, m = (base.get((scenario, key, x)) for x in ["lease", "redis", "memory"])
        if l and r and m:
            print(f"- {scenario}, {key} key: lease / per-request Redis = {l[0] / r[0]:.2f}x; lease / memory = {l[0] / m[0]:.2f}; p99 lease {l[1]:.2f} ms vs memory {m[1]:.2f} ms ({l[1] - m[1]:+.2f})")
print()
print("Steady state: the hot key at 250 and 1,000/s, random arrivals at 1.5x and 3x the rate over twelve connections, the burst spent first; admitted/s median (min to max).\n")
print("| offered | mode | offered req/s | admitted/s | p50 / p99 ms | lease / without |")
print("|---|---|---:|---:|---|---:|")
for factor in ["1.5", "3"]:
    got = {}
    for mode in ["lease", "redis"]:
        rs = [r for r in steady if r[0] == mode and r[1] == f"steady-{factor}"]
        if not rs:
            continue
        adm = [float(r[4]) for r in rs]
        got[mode] = med(adm)
        ratio = ""
        if mode == "redis" and "lease" in got:
            per_round = [float(a[4]) / float(b[4]) for a, b in zip([r for r in steady if r[0] == "lease" and r[1] == f"steady-{factor}"], rs)]
            ratio = f"{got['lease'] / got['redis']:.3f} ({min(per_round):.3f} to {max(per_round):.3f})"
        print(f"| {factor}x | {'lease' if mode == 'lease' else 'per-request Redis'} | {med([float(r[3]) for r in rs]):,.0f} | {med(adm):,.1f} ({min(adm):,.1f} to {max(adm):,.1f}) | {med([float(r[5]) for r in rs]):.2f} / {med([float(r[6]) for r in rs]):.2f} | {ratio} |")
PY
