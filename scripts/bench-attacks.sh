#!/usr/bin/env bash
# Attack benchmark: what ORDINARY clients see while each known HTTP/2 or connection attack runs,
# sluice serve and nginx side by side, same limits, same upstreams, same run.
#
#   scripts/bench-attacks.sh [ROUNDS] [SECONDS]
#
# For each attack (crates/sluice-server/examples/h2_attack.rs drives them; `h2_attack` without
# arguments lists them) and a baseline without attack, ROUNDS rounds (default 3), each round
# running every attack against a fresh sluice and a fresh nginx in turn (which goes first
# alternates between rounds):
#   1. the gateway starts, under `prlimit --nofile=656:656`, and is warmed up;
#   2. the attack starts; after 1 s (its connections are up) the ordinary client runs for
#      SECONDS (default 5): h2load over h2c with prior knowledge, RATE (default 100) new
#      connections a second, one `GET /` on each (-r RATE/10 --rate-period 100ms -m 1,
#      -N 5s), so every ordinary request also has to get a connection in;
#   3. the attack is stopped (SIGTERM) when h2load is done, and prints what the server did to
#      its connections.
# Each run records: p50 and p99 of the answered ordinary requests (h2load's per-request log:
# from the request to the end of its response; connections refused or unanswered count as
# failed), success (2xx of the requests h2load was to send), the gateway's RSS (before, the
# peak sampled every 200 ms during the run), its CPU, the attacker's CPU, and the most
# connections the slow upstream held at once until h2load was done.
#
# Upstreams, shared by both gateways and every run: nginx `return 200` (`/`, the ordinary
# requests), the slow upstream of h2_attack (`/slow/MS`, answered after MS ms) and the Python
# WebSocket echo server of the tests (`/ws/`). nginx's plain HTTP/2 needs a port of its own
# (`listen ... http2`), so the HTTP/1.1 attacks (WebSocket, slowloris, slow body, pipelining) go
# to its HTTP/1.1 port (same server block, same workers); sluice serves both on one listener.
#
# Before each run it waits while rustc runs (another build would take the CPU from the
# measurement; WAIT_FOR_RUSTC=0: it does not), and a run during which anything else (h2load and
# this script included) took more than NOISE (default 30) % of a core is done again, up to
# TRIES (default 6) times. Prints a Markdown section on stdout; raw outputs
# (h2load, the attacker, sluice's counters) go to $OUT. ATTACKS="a b ..." runs only those
# (`baseline` is the row without attack); BUILD=0 uses the binaries already built (in
# $CARGO_TARGET_DIR/release, or target/release). NGINX_CONNECTIONS (default 200) is nginx's
# worker_connections, per worker.
# Needs h2load (nghttp2-client), nginx with HTTP/2 (nginx-light), prlimit (util-linux), curl,
# and a Python with `websockets` (target/pyenv, made by scripts/test, or PYTHON=...).
set -euo pipefail

ROUNDS=${1:-3}
SECS=${2:-5}
RATE=${RATE:-100}
# nginx's worker_connections (per worker, client and upstream sockets together).
NGINX_CONNECTIONS=${NGINX_CONNECTIONS:-200}
RAMP=1
NOISE=${NOISE:-30}
TRIES=${TRIES:-6}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-attacks-XXXXXX)
OUT=${OUT:-$WORK/raw.txt}
NGINX=${NGINX:-/usr/sbin/nginx}
H2LOAD=${H2LOAD:-h2load}
PYTHON=${PYTHON:-$ROOT/target/pyenv/bin/python}
NOFILE=656 # 2 x max_connections (200) + 256
ALL_ATTACKS="baseline batched-rapid-reset paced-rapid-reset made-you-reset continuation hpack-bomb stream-cap settings-flood ping-flood zero-window cancelled-streams stalled-bodies upstream-multiplication websocket slowloris slow-body pipelining"
# The attacks that speak HTTP/1.1: to nginx's HTTP/1.1 port (sluice serves both on one).
HTTP1_ATTACKS=" websocket slowloris slow-body pipelining "
read -r -a LIST <<<"${ATTACKS:-$ALL_ATTACKS}"

# free_port, wait_port
# shellcheck source=scripts/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

need() { # tool, where it comes from
  command -v "$1" >/dev/null 2>&1 || { echo "bench-attacks: \`$1\` not found: $2" >&2; exit 2; }
}
need "$H2LOAD" "install nghttp2-client (h2load), or set H2LOAD"
need "$NGINX" "install nginx-light, or set NGINX"
need prlimit "install util-linux"
need curl "install curl"
need python3 "install python3"
need cargo "install Rust (https://rustup.rs)"
"$NGINX" -V 2>&1 | grep -q -- --with-http_v2_module ||
  { echo "bench-attacks: $NGINX has no HTTP/2 module (--with-http_v2_module)" >&2; exit 2; }
[ -x "$PYTHON" ] || PYTHON=python3
"$PYTHON" -c 'import websockets' 2>/dev/null || {
  echo "bench-attacks: $PYTHON cannot import websockets: run scripts/test once (it makes target/pyenv)," >&2
  echo "or set PYTHON to a Python with websockets (pip install -r scripts/test-requirements.txt)" >&2
  exit 2
}

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_quiet() { # another build takes the CPU: wait for it
  [ "${WAIT_FOR_RUSTC:-1}" = 1 ] || return 0
  local said=
  while [ "$(pgrep -c rustc || true)" -gt 0 ]; do
    [ -n "$said" ] || { echo "rustc is running: waiting for it to finish..." >&2; said=1; }
    sleep 5
  done
}

# Cargo's target directory, as cargo itself picks it.
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SLUICE=$TARGET/release/sluice
ATTACKER=$TARGET/release/examples/h2_attack
if [ "${BUILD:-1}" = 1 ]; then
  echo "building sluice and the attack driver (release)..." >&2
  (cd "$ROOT" && cargo build --release -q -p sluice-server --bin sluice --example h2_attack)
fi
[ -x "$SLUICE" ] && [ -x "$ATTACKER" ] || { echo "bench-attacks: $SLUICE or $ATTACKER missing (BUILD=0?)" >&2; exit 2; }

UP=$(free_port); SLOW=$(free_port)
SL=$(free_port); SLA=$(free_port); NG=$(free_port); NGW=$(free_port)

nginx_conf() { # dir body workers worker_connections -> nginx.conf in dir
  local dir=$1
  mkdir -p "$dir/logs" "$dir/tmp"
  cat > "$dir/nginx.conf" <<CONF
worker_processes $3;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections $4; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  $2
}
CONF
}

# The upstreams.
nginx_conf "$WORK/upstream" "server { listen 127.0.0.1:$UP; keepalive_requests 1000000; location / { return 200 \"ok\\n\"; } }" auto 8192
"$NGINX" -p "$WORK/upstream" -c "$WORK/upstream/nginx.conf" -e "$WORK/upstream/logs/error.log" &
PIDS+=($!)
"$ATTACKER" upstream "$SLOW" &
PIDS+=($!)
mkfifo "$WORK/ws.in"
"$PYTHON" "$ROOT/crates/sluice-server/tests/py/ws_server.py" < "$WORK/ws.in" > "$WORK/ws.log" 2>&1 &
PIDS+=($!)
exec 8> "$WORK/ws.in" # the server runs until this closes
for _ in $(seq 100); do grep -q '^PORT' "$WORK/ws.log" && break; sleep 0.1; done
WS=$(awk '/^PORT/ {print $2; exit}' "$WORK/ws.log")
[ -n "$WS" ] || { echo "the WebSocket server did not start: $(cat "$WORK/ws.log")" >&2; exit 1; }
wait_port "$UP"; wait_port "$SLOW"; sleep 0.3
# Every process of the bench but the gateway under test and the attacker.
UPSTREAM_PIDS="$(pgrep -P "${PIDS[0]}" | tr '\n' ' ') ${PIDS[1]} ${PIDS[2]}"

# The gateways, both: 2 workers, 200 client connections, body and send timeouts 3 s,
# keep-alive 5 s, 128 streams per HTTP/2 connection, 1,000 requests per connection.
cat > "$WORK/sluice.toml" <<CONF
[server]
listen = "127.0.0.1:$SL"
admin_listen = "127.0.0.1:$SLA"
workers = 2
max_connections = 200
max_upstream_connections = 200
max_upstream_per_connection = 32
max_requests_per_connection = 1000
header_read_timeout = "10s"
keep_alive_timeout = "5s"
send_timeout = "3s"
client_body_timeout = "3s"
h2c = true

[[policy]]
name = "open"
algorithm = "gcra"
capacity = 1000000
rate = "1000000/s"
key = "ip"

[[route]]
path_prefix = "/"
policies = ["open"]
upstream = "http://127.0.0.1:$UP"

[[route]]
path_prefix = "/slow/"
policies = ["open"]
upstream = "http://127.0.0.1:$SLOW"

[[route]]
path_prefix = "/ws/"
policies = ["open"]
upstream = "http://127.0.0.1:$WS"
CONF
PROXY='proxy_http_version 1.1; proxy_set_header Connection "";'
nginx_conf "$WORK/nginx" "
  keepalive_timeout 5s;
  keepalive_requests 1000;
  client_header_timeout 10s;
  client_body_timeout 3s;
  send_timeout 3s;
  http2_max_concurrent_streams 128;
  limit_req_zone \$binary_remote_addr zone=open:10m rate=1000000r/s;
  limit_req_status 429;
  upstream up { server 127.0.0.1:$UP; keepalive 16; }
  upstream slow { server 127.0.0.1:$SLOW; keepalive 16; }
  map \$http_upgrade \$connection_upgrade { default upgrade; \"\" close; }
  server {
    listen 127.0.0.1:$NG http2 reuseport;
    listen 127.0.0.1:$NGW reuseport;
    limit_req zone=open burst=1000000 nodelay;
    location / { proxy_pass http://up; $PROXY }
    location /slow/ { proxy_pass http://slow; $PROXY }
    location /ws/ { proxy_pass http://127.0.0.1:$WS; proxy_http_version 1.1;
      proxy_set_header Upgrade \$http_upgrade; proxy_set_header Connection \$connection_upgrade;
      proxy_read_timeout 5s; proxy_send_timeout 3s; }
  }" 2 "$NGINX_CONNECTIONS"

GW_PID=
start_gateway() { # sluice|nginx
  case $1 in
    sluice)
      SLUICE_LOG=warn prlimit --nofile=$NOFILE:$NOFILE "$SLUICE" serve --config "$WORK/sluice.toml" 2>>"$WORK/sluice.log" &
      GW_PID=$!; wait_port "$SL" ;;
    nginx)
      prlimit --nofile=$NOFILE:$NOFILE "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/logs/error.log" &
      GW_PID=$!; wait_port "$NG"; wait_port "$NGW" ;;
  esac
  PIDS+=("$GW_PID")
}
stop_gateway() {
  kill "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
  # nginx's workers leave after their master.
  for _ in $(seq 100); do pgrep -P "$GW_PID" >/dev/null || break; sleep 0.05; done
}
serving_pids() { # nginx: the workers; sluice: itself
  local workers
  workers=$(pgrep -P "$GW_PID" | tr '\n' ' ' || true)
  echo "${workers:-$GW_PID}"
}
rss_kib() { # pids... -> VmRSS summed, KiB
  local p sum=0 v
  for p in "$@"; do
    v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
cpu_ticks() { # pids... -> user + system clock ticks summed
  local p sum=0 a b
  for p in "$@"; do
    read -r a b < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null || echo "0 0")
    sum=$((sum + a + b))
  done
  echo "$sum"
}
TICK=$(getconf CLK_TCK)
machine_ticks() { # user + nice + system clock ticks of the whole machine
  awk '$1 == "cpu" {print $2 + $3 + $4; exit}' /proc/stat
}

# One run -> $WORK/result: "p50_ms p99_ms ok_pct answered rss_before_kib rss_peak_kib server_cpu_pct
# attacker_cpu_pct upstream_peak others_cpu_pct"; what the server did to the attacker -> $WORK/outcome.
# others_cpu_pct: the CPU the machine spent meanwhile on anything but the gateway, the attacker and
# the upstreams (h2load, this script, and whatever else runs), % of one core.
run_one() { # server attack
  local server=$1 attack=$2 port ws_port pids log="$WORK/h2load.log" total
  start_gateway "$server"
  if [ "$server" = sluice ]; then port=$SL; ws_port=$SL; else port=$NG; ws_port=$NGW; fi
  pids=$(serving_pids)
  "$H2LOAD" -c2 -n20 "http://127.0.0.1:$port/" >/dev/null 2>&1 || true
  curl -s "http://127.0.0.1:$SLOW/__peak" >/dev/null
  local rss0 cpu0 t0 m0 u0 apid= aticks=0
  # shellcheck disable=SC2086 # one argument per pid
  rss0=$(rss_kib $pids)
  # shellcheck disable=SC2086
  cpu0=$(cpu_ticks $pids)
  # shellcheck disable=SC2086
  u0=$(cpu_ticks $UPSTREAM_PIDS)
  m0=$(machine_ticks)
  t0=$(date +%s.%N)
  if [ "$attack" != baseline ]; then
    local target=$port
    [[ "$HTTP1_ATTACKS" == *" $attack "* ]] && target=$ws_port
    "$ATTACKER" "$attack" "$target" $((RAMP + SECS + 20)) > "$WORK/attack.out" 2>&1 &
    apid=$!
    sleep "$RAMP"
  fi
  # RSS sampled every 200 ms while the ordinary client runs.
  # shellcheck disable=SC2086
  (while :; do rss_kib $pids; sleep 0.2; done) > "$WORK/rss.samples" &
  local sampler=$!
  total=$((RATE * SECS))
  local out
  out=$(timeout $((SECS + 30)) "$H2LOAD" -t1 -r $((RATE / 10)) --rate-period 100ms -c "$total" -n "$total" -m1 -N 5s \
    --log-file="$log" "http://127.0.0.1:$port/" 2>&1 || true)
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  # While the attack still runs (as it ends, the slow upstream notices the closed sockets
  # only after the gateway may have opened new ones).
  local up
  up=$(curl -s "http://127.0.0.1:$SLOW/__peak" | awk '{print ($2 > 0 ? $2 - 1 : 0)}') # less the one asking
  local outcome="none (no attack)" acpu=0
  if [ -n "$apid" ]; then
    kill -TERM "$apid" 2>/dev/null || true
    wait "$apid" 2>/dev/null || true
    outcome=$(sed -n 's/^outcome //p' "$WORK/attack.out")
    [ -n "$outcome" ] || outcome="(the attacker printed nothing: $(tail -c 300 "$WORK/attack.out" | tr '\n' ' '))"
    acpu=$(awk -v k="$TICK" '/^summary/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%.0f", (v["seconds"] > 0 ? 100 * v["cpu_ticks"] / k / v["seconds"] : 0) }' "$WORK/attack.out")
    aticks=$(sed -n 's/^summary.* cpu_ticks=\([0-9]*\).*/\1/p' "$WORK/attack.out")
  fi
  local cpu1 t1 m1 u1 peak
  # shellcheck disable=SC2086
  cpu1=$(cpu_ticks $pids)
  # shellcheck disable=SC2086
  u1=$(cpu_ticks $UPSTREAM_PIDS)
  m1=$(machine_ticks)
  t1=$(date +%s.%N)
  peak=$(sort -n "$WORK/rss.samples" | tail -1)
  {
    echo "=== $server $attack"
    echo "$out"
    [ -z "$apid" ] || cat "$WORK/attack.out"
    echo "RSS KiB before $rss0, peak ${peak:-0}; slow upstream peak connections ${up:-?}"
  } >> "$OUT"
  if [ "$server" = sluice ]; then
    # How sluice counted it.
    curl -s "http://127.0.0.1:$SLA/metrics" | grep -E '^sluice_(connections_refused_total|upstream_budget_refused_total|connection_timeouts_total|connections_closed_early_total)' |
      grep -v ' 0$' >> "$OUT" || true
  fi
  echo "$outcome" > "$WORK/outcome"
  stop_gateway
  local ok answered p50 p99
  ok=$(awk '/^status codes:/ {print $3 + 0}' <<<"$out")
  answered=$(awk -F'\t' '$2 > 0' "$log" 2>/dev/null | wc -l)
  read -r p50 p99 < <(awk -F'\t' '$2 > 0 {print $3}' "$log" 2>/dev/null | sort -n |
    awk '{v[NR] = $1} END { if (NR == 0) { print "nan nan"; exit }
      i50 = int(NR * 0.50 + 0.5); i99 = int(NR * 0.99 + 0.5); if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1
      printf "%.2f %.2f\n", v[i50] / 1000, v[i99] / 1000 }')
  rm -f "$log"
  awk -v p50="$p50" -v p99="$p99" -v ok="${ok:-0}" -v total="$total" -v answered="$answered" -v r0="$rss0" -v peak="${peak:-0}" \
    -v c="$((cpu1 - cpu0))" -v k="$TICK" -v t0="$t0" -v t1="$t1" -v a="$acpu" -v up="${up:-0}" \
    -v others="$((m1 - m0 - (cpu1 - cpu0) - (u1 - u0) - ${aticks:-0}))" \
    'BEGIN { printf "%s %s %.1f %d %d %d %.0f %s %s %.0f\n", p50, p99, 100 * ok / total, answered, r0, peak,
      100 * c / k / (t1 - t0), a, up, 100 * others / k / (t1 - t0) }' > "$WORK/result"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
declare -A S OUTCOME
REDONE=0 NOISY=0
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then ORDER="sluice nginx"; else ORDER="nginx sluice"; fi
  for attack in "${LIST[@]}"; do
    for server in $ORDER; do
      # A run during which other work took more than NOISE % of a core is done again (at
      # most TRIES times in all; then the last one is kept and counted).
      for try in $(seq "$TRIES"); do
        wait_quiet
        run_one "$server" "$attack"
        result=$(cat "$WORK/result")
        others=$(awk '{print $10}' <<<"$result")
        [ "$others" -gt "$NOISE" ] || break
        if [ "$try" = "$TRIES" ]; then NOISY=$((NOISY + 1)); break; fi
        echo "round $round $attack $server: other processes took $others % of a core: again" >&2
        REDONE=$((REDONE + 1))
      done
      S[$server:$attack]+="$result"$'\n'
      OUTCOME[$server:$attack]=$(cat "$WORK/outcome")
      echo "round $round $attack $server: $result | ${OUTCOME[$server:$attack]}" >&2
    done
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

col() { # key column -> the samples of that column, one a line
  printf '%s' "${S[$1]:-}" | awk -v c="$2" 'NF {print $c}'
}
# nan: no request was answered in that round.
median() { sort -g | awk '{v[NR] = $1} END { m = NR ? v[int((NR + 1) / 2)] : "nan"; print (m == "nan" ? "–" : m) }'; }
spread() { # the samples -> " (min–max)" when they differ, and the rounds without an answer
  awk '$1 == "nan" {none++; next} {print} END {print "none", none + 0}' | sort -g |
    awk '$1 == "none" {none = $2; next} {v[++n] = $1}
      END { if (n > 1 && v[1] != v[n]) printf " (%s–%s)", v[1], v[n]; if (none && n) printf " (no answer in %d rounds)", none }'
}
fig() { # key column -> median (min–max)
  echo "$(col "$1" "$2" | median)$(col "$1" "$2" | spread)"
}
growth() { # key -> median of peak - before, MiB
  printf '%s' "${S[$1]:-}" | awk 'NF {printf "%.1f\n", ($6 - $5) / 1024}' | median
}
before() { printf '%s' "${S[$1]:-}" | awk 'NF {printf "%.1f\n", $5 / 1024}' | median; }
row() { # attack
  local s="sluice:$1" n="nginx:$1"
  printf '| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s |\n' "$1" \
    "$(col "$s" 1 | median)" "$(fig "$s" 2)" "$(fig "$s" 3)" \
    "$(col "$n" 1 | median)" "$(fig "$n" 2)" "$(fig "$n" 3)" \
    "$(growth "$s")" "$(growth "$n")" "$(col "$s" 7 | median)" "$(col "$n" 7 | median)" \
    "$(col "$s" 8 | median)" "$(col "$n" 8 | median)" "$(col "$s" 9 | median)" "$(col "$n" 9 | median)"
}
did() { printf '| %s | %s | %s |\n' "$1" "${OUTCOME[sluice:$1]}" "${OUTCOME[nginx:$1]}"; }
# The rows where sluice did worse by these figures: fewer requests served (by more than 1 point
# of the medians), or a p99 over 1.5 times nginx's and more than 1 ms above it.
worse() {
  local attack s n out=()
  for attack in "${LIST[@]}"; do
    s="sluice:$attack"; n="nginx:$attack"
    awk -v so="$(col "$s" 3 | median)" -v no="$(col "$n" 3 | median)" 'BEGIN { exit !(so + 1 < no) }' &&
      out+=("$attack (ok $(col "$s" 3 | median) % against $(col "$n" 3 | median) %)")
    awk -v sp="$(col "$s" 2 | median)" -v np="$(col "$n" 2 | median)" \
      'BEGIN { exit !(sp != "–" && np != "–" && sp > 1.5 * np && sp > np + 1) }' &&
      out+=("$attack (p99 $(col "$s" 2 | median) ms against $(col "$n" 2 | median) ms)")
  done
  if [ ${#out[@]} = 0 ]; then echo "none"; else local IFS=';'; echo "${out[*]}" | sed 's/;/; /g'; fi
}
dirty=$(cd "$ROOT" && git status --porcelain -- crates Cargo.toml Cargo.lock | head -1)

cat <<MD

## Attacks: ordinary requests during HTTP/2 and connection attacks, sluice serve vs nginx

Command: \`scripts/bench-attacks.sh $ROUNDS $SECS\` ($STARTED, commit $(cd "$ROOT" && git rev-parse --short HEAD)$([ -n "$dirty" ] && echo " with uncommitted changes in crates/"),
$(nproc) cores, load average $LOAD_BEFORE before the run and $LOAD_AFTER after; sluice release build, nginx
$("$NGINX" -v 2>&1 | sed 's/.*nginx\///') ($(dpkg-query -W -f='${Version}' nginx-light 2>/dev/null || echo "version unknown")), h2load $("$H2LOAD" --version | awk '{print $NF}')).

Both gateways: 2 workers, under \`prlimit --nofile=$NOFILE:$NOFILE\` (2 × 200 + 256), body and send timeouts 3 s, keep-alive
5 s, header timeout 10 s, 128 concurrent streams per HTTP/2 connection, 1,000 requests per connection, access logs off, one
admit-everything limit on every request (sluice: GCRA keyed by IP, capacity 1e6; nginx: \`limit_req\` 1e6 r/s, burst 1e6),
HTTP/1.1 keep-alive to the upstreams.

- sluice: \`workers = 2\`, \`max_connections = 200\` (client connections, whole process), \`max_upstream_connections = 200\`,
  \`max_upstream_per_connection = 32\`, \`max_requests_per_connection = 1000\`, \`send_timeout\` and
  \`client_body_timeout = "3s"\`, \`keep_alive_timeout = "5s"\` (also the idle limit of a WebSocket tunnel),
  \`header_read_timeout = "10s"\`, \`h2c = true\` on its one listener.
- nginx: \`worker_processes 2\`, \`worker_connections $NGINX_CONNECTIONS\` (per worker, client and upstream connections together:
  2 × $NGINX_CONNECTIONS = $((2 * NGINX_CONNECTIONS)); sluice may hold 200 client and 200 upstream sockets; an idle client needs one slot, so up to $((2 * NGINX_CONNECTIONS)) idle
  clients fit), \`listen ... http2 reuseport\` (h2c) and a second \`listen ... reuseport\` for HTTP/1.1 (the HTTP/1.1
  attacks: WebSocket, slowloris, slow body, pipelining), \`keepalive_timeout 5s\`, \`keepalive_requests 1000\`, \`send_timeout 3s\`, \`client_body_timeout 3s\`,
  \`client_header_timeout 10s\`, \`http2_max_concurrent_streams 128\`, upstream \`keepalive 16\`; the WebSocket location:
  \`proxy_http_version 1.1\`, \`Upgrade\` and \`Connection\` passed on, \`proxy_read_timeout 5s\` (the idle limit).
- Upstreams: nginx \`return 200\` for \`/\`; h2_attack's slow upstream for \`/slow/MS\` (answered after MS ms); the tests'
  Python \`websockets\` echo server for \`/ws/\`.

Ordinary client: h2load over h2c, $RATE new connections a second for $SECS s, one \`GET /\` on each ($((RATE * SECS)) requests),
started 1 s after the attack. p50 and p99 in ms over the requests answered (any status), from the request to the end of
its response; ok = 2xx of the $((RATE * SECS)) requests (a connection refused, closed or unanswered for 5 s is a failure).
$ROUNDS rounds, sluice and nginx alternately, a fresh gateway for every run; medians, with (min–max) over the rounds when
they differ. A run during which other processes (h2load and the script included) took more than $NOISE % of a core was
done again: $REDONE runs were, and $NOISY kept after $TRIES tries. RSS: growth of the peak (sampled every 200 ms) over the RSS before the attack, MiB (sluice: the process, about
$(before sluice:baseline) MiB before; nginx: its 2 workers summed, about $(before nginx:baseline) MiB). CPU: % of one core during the run,
the gateway's (nginx: its workers) and the attacker's (one thread). Slow-upstream conns: the most connections the slow
upstream held at once, from the attack's start until the ordinary client was done. The attacks are listed in \`crates/sluice-server/examples/h2_attack.rs\`.

| attack | sluice p50 | sluice p99 | sluice ok % | nginx p50 | nginx p99 | nginx ok % | RSS growth MiB, sluice / nginx | gateway CPU %, sluice / nginx | attacker CPU %, vs sluice / nginx | slow-upstream conns, sluice / nginx |
|---|---|---|---|---|---|---|---|---|---|---|
$(for attack in "${LIST[@]}"; do row "$attack"; done)

Where sluice did worse than nginx by these figures (ok more than 1 point lower, or p99 over 1.5 times nginx's and more than
1 ms above it): $(worse).

What each server did to the attacker's connections (the last round; every round is in the raw output):

| attack | sluice | nginx |
|---|---|---|
$(for attack in "${LIST[@]}"; do did "$attack"; done)
MD
echo "raw output: $OUT" >&2
