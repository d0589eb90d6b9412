#!/usr/bin/env bash
# A live quota change under load: `PUT /v1/policies/q` while wrk drives 10,000 keys of a
# queued policy at full speed, against the same run without the change.
#
#   scripts/bench-reload.sh [SECONDS] [CONNECTIONS] [ROUNDS]
#
# The policy: token_bucket, capacity 5, 1/s per key (`key = "header:x-user"`, 10,000 users
# picked at random by wrk), a queue of 4 per key waiting at most 200 ms, in memory. Each round
# runs wrk for SECONDS (default 4) twice: `steady` (no change) and `put` (at SECONDS/2,
# `PUT /v1/policies/q {"capacity": 8}`). Printed per row, medians over ROUNDS (default 3): the
# requests per second, wrk's p50 and p99, the time the PUT took to apply (curl's total time:
# the answer is sent once the new quota is in force), and the requests admitted (2xx) against
# the bound of 10,000 keys × (largest capacity + rate × SECONDS). With SLUICE_BASE=<commit>,
# that commit's gateway runs the same rows in the same rounds (built in a worktree under
# target/bench-ab/), so the table shows the change before and after.
#
# Everything listens on 127.0.0.1 ports chosen at start; nginx (`return 200`) is the upstream.
set -euo pipefail

SECONDS_RUN=${1:-4}
CONNS=${2:-64}
ROUNDS=${3:-3}
KEYS=10000
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-bench-reload-XXXXXX)
NGINX=${NGINX:-/usr/sbin/nginx}
PIDS=()
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/nginx/nginx.pid" ] && kill "$(cat "$WORK/nginx/nginx.pid")" 2>/dev/null || true
}
trap cleanup EXIT

command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 2; }
(cd "$ROOT" && cargo build --release -q -p sluice-server --bin sluice)
declare -A BIN=([sluice]="$ROOT/target/release/sluice")
if [ -n "${SLUICE_BASE:-}" ]; then
  base=$(cd "$ROOT" && git rev-parse --verify --short=12 "$SLUICE_BASE^{commit}") ||
    { echo "SLUICE_BASE: no commit \`$SLUICE_BASE\`" >&2; exit 2; }
  tree="$ROOT/target/bench-ab/$base"
  [ -d "$tree" ] || (cd "$ROOT" && git worktree add --detach -f "$tree" "$base" >/dev/null)
  (cd "$tree" && CARGO_TARGET_DIR="$ROOT/target/bench-ab/target" cargo build --release -q -p sluice-server --bin sluice)
  BIN[base]="$ROOT/target/bench-ab/target/release/sluice"
fi

# The upstream: nginx answering 200 at once.
up=$(free_port)
mkdir -p "$WORK/nginx/logs"
cat > "$WORK/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$up; keepalive_requests 1000000; location / { return 200 "ok\n"; } }
}
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf"
wait_port "$up"

# Ten thousand users, one picked at random per request.
cat > "$WORK/users.lua" <<EOF
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/api/x", { ["x-user"] = "u" .. math.random(1, $KEYS) })
end
EOF

declare -A PORT ADMIN
for name in "${!BIN[@]}"; do
  PORT[$name]=$(free_port)
  ADMIN[$name]=$(free_port)
done

# Starts gateway $1 afresh (every key full, capacity 5) and waits for it.
start() {
  local name=$1
  cat > "$WORK/$name.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[$name]}"
admin_listen = "127.0.0.1:${ADMIN[$name]}"
workers = 1

[[policy]]
name = "q"
algorithm = "token_bucket"
capacity = 5
rate = "1/s"
key = "header:x-user"
max_keys = 20000
queue = { depth = 4, max_wait = "200ms" }

[[route]]
path_prefix = "/api/"
policies = ["q"]
upstream = "http://127.0.0.1:$up"
EOF
  "${BIN[$name]}" serve --config "$WORK/$name.toml" > "$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  GW=$!
  wait_port "${PORT[$name]}"
}

stop() { kill "$GW" 2>/dev/null || true; wait "$GW" 2>/dev/null || true; }

# One wrk run against gateway $1; with $2 = put, the PUT goes out halfway. Appends
# "rps p50_ms p99_ms put_ms admitted" to $WORK/$1-$2.txt.
run() {
  local name=$1 row=$2 put_ms=0
  start "$name"
  wrk -t 2 -c "$CONNS" -d "${SECONDS_RUN}s" --latency -s "$WORK/users.lua" \
    "http://127.0.0.1:${PORT[$name]}" > "$WORK/wrk.txt" &
  local wrk_pid=$!
  if [ "$row" = put ]; then
    sleep "$(awk -v s="$SECONDS_RUN" 'BEGIN { print s / 2 }')"
    put_ms=$(curl -s -o "$WORK/put.json" -w '%{time_total}' -X PUT \
      -H 'content-type: application/json' -d '{"capacity": 8}' \
      "http://127.0.0.1:${ADMIN[$name]}/v1/policies/q" | awk '{ printf "%.2f", $1 * 1000 }')
    grep -q '"persisted":false' "$WORK/put.json" || { echo "PUT failed: $(cat "$WORK/put.json")" >&2; exit 1; }
  fi
  wait "$wrk_pid"
  stop
  awk -v put="$put_ms" '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    / 50%/ { p50 = ms($2) } / 99%/ { p99 = ms($2) }
    /requests in/ { total = $1 }
    /Non-2xx or 3xx responses/ { non2xx = $5 }
    /Requests\/sec/ { rps = $2 }
    END { printf "%.0f %.3f %.3f %s %d\n", rps, p50, p99, put, total - non2xx }
  ' "$WORK/wrk.txt" >> "$WORK/$name-$row.txt"
}

for round in $(seq "$ROUNDS"); do
  for name in "${!BIN[@]}"; do
    for row in steady put; do
      run "$name" "$row"
    done
  done
  echo "round $round done" >&2
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }
bound=$(awk -v k=$KEYS -v s="$SECONDS_RUN" 'BEGIN { print k * (8 + s) }')
commit=$(cd "$ROOT" && git rev-parse --short=12 HEAD)
echo "#### A live quota change under load ($(date -u +%F), $commit$([ -n "${SLUICE_BASE:-}" ] && echo ", base $base"))"
echo
echo "\`scripts/bench-reload.sh $SECONDS_RUN $CONNS $ROUNDS\`: wrk -t 2 -c $CONNS for ${SECONDS_RUN} s over $KEYS keys; medians of $ROUNDS rounds (spread in brackets)."
echo
echo "| gateway | row | req/s | p50 ms | p99 ms | PUT applied in ms | admitted (bound $bound) |"
echo "|---|---|---|---|---|---|---|"
for name in $(printf '%s\n' "${!BIN[@]}" | sort -r); do
  for row in steady put; do
    f="$WORK/$name-$row.txt"
    col() { cut -d' ' -f"$1" "$f"; }
    printf '| %s | %s | %s (%s) | %s | %s (%s) | %s | %s (%s) |\n' "$name" "$row" \
      "$(col 1 | median)" "$(col 1 | spread)" "$(col 2 | median)" \
      "$(col 3 | median)" "$(col 3 | spread)" "$(col 4 | median)" \
      "$(col 5 | median)" "$(col 5 | spread)"
  done
done
