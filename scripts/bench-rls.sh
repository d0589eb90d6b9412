#!/usr/bin/env bash
# Envoy rate limit service benchmark: decisions per second and latency of sluice's RLS
# (gRPC ShouldRateLimit over h2c) beside its own decision API (`POST /v1/check`, HTTP/1.1),
# same policy, same machine, in memory and on Redis.
#
#   scripts/bench-rls.sh [REQUESTS] [CONNECTIONS] [STREAMS]
#
# Runs h2load (nghttp2-client) with a prepared request body file:
#   rls     h2load -> sluice rls_listen: one descriptor (remote_address + path) per call, as
#           Envoy's rate_limit filter sends it; `-d` with the gRPC-framed RateLimitRequest,
#           `-H 'content-type: application/grpc' -H 'te: trailers'`; STREAMS concurrent
#           streams per connection (default 1; Envoy multiplexes on few connections)
#   check   h2load --h1 -> sluice admin_listen POST /v1/check {"policy","key"}: one decision
#           per request, one request at a time per connection
# each with the store in memory and on Redis (a redis-server started here), REQUESTS requests
# (default 200000) over CONNECTIONS connections (default 16). The policy never denies
# (capacity 1e9, 1e6/s), so every request is one full decision. Latency percentiles come
# from h2load's per-request log (--log-file). Uses target/release/sluice (built if missing);
# prints a Markdown table on stdout.
#
# Everything listens on 127.0.0.1 ports chosen at start.
set -euo pipefail

REQUESTS=${1:-200000}
CONNS=${2:-16}
STREAMS=${3:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-bench-rls-XXXXXX)
H2LOAD=${H2LOAD:-h2load}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
SLUICE=${SLUICE_BIN:-$ROOT/target/release/sluice}
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in "$H2LOAD" "$REDIS_SERVER" python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench-rls: $tool is missing" >&2; exit 1; }
done
if [ ! -x "$SLUICE" ]; then
  (cd "$ROOT" && cargo build --release -p sluice-server --bin sluice >&2)
fi

# free_port, wait_port
# shellcheck source=scripts/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

# The gRPC request body: a 5-byte frame header (not compressed, big-endian length) and a
# RateLimitRequest {domain: "edge", descriptors: [{entries: [remote_address=10.1.2.3,
# path=/api/search]}]}, protobuf-encoded by hand (field numbers of
# envoy/service/ratelimit/v3/rls.proto and envoy/extensions/common/ratelimit/v3).
python3 - "$WORK/rls.bin" <<'EOF'
import struct, sys
def field(num, payload):
    out = bytes([num << 3 | 2])
    n = len(payload)
    while n >= 0x80:
        out += bytes([n & 0x7f | 0x80]); n >>= 7
    return out + bytes([n]) + payload
def entry(k, v):
    return field(1, field(1, k.encode()) + field(2, v.encode()))
descriptor = entry("remote_address", "10.1.2.3") + entry("path", "/api/search")
message = field(1, b"edge") + field(2, descriptor)
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(message)) + message)
EOF
printf '{"policy":"search","key":"10.1.2.3"}' >"$WORK/check.json"

REDIS_PORT=$(free_port)
"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT"

start_sluice() { # name store_toml -> sets RLS_PORT ADMIN_PORT SLUICE_PID
  local name=$1 store=$2
  local port admin rls
  port=$(free_port); admin=$(free_port); rls=$(free_port)
  cat >"$WORK/$name.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
rls_listen = "127.0.0.1:$rls"

$store

[[policy]]
name = "search"
capacity = 1000000000
rate = "1000000/s"
key = "ip"

[[route]]
path_prefix = "/"
policies = ["search"]
upstream = "http://127.0.0.1:9"

[[rls]]
domain = "edge"
match = [{ key = "remote_address" }, { key = "path", value = "/api/search" }]
policy = "search"
EOF
  SLUICE_LOG=warn "$SLUICE" serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" &
  SLUICE_PID=$!
  PIDS+=("$SLUICE_PID")
  wait_port "$admin"
  wait_port "$rls"
  RLS_PORT=$rls
  ADMIN_PORT=$admin
}

# name log -> "req/s p50_us p99_us ok_of_total"
summarize() {
  python3 - "$1" "$2" <<'EOF'
import sys
out, log = open(sys.argv[1]).read(), sys.argv[2]
rps = next(l.split(",")[1].split()[0] for l in out.splitlines() if l.startswith("finished in"))
req = next(l for l in out.splitlines() if l.startswith("requests:"))
status = [l for l in out.splitlines() if l.startswith("status codes:")][0]
lat = sorted(int(l.split("\t")[2]) for l in open(log) if l.strip())
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
print(f"{rps} {p(0.5)} {p(0.99)} {req.split(',')[3].split()[0]}/{req.split()[1]}")
EOF
}

run() { # label url extra-args...
  local label=$1 url=$2
  shift 2
  "$H2LOAD" -n "$REQUESTS" -c "$CONNS" --log-file="$WORK/$label.tsv" "$@" "$url" >"$WORK/$label.out" 2>&1
  summarize "$WORK/$label.out" "$WORK/$label.tsv"
}

echo "### RLS (gRPC) and /v1/check decisions: $REQUESTS requests, $CONNS connections"
echo
echo "| store | API | client | decisions/s | p50 | p99 | succeeded |"
echo "|---|---|---|---:|---:|---:|---:|"
for store in memory redis; do
  case $store in
    memory) toml='[store]
backend = "memory"' ;;
    redis) toml="[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$REDIS_PORT\"
on_error = \"deny\"
timeout = \"1s\"" ;;
  esac
  start_sluice "$store" "$toml"
  # One call checked whole: HTTP 200, grpc-status 0 in the trailers, a policy in the answer.
  curl -s --http2-prior-knowledge --data-binary @"$WORK/rls.bin" -H 'content-type: application/grpc' \
    -H 'te: trailers' -D "$WORK/$store-call.head" -o "$WORK/$store-call.body" \
    "http://127.0.0.1:$RLS_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
  if ! grep -q '^grpc-status: 0' "$WORK/$store-call.head" || ! grep -q search "$WORK/$store-call.body"; then
    echo "bench-rls: the sample call failed:" >&2
    cat "$WORK/$store-call.head" >&2
    exit 1
  fi
  # Warm-up: connections, Redis scripts loaded.
  "$H2LOAD" -n 2000 -c "$CONNS" -d "$WORK/rls.bin" -H 'content-type: application/grpc' \
    -H 'te: trailers' "http://127.0.0.1:$RLS_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >/dev/null 2>&1
  read -r rps p50 p99 ok < <(run "$store-rls" \
    "http://127.0.0.1:$RLS_PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
    -m "$STREAMS" -d "$WORK/rls.bin" -H 'content-type: application/grpc' -H 'te: trailers')
  echo "| $store | RLS ShouldRateLimit (gRPC, h2c) | h2load -m $STREAMS | $rps | ${p50} µs | ${p99} µs | $ok |"
  read -r rps p50 p99 ok < <(run "$store-check" "http://127.0.0.1:$ADMIN_PORT/v1/check" \
    --h1 -d "$WORK/check.json" -H 'content-type: application/json')
  echo "| $store | POST /v1/check (HTTP/1.1) | h2load --h1 | $rps | ${p50} µs | ${p99} µs | $ok |"
  kill "$SLUICE_PID" 2>/dev/null || true
  wait "$SLUICE_PID" 2>/dev/null || true
done
echo
echo "h2load counts a call as succeeded by its HTTP status (200); one call per store is checked"
echo "for grpc-status 0 and a decoded policy first."
