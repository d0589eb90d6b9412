#!/usr/bin/env bash
# Gateway benchmark: `sluice serve` against nginx `limit_req`, same upstream, same run.
#
#   scripts/bench-gateway.sh [DURATION_SECONDS] [CONNECTIONS] [ROUNDS]
#
# Runs (wrk, --latency, 2 threads):
#   direct     wrk -> upstream (nginx `return 200`)
#   sluice     wrk -> sluice serve (release) -> upstream, effectively unlimited policy; its
#              plain HTTP/1.1 requests take the byte path (server.byte_path, the default)
#   nginx      wrk -> nginx limit_req (rate 1e6r/s, huge burst) -> upstream
#   haproxy    wrk -> HAProxy (nbthread 2, a stick table tracking http_req_rate per source
#              address, a deny rule it never meets, option forwardfor) -> upstream, keep-alive
#              both sides (http-reuse always)
#   nginx-same the same nginx doing the header work sluice does on every proxied request:
#              X-Forwarded-For appended (part of the gateway's contract) and a request id
#              (X-Request-Id: the client's, or a new one) sent upstream and echoed to the client
#   hyper      wrk -> a plain hyper proxy (benches/examples/plain_hyper_proxy.rs) -> upstream
#   sluice-429 every request denied (capacity 1, 1/h): answered 429 by sluice
#   nginx-429  every request denied (rate 1r/m, no burst): answered 429 by nginx
#   sluice-noid sluice with `request_id = false` (no X-Request-Id made up or echoed), beside
#              plain nginx `limit_req` (which does no such header work either)
# and the prototypes of a faster HTTP/1.1 path, doing the work of sluice-noid (a GCRA check per
# client address, X-Forwarded-For appended, hop-by-hop fields dropped, RateLimit fields added):
#   bytes      benches/examples/bytes_proxy.rs: heads forwarded as bytes, read with
#              sluice_http::wire (httparse, hyper's framing rules), hyper for anything else;
#              thread per core (a current-thread runtime, SO_REUSEPORT listener and upstream
#              connections per worker), 2 workers
#   bytes-429  the same prototype denying every request (429 problem answer)
#   pingora    bench/pingora-proto: the same limit on Cloudflare's pingora 0.9 (2 threads);
#              PINGORA=0 leaves it out (its first build takes about five minutes)
# Then, with IDLE (default 5000) idle keep-alive connections held open to each of sluice (as
# sluice-noid: request_id = false, the work nginx and HAProxy do), nginx,
# HAProxy and the bytes prototype by a separate process (each connection sends one request at the start and one every
# 30 s, so neither server's keep-alive timeout closes it), sluice-idle and nginx-idle: the
# proxying runs again, ROUNDS interleaved rounds (sluice-idle, nginx-idle, haproxy-idle, bytes-idle).
# The seven runs are repeated ROUNDS times (default 3), interleaved, and the table shows the
# median of each figure, so that a burst of other load on the machine moves one sample, not
# the result. Then the low-rate accuracy run: 100/s with a burst of 20, flooded for 10 s; the admitted
# count is compared with burst + rate x duration.
#
# With SLUICE_BASE=<commit>, that commit's gateway is built too (in a worktree under
# target/bench-ab/) and runs as sluice-base, with the configuration of the sluice run, in the
# same rounds: the table then shows what the commits since cost or saved, side by side.
#
# Then (unless TLS=0) the TLS and HTTP/2 section, ROUNDS interleaved rounds of DURATION each,
# sluice and nginx doing the same work (nginx with the nginx-same header work: X-Forwarded-For
# and X-Request-Id both ways), both with the same self-signed P-256 certificate (openssl):
#   sluice-tls / nginx-tls         wrk over HTTPS (HTTP/1.1, keep-alive) -> proxy -> upstream
#                                  (nginx: listen ssl, proxy_pass over upstream keep-alive)
#   sluice-h2-tls / nginx-h2-tls   h2load -c 10 -m 10 (100 streams) over TLS, ALPN h2
#   sluice-h2c / nginx-h2c         h2load -c 10 -m 10 with prior knowledge (nginx: a separate
#                                  `listen ... http2` port)
#   sluice-h2c-429 / nginx-h2c-429 h2load -c 10 -m 10, every request denied (429)
#   sluice-handshake / nginx-handshake  wrk over HTTPS with `Connection: close`: a new TLS
#                                  connection (and handshake) per request
#
# Everything listens on 127.0.0.1 ports chosen at start; nginx runs as this user with a
# temporary prefix. Prints a Markdown section on stdout (raw wrk output goes to $OUT).
set -euo pipefail

DURATION=${1:-10}
CONNS=${2:-64}
ROUNDS=${3:-3}
IDLE=${IDLE:-5000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-bench-XXXXXX)
OUT=${OUT:-$WORK/raw.txt}
NGINX=${NGINX:-/usr/sbin/nginx}
HAPROXY=${HAPROXY:-/usr/sbin/haproxy}
WRK=${WRK:-wrk}
H2LOAD=${H2LOAD:-h2load}
TLS=${TLS:-1}
PINGORA=${PINGORA:-1}
# Extra wrk arguments of the next run_wrk (the handshake rows add `Connection: close`).
WRK_EXTRA=()
PIDS=()
declare -A MASTER # server name -> pid of the process (nginx: its master)

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK/nginx-"*
}
trap cleanup EXIT

# free_port, wait_port
# shellcheck source=scripts/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

start_nginx() { # name conf-body -> starts nginx with its own prefix
  local name=$1 body=$2 dir="$WORK/nginx-$1"
  mkdir -p "$dir/logs" "$dir/tmp"
  cat > "$dir/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  $body
}
CONF
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" &
  PIDS+=($!)
  MASTER[$name]=$!
}

start_sluice() { # name config-body port admin [binary]
  local name=$1 body=$2 port=$3 admin=$4 bin=${5:-$ROOT/target/release/sluice}
  # As nginx's `keepalive_requests 1000000` below: h2load and wrk do not reconnect after a
  # GOAWAY. (A base commit's gateway, given as the binary, may not know the key.)
  local requests=""
  [ -z "${5:-}" ] && requests="max_requests_per_connection = 1000000"
  cat > "$WORK/$name.toml" <<CONF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
$requests
$body
CONF
  SLUICE_LOG=warn "$bin" serve --config "$WORK/$name.toml" 2>"$WORK/$name.log" &
  PIDS+=($!)
  MASTER[$name]=$!
  wait_port "$port"
}

# The processes that serve for a name: nginx's workers, or sluice itself.
serving_pids() {
  local master=${MASTER[$1]}
  local workers
  workers=$(pgrep -P "$master" | tr '\n' ' ')
  echo "${workers:-$master}"
}

cpu_ticks() { # pids... -> "user sys", clock ticks summed over the processes
  local u=0 s=0 a b p
  for p in "$@"; do
    read -r a b < <(awk '{print $14, $15}' "/proc/$p/stat")
    u=$((u + a)); s=$((s + b))
  done
  echo "$u $s"
}

# wrk -> "req/s p50 p99 total non2xx seconds user_us sys_us upstream_us wrk_us": user_us and
# sys_us are the CPU time the serving processes (PIDS...) spent per request, in microseconds;
# upstream_us the upstream's workers' (user + kernel), wrk_us wrk's own. The three add up to the
# machine's CPU per request, which sets the throughput when all of them share two cores.
run_wrk() {
  local label=$1 url=$2 secs=$3
  shift 3
  local out u0 s0 u1 s1 up0 up1 _u _s wrk_ticks
  read -r u0 s0 < <(cpu_ticks "$@")
  # shellcheck disable=SC2046 # one argument per pid
  read -r _u _s < <(cpu_ticks $(serving_pids upstream)); up0=$((_u + _s))
  # wrk runs as the child of a shell that reads its own children's CPU time once wrk is reaped
  # (fields 16 and 17 of /proc/PID/stat, cutime and cstime).
  # shellcheck disable=SC2016 # expanded by the inner shell
  out=$(bash -c '"$@" 2>&1; echo "wrk-cpu-ticks $(cut -d" " -f16,17 /proc/$$/stat)"' _ \
    "$WRK" -t2 -c"$CONNS" -d"${secs}s" --latency "${WRK_EXTRA[@]}" "$url")
  read -r u1 s1 < <(cpu_ticks "$@")
  # shellcheck disable=SC2046
  read -r _u _s < <(cpu_ticks $(serving_pids upstream)); up1=$((_u + _s))
  wrk_ticks=$(awk '/^wrk-cpu-ticks/ {print $2 + $3}' <<<"$out")
  { echo "=== $label ($url)"; echo "$out"; } >> "$OUT"
  local rps p50 p99 total non2xx took
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  took=$(awk '/requests in/ {gsub(/s,/,"",$4); print $4}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  local per
  per=$(awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v up=$((up1 - up0)) -v w="$wrk_ticks" -v n="$total" \
    -v k="$(getconf CLK_TCK)" \
    'BEGIN { f = 1e6 / k / n; printf "%.2f %.2f %.2f %.2f", u * f, s * f, up * f, w * f }')
  echo "$rps $p50 $p99 $total ${non2xx:-0} $took $per"
}

to_ms() { # wrk latency (e.g. 812.00us, 1.20ms, 2.00s) -> milliseconds
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u);
    if (u == "us") n /= 1000; else if (u == "s") n *= 1000;
    printf "%.3f", n }'
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "building sluice (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p sluice-server && cargo build --release -q -p sluice-benches --example plain_hyper_proxy --example bytes_proxy)
PINGORA_BIN=
if [ "$PINGORA" = 1 ]; then
  command -v cmake >/dev/null ||
    { echo "the pingora prototype needs cmake to build (apt-get install cmake), or run with PINGORA=0" >&2; exit 2; }
  echo "building the pingora prototype (release)..." >&2
  pingora_target=${CARGO_TARGET_DIR:-$ROOT/target}/pingora-proto
  (cd "$ROOT" && CARGO_TARGET_DIR="$pingora_target" cargo build --release -q --manifest-path bench/pingora-proto/Cargo.toml)
  PINGORA_BIN="$pingora_target/release/pingora-proto"
fi
BASE_BIN=
if [ -n "${SLUICE_BASE:-}" ]; then
  base=$(cd "$ROOT" && git rev-parse --verify --short=12 "$SLUICE_BASE^{commit}") ||
    { echo "SLUICE_BASE: no commit \`$SLUICE_BASE\`" >&2; exit 2; }
  tree="$ROOT/target/bench-ab/$base"
  [ -d "$tree" ] || (cd "$ROOT" && git worktree add --detach -f "$tree" "$base" >/dev/null)
  echo "building sluice at $base (release)..." >&2
  (cd "$tree" && CARGO_TARGET_DIR="$ROOT/target/bench-ab/target" cargo build --release -q -p sluice-server --bin sluice)
  BASE_BIN="$ROOT/target/bench-ab/target/release/sluice"
fi

UP=$(free_port); NG=$(free_port); NG429=$(free_port); NGACC=$(free_port)
SL=$(free_port); SLA=$(free_port); SL429=$(free_port); SL429A=$(free_port)
SLACC=$(free_port); SLACCA=$(free_port); HY=$(free_port); NGSAME=$(free_port)
SLNOID=$(free_port); SLNOIDA=$(free_port); HA=$(free_port); BY=$(free_port); BY429=$(free_port)
PG=$(free_port)

start_nginx upstream "server { listen 127.0.0.1:$UP; keepalive_requests 1000000; location / { return 200 \"ok\\n\"; } }"
wait_port "$UP"
PROXY_COMMON="upstream up { server 127.0.0.1:$UP; keepalive 256; keepalive_requests 1000000; }
  limit_req_status 429;"
start_nginx proxy "$PROXY_COMMON
  limit_req_zone \$binary_remote_addr zone=open:10m rate=1000000r/s;
  server { listen 127.0.0.1:$NG; keepalive_requests 1000000;
    location / { limit_req zone=open burst=1000000 nodelay; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
start_nginx proxysame "$PROXY_COMMON
  limit_req_zone \$binary_remote_addr zone=same:10m rate=1000000r/s;
  map \$http_x_request_id \$rid { default \$http_x_request_id; \"\" \$request_id; }
  server { listen 127.0.0.1:$NGSAME; keepalive_requests 1000000;
    location / { limit_req zone=same burst=1000000 nodelay; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Request-Id \$rid; add_header X-Request-Id \$rid always; } }"
start_nginx proxy429 "$PROXY_COMMON
  limit_req_zone \$binary_remote_addr zone=shut:10m rate=1r/m;
  server { listen 127.0.0.1:$NG429; keepalive_requests 1000000;
    location / { limit_req zone=shut; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
start_nginx proxyacc "$PROXY_COMMON
  limit_req_zone \$binary_remote_addr zone=acc:10m rate=100r/s;
  server { listen 127.0.0.1:$NGACC; keepalive_requests 1000000;
    location / { limit_req zone=acc burst=20 nodelay; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
wait_port "$NG"; wait_port "$NGSAME"; wait_port "$NG429"; wait_port "$NGACC"

# HAProxy doing the work of a limiter gateway: the client's address tracked in a stick table
# (its request rate), a deny rule the rate never reaches, X-Forwarded-For added.
mkdir -p "$WORK/haproxy"
haproxy_limiter_cfg "$HA" "$UP" > "$WORK/haproxy/haproxy.cfg"
"$HAPROXY" -db -f "$WORK/haproxy/haproxy.cfg" 2>"$WORK/haproxy/log" &
PIDS+=($!)
MASTER[haproxy]=$!
wait_port "$HA"

route() { printf '[[route]]\npath_prefix = "/"\npolicies = ["%s"]\nupstream = "http://127.0.0.1:%s"\n' "$1" "$UP"; }
start_sluice open "$(printf '[[policy]]\nname = "open"\nalgorithm = "gcra"\ncapacity = 1000000\nrate = "1000000/s"\nkey = "ip"\n'; route open)" "$SL" "$SLA"
start_sluice shut "$(printf '[[policy]]\nname = "shut"\nalgorithm = "gcra"\ncapacity = 1\nrate = "1/h"\nkey = "ip"\n'; route shut)" "$SL429" "$SL429A"
start_sluice noid "$(printf 'request_id = false\n[[policy]]\nname = "open"\nalgorithm = "gcra"\ncapacity = 1000000\nrate = "1000000/s"\nkey = "ip"\n'; route open)" "$SLNOID" "$SLNOIDA"
if [ -n "$BASE_BIN" ]; then
  SLBASE=$(free_port); SLBASEA=$(free_port)
  start_sluice base "$(printf '[[policy]]\nname = "open"\nalgorithm = "gcra"\ncapacity = 1000000\nrate = "1000000/s"\nkey = "ip"\n'; route open)" "$SLBASE" "$SLBASEA" "$BASE_BIN"
fi
start_sluice acc "$(printf '[[policy]]\nname = "acc"\nalgorithm = "gcra"\ncapacity = 20\nrate = "100/s"\nkey = "ip"\n'; route acc)" "$SLACC" "$SLACCA"

"$ROOT/target/release/examples/plain_hyper_proxy" "127.0.0.1:$HY" "127.0.0.1:$UP" &
PIDS+=($!)
MASTER[hyper]=$!
wait_port "$HY"

"$ROOT/target/release/examples/bytes_proxy" "127.0.0.1:$BY" "127.0.0.1:$UP" 2 open &
PIDS+=($!)
MASTER[bytes]=$!
"$ROOT/target/release/examples/bytes_proxy" "127.0.0.1:$BY429" "127.0.0.1:$UP" 2 shut &
PIDS+=($!)
MASTER[bytes429]=$!
wait_port "$BY"; wait_port "$BY429"
if [ -n "$PINGORA_BIN" ]; then
  "$PINGORA_BIN" --listen "127.0.0.1:$PG" --upstream "127.0.0.1:$UP" --threads 2 &
  PIDS+=($!)
  MASTER[pingora]=$!
  wait_port "$PG"
fi

# Warm up every path once (connections, pools, caches).
for port in $UP $NG $NGSAME $HA $SL $HY $NG429 $SL429 $SLNOID $BY $BY429 ${PINGORA_BIN:+$PG} ${SLBASE:-}; do "$WRK" -t1 -c8 -d1s "http://127.0.0.1:$port/" >/dev/null 2>&1 || true; done

# label:port:server of each run, in the order they are interleaved.
RUNS=("direct:$UP:upstream" "sluice:$SL:open" "nginx:$NG:proxy" "haproxy:$HA:haproxy" "nginx-same:$NGSAME:proxysame"
  "hyper:$HY:hyper" "sluice-429:$SL429:shut" "nginx-429:$NG429:proxy429" "sluice-noid:$SLNOID:noid"
  "bytes:$BY:bytes" "bytes-429:$BY429:bytes429")
[ -n "$PINGORA_BIN" ] && RUNS+=("pingora:$PG:pingora")
[ -n "$BASE_BIN" ] && RUNS+=("sluice-base:$SLBASE:base")
declare -A SAMPLES
# Runs each label:port:server given ROUNDS times, the runs interleaved, into SAMPLES.
run_rounds() {
  local round run label port server result rps p50 p99 total non2xx took cpu_user cpu_sys cpu_up cpu_wrk
  for round in $(seq "$ROUNDS"); do
    for run in "$@"; do
      IFS=: read -r label port server <<<"$run"
      # shellcheck disable=SC2046 # one argument per pid
      result=$(run_wrk "$label" "http://127.0.0.1:$port/" "$DURATION" $(serving_pids "$server"))
      echo "round $round $label: $result" >&2
      read -r rps p50 p99 total non2xx took cpu_user cpu_sys cpu_up cpu_wrk <<<"$result"
      SAMPLES[$label]+="$rps $(to_ms "$p50") $(to_ms "$p99") $total $non2xx $took $cpu_user $cpu_sys $cpu_up $cpu_wrk"$'\n'
    done
  done
}
run_rounds "${RUNS[@]}"
# The idle connections: one process holds IDLE keep-alive connections to each of sluice and
# nginx, then the proxying pair runs again beside them.
cat > "$WORK/idle.py" <<'PY'
import asyncio, sys
ports, n = [int(p) for p in sys.argv[1].split(",")], int(sys.argv[2])
REQ = b"GET /idle HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
async def one(port):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    while True:
        w.write(REQ); await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")), 0)
        await r.readexactly(length)
        await asyncio.sleep(30)
async def main():
    tasks = []
    for port in ports:
        for i in range(n):
            tasks.append(asyncio.ensure_future(one(port)))
            if i % 200 == 199: await asyncio.sleep(0.05)
    await asyncio.sleep(3)
    alive = sum(1 for t in tasks if not t.done())
    print(f"idle connections open: {alive} of {len(tasks)}", flush=True)
    await asyncio.gather(*tasks)
asyncio.run(main())
PY
python3 "$WORK/idle.py" "$SLNOID,$NG,$HA,$BY" "$IDLE" > "$WORK/idle.log" 2>&1 &
IDLE_PID=$!
PIDS+=($!)
for _ in $(seq 600); do grep -q "idle connections open" "$WORK/idle.log" && break; sleep 0.1; done
IDLE_OPEN=$(cat "$WORK/idle.log")
echo "$IDLE_OPEN" >&2
# sluice as sluice-noid: the work of plain nginx `limit_req` and of HAProxy (no request ids).
IDLE_RUNS=("sluice-idle:$SLNOID:noid" "nginx-idle:$NG:proxy" "haproxy-idle:$HA:haproxy" "bytes-idle:$BY:bytes")
run_rounds "${IDLE_RUNS[@]}"
RUNS+=("${IDLE_RUNS[@]}")

median_col() { # label column -> median over rounds
  printf '%s' "${SAMPLES[$1]}" | awk -v c="$2" 'NF {print $c}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
declare -A R
for run in "${RUNS[@]}"; do
  label=${run%%:*}
  # The median of each of the ten columns a sample has.
  R[$label]=$(for column in $(seq 10); do printf '%s ' "$(median_col "$label" "$column")"; done)
done

# Accuracy: flood for 10 s; admitted = total - non-2xx; expected = burst + rate x duration.
# shellcheck disable=SC2046
ACC_S=$(run_wrk "sluice-accuracy" "http://127.0.0.1:$SLACC/" 10 $(serving_pids acc))
# shellcheck disable=SC2046
ACC_N=$(run_wrk "nginx-accuracy" "http://127.0.0.1:$NGACC/" 10 $(serving_pids proxyacc))

row() { # label
  read -r rps p50 p99 total non2xx took cpu_user cpu_sys cpu_up cpu_wrk <<<"${R[$1]}"
  local all machine
  all=$(printf '%s' "${SAMPLES[$1]}" | awk 'NF {printf "%s%.0f", (n++ ? ", " : ""), $1}')
  # direct: the server is the upstream, counted once.
  if [ "$1" = direct ]; then cpu_up=0; fi
  machine=$(awk -v a="$cpu_user" -v b="$cpu_sys" -v c="$cpu_up" -v d="$cpu_wrk" 'BEGIN { printf "%.2f", a + b + c + d }')
  printf '| %s | %s | %s | %s | %s | %s + %s | %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99" "$non2xx" "$cpu_user" "$cpu_sys" \
    "$([ "$1" = direct ] && echo "(the server)" || echo "$cpu_up")" "$cpu_wrk" "$machine" "$all"
}
field() { awk -v i="$2" '{print $i}' <<<"${R[$1]}"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
acc_line() { # label result burst
  read -r rps p50 p99 total non2xx took _ _ _ _ <<<"$2"
  local admitted=$((total - non2xx))
  local expected
  expected=$(awk -v b="$3" -v t="$took" 'BEGIN { printf "%.1f", b + 100 * t }')
  printf '| %s | %s | %s | %s s | %s |\n' "$1" "$total" "$admitted" "$took" "$expected"
}

D_P99=$(field direct 3)
S_P99=$(field sluice 3); N_P99=$(field nginx 3); NS_P99=$(field nginx-same 3)
S4_P99=$(field sluice-429 3); N4_P99=$(field nginx-429 3)

cat <<MD

## Gateway: sluice serve vs nginx limit_req

Command: \`scripts/bench-gateway.sh $DURATION $CONNS $ROUNDS\` ($(date -u +%Y-%m-%d), $(nproc) cores, load average before the run: $LOAD_BEFORE;
wrk -t2 -c$CONNS -d${DURATION}s --latency, $ROUNDS interleaved rounds, medians shown,
nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), sluice release build, access logs off on both). Upstream: nginx \`return 200\`
(1 worker per core), the same process for every run. sluice: \`key = "ip"\`, GCRA; nginx: \`limit_req_zone \$binary_remote_addr\`,
\`limit_req_status 429\`, upstream keepalive 256.

| run | req/s (median) | p50 ms | p99 ms | non-2xx | server CPU µs/request, user + kernel | upstream CPU µs/request | wrk CPU µs/request | machine CPU µs/request | req/s of each round |
|---|---|---|---|---|---|---|---|---|---|
$(row direct)
$(row sluice)
$(row nginx)
$(row haproxy)
$(row nginx-same)
$(row hyper)
$(row sluice-429)
$(row nginx-429)
$(row sluice-noid)
$(row sluice-idle)
$(row nginx-idle)
$(row haproxy-idle)
$(row bytes)
$(row bytes-429)
$(row bytes-idle)
$([ -n "$PINGORA_BIN" ] && row pingora)
$([ -n "$BASE_BIN" ] && row sluice-base)

Server CPU: the user and kernel time of the processes answering wrk (sluice, the plain hyper proxy, or nginx's workers; for
direct, the upstream's workers), divided by the requests of the run (median of the rounds). Upstream and wrk CPU: the same for
the upstream's workers and for wrk itself; machine CPU is the sum of the three (each a median of the rounds), the CPU the
machine spends on a request, which sets the throughput while all three processes share the two cores.

- Proxying (unlimited policy): sluice / nginx throughput = **$(ratio "$(field sluice 1)" "$(field nginx 1)")** (target >= 1).
  p99: sluice $S_P99 ms, nginx $N_P99 ms, direct $D_P99 ms; added p99 over direct: sluice $(minus "$S_P99" "$D_P99") ms,
  nginx $(minus "$N_P99" "$D_P99") ms; sluice - nginx = $(minus "$S_P99" "$N_P99") ms (target <= 0.5 ms).
- Proxying beside HAProxy $("$HAPROXY" -v 2>/dev/null | awk 'NR==1 {print $3}') (the same per-source tracking, X-Forwarded-For):
  sluice / haproxy = **$(ratio "$(field sluice 1)" "$(field haproxy 1)")** (target >= 1); p99 haproxy $(field haproxy 3) ms,
  sluice - haproxy = $(minus "$S_P99" "$(field haproxy 3)") ms; with the idle connections, sluice-idle / haproxy-idle =
  **$(ratio "$(field sluice-idle 1)" "$(field haproxy-idle 1)")**.
- Proxying, nginx doing the same header work (nginx-same: X-Forwarded-For, X-Request-Id both ways):
  sluice / nginx-same throughput = **$(ratio "$(field sluice 1)" "$(field nginx-same 1)")**; nginx-same / nginx = $(ratio "$(field nginx-same 1)" "$(field nginx 1)");
  p99 nginx-same $NS_P99 ms, sluice - nginx-same = $(minus "$S_P99" "$NS_P99") ms.
- The plain hyper proxy (no limiting, nothing added to the request or response, tokio's
  multi-threaded runtime, hyper_util's pooled client): sluice / hyper throughput =
  **$(ratio "$(field sluice 1)" "$(field hyper 1)")**, hyper / nginx = $(ratio "$(field hyper 1)" "$(field nginx 1)"); p99 hyper $(field hyper 3) ms.
- Denying (every request 429): sluice / nginx throughput = **$(ratio "$(field sluice-429 1)" "$(field nginx-429 1)")** (target >= 1);
  p99 sluice $S4_P99 ms, nginx $N4_P99 ms (sluice - nginx = $(minus "$S4_P99" "$N4_P99") ms).
- \`request_id = false\` (sluice-noid) against plain nginx \`limit_req\`, neither doing the request-id work:
  sluice-noid / nginx = **$(ratio "$(field sluice-noid 1)" "$(field nginx 1)")** (target >= 1); p99 $(field sluice-noid 3) ms.
- With $IDLE idle keep-alive connections open to each ($IDLE_OPEN): sluice-idle / nginx-idle throughput =
  **$(ratio "$(field sluice-idle 1)" "$(field nginx-idle 1)")**; p99 sluice $(field sluice-idle 3) ms, nginx $(field nginx-idle 3) ms
  (sluice - nginx = $(minus "$(field sluice-idle 3)" "$(field nginx-idle 3)") ms).
- The prototypes of a faster HTTP/1.1 path (the work of sluice-noid): bytes / nginx = **$(ratio "$(field bytes 1)" "$(field nginx 1)")**,
  bytes / haproxy = **$(ratio "$(field bytes 1)" "$(field haproxy 1)")**, bytes / sluice-noid = $(ratio "$(field bytes 1)" "$(field sluice-noid 1)");
  p99 bytes $(field bytes 3) ms (bytes - nginx = $(minus "$(field bytes 3)" "$N_P99") ms, bytes - haproxy = $(minus "$(field bytes 3)" "$(field haproxy 3)") ms);
  denying: bytes-429 / nginx-429 = **$(ratio "$(field bytes-429 1)" "$(field nginx-429 1)")**; with the idle connections: bytes-idle / nginx-idle =
  **$(ratio "$(field bytes-idle 1)" "$(field nginx-idle 1)")**, bytes-idle / haproxy-idle = $(ratio "$(field bytes-idle 1)" "$(field haproxy-idle 1)").
$([ -n "$PINGORA_BIN" ] && printf -- '  pingora / nginx = **%s**, pingora / haproxy = %s, pingora / sluice-noid = %s; p99 pingora %s ms.\n' "$(ratio "$(field pingora 1)" "$(field nginx 1)")" "$(ratio "$(field pingora 1)" "$(field haproxy 1)")" "$(ratio "$(field pingora 1)" "$(field sluice-noid 1)")" "$(field pingora 3)")
$([ -n "$BASE_BIN" ] && printf -- '- sluice at %s (sluice-base, same configuration, same rounds): sluice / sluice-base = **%s**; p99 sluice-base %s ms.\n' "$base" "$(ratio "$(field sluice 1)" "$(field sluice-base 1)")" "$(field sluice-base 3)")

Low rate: 100/s with a burst of 20, flooded for 10 s (wrk -c$CONNS). Expected admitted = burst + 100 x measured duration
(nginx's burst admits burst + 1 at once: its first request does not count against the burst).

| gateway | requests | admitted | duration | expected |
|---|---|---|---|---|
$(acc_line sluice "$ACC_S" 20)
$(acc_line nginx "$ACC_N" 21)
MD

# === TLS and HTTP/2 ===
if [ "$TLS" = 1 ]; then
  kill "$IDLE_PID" 2>/dev/null || true
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
  NGTLS=$(free_port); NGH2C=$(free_port); NGH2C429=$(free_port); SLTLS=$(free_port); SLTLSA=$(free_port)
  SAME_HEADERS="proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Request-Id \$rid; add_header X-Request-Id \$rid always;"
  start_nginx proxytls "$PROXY_COMMON
  limit_req_zone \$binary_remote_addr zone=tls:10m rate=1000000r/s;
  limit_req_zone \$binary_remote_addr zone=h2c:10m rate=1000000r/s;
  limit_req_zone \$binary_remote_addr zone=h2shut:10m rate=1r/m;
  map \$http_x_request_id \$rid { default \$http_x_request_id; \"\" \$request_id; }
  server { listen 127.0.0.1:$NGTLS ssl http2; keepalive_requests 1000000;
    ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem; ssl_protocols TLSv1.2 TLSv1.3;
    location / { limit_req zone=tls burst=1000000 nodelay; $SAME_HEADERS } }
  server { listen 127.0.0.1:$NGH2C http2; keepalive_requests 1000000;
    location / { limit_req zone=h2c burst=1000000 nodelay; $SAME_HEADERS } }
  server { listen 127.0.0.1:$NGH2C429 http2; keepalive_requests 1000000;
    location / { limit_req zone=h2shut; $SAME_HEADERS } }"
  wait_port "$NGTLS"; wait_port "$NGH2C"; wait_port "$NGH2C429"
  start_sluice tls "$(printf '[server.tls]\ncert = "%s"\nkey = "%s"\n[[policy]]\nname = "open"\nalgorithm = "gcra"\ncapacity = 1000000\nrate = "1000000/s"\nkey = "ip"\n' "$WORK/cert.pem" "$WORK/key.pem"; route open)" "$SLTLS" "$SLTLSA"

  # h2load -> "req/s p50_ms p99_ms total non2xx seconds user_us sys_us": the percentiles from
  # h2load's per-request log (microseconds until the end of each response), the CPU time the
  # serving processes (PIDS...) spent per request, in microseconds.
  run_h2load() {
    local label=$1 url=$2 secs=$3
    shift 3
    local out u0 s0 u1 s1 log="$WORK/h2load-$label.log"
    read -r u0 s0 < <(cpu_ticks "$@")
    out=$("$H2LOAD" -t2 -c10 -m10 -D "$secs" --log-file="$log" "$url" 2>&1)
    read -r u1 s1 < <(cpu_ticks "$@")
    { echo "=== $label ($url)"; echo "$out"; } >> "$OUT"
    local rps total non2xx p50 p99
    rps=$(awk '/^finished in/ {gsub(/,/, ""); print $4}' <<<"$out")
    total=$(awk '/^requests:/ {print $2}' <<<"$out")
    non2xx=$(awk '/^status codes:/ {gsub(/,/, ""); print $5 + $7 + $9}' <<<"$out")
    read -r p50 p99 < <(awk -F'\t' 'NF >= 3 {print $3}' "$log" | sort -n |
      awk '{v[NR] = $1} END { if (NR == 0) { print "nan nan"; exit }
        i50 = int(NR * 0.50); i99 = int(NR * 0.99); if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1
        printf "%.3f %.3f\n", v[i50] / 1000, v[i99] / 1000 }')
    rm -f "$log"
    local per
    per=$(awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$total" -v k="$(getconf CLK_TCK)" \
      'BEGIN { f = 1e6 / k / (n > 0 ? n : 1); printf "%.2f %.2f", u * f, s * f }')
    echo "$rps $p50 $p99 $total ${non2xx:-0} $secs $per"
  }

  # label:tool:url:server of each run, interleaved.
  TLS_RUNS=("sluice-tls:wrk:https://127.0.0.1:$SLTLS/:tls" "nginx-tls:wrk:https://127.0.0.1:$NGTLS/:proxytls"
    "sluice-h2-tls:h2load:https://127.0.0.1:$SLTLS/:tls" "nginx-h2-tls:h2load:https://127.0.0.1:$NGTLS/:proxytls"
    "sluice-h2c:h2load:http://127.0.0.1:$SL/:open" "nginx-h2c:h2load:http://127.0.0.1:$NGH2C/:proxytls"
    "sluice-h2c-429:h2load:http://127.0.0.1:$SL429/:shut" "nginx-h2c-429:h2load:http://127.0.0.1:$NGH2C429/:proxytls"
    "sluice-handshake:wrk-close:https://127.0.0.1:$SLTLS/:tls" "nginx-handshake:wrk-close:https://127.0.0.1:$NGTLS/:proxytls")
  # Warm up.
  "$H2LOAD" -c2 -n200 "https://127.0.0.1:$SLTLS/" >/dev/null 2>&1 || true
  "$H2LOAD" -c2 -n200 "https://127.0.0.1:$NGTLS/" >/dev/null 2>&1 || true
  declare -A TSAMPLES TTOOL
  for round in $(seq "$ROUNDS"); do
    for run in "${TLS_RUNS[@]}"; do
      IFS='|' read -r label tool url server <<<"$(sed -E 's/^([^:]*):([^:]*):(.*):([^:]*)$/\1|\2|\3|\4/' <<<"$run")"
      TTOOL[$label]=$tool
      case $tool in
        wrk) WRK_EXTRA=()
          # shellcheck disable=SC2046
          result=$(run_wrk "$label" "$url" "$DURATION" $(serving_pids "$server"))
          read -r rps p50 p99 total non2xx took cpu_user cpu_sys _ _ <<<"$result"
          lat1=$(to_ms "$p50"); lat2=$(to_ms "$p99") ;;
        wrk-close) WRK_EXTRA=(-H "Connection: close")
          # shellcheck disable=SC2046
          result=$(run_wrk "$label" "$url" "$DURATION" $(serving_pids "$server"))
          WRK_EXTRA=()
          read -r rps p50 p99 total non2xx took cpu_user cpu_sys _ _ <<<"$result"
          lat1=$(to_ms "$p50"); lat2=$(to_ms "$p99") ;;
        h2load)
          # shellcheck disable=SC2046
          result=$(run_h2load "$label" "$url" "$DURATION" $(serving_pids "$server"))
          read -r rps lat1 lat2 total non2xx took cpu_user cpu_sys <<<"$result" ;;
      esac
      echo "round $round $label: $rps req/s $lat1 $lat2 ms, $non2xx non-2xx, cpu $cpu_user + $cpu_sys" >&2
      TSAMPLES[$label]+="$rps $lat1 $lat2 $non2xx $cpu_user $cpu_sys"$'\n'
    done
  done
  tmedian() { printf '%s' "${TSAMPLES[$1]}" | awk -v c="$2" 'NF {print $c}' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
  trow() {
    local all lat
    all=$(printf '%s' "${TSAMPLES[$1]}" | awk 'NF {printf "%s%.0f", (n++ ? ", " : ""), $1}')
    lat="p50 $(tmedian "$1" 2), p99 $(tmedian "$1" 3)"
    printf '| %s | %s | %s | %s | %s | %s + %s | %s |\n' "$1" "${TTOOL[$1]}" "$(tmedian "$1" 1)" "$lat" "$(tmedian "$1" 4)" \
      "$(tmedian "$1" 5)" "$(tmedian "$1" 6)" "$all"
  }
  tratio() { ratio "$(tmedian "$1" 1)" "$(tmedian "$2" 1)"; }
  # p99 of sluice minus p99 of nginx, in ms (the target: at most +0.5).
  tp99() { awk -v a="$(tmedian "$1" 3)" -v b="$(tmedian "$2" 3)" 'BEGIN { printf "%+.2f ms", a - b }'; }
  cat <<MD

## Gateway over TLS and HTTP/2: sluice serve vs nginx

Same machine and run; $ROUNDS interleaved rounds of ${DURATION}s, medians shown. TLS: one self-signed P-256 certificate for both
(rustls with ring in sluice, $(openssl version | cut -d' ' -f1-2) in nginx), TLS 1.3 negotiated. wrk: -t2 -c$CONNS (HTTP/1.1; the
handshake rows send \`Connection: close\`, so every request is a new TCP connection and TLS handshake). h2load: -t2 -c10 -m10
(100 concurrent streams over 10 connections). nginx does the nginx-same header work (X-Forwarded-For, X-Request-Id both ways)
and \`limit_req\`; its plain HTTP/2 (h2c) is a separate \`listen ... http2\` port. Upstream: HTTP/1.1 keep-alive for both.

| run | tool | req/s (median) | latency ms | non-2xx | server CPU µs/request, user + kernel | req/s of each round |
|---|---|---|---|---|---|---|
$(for run in "${TLS_RUNS[@]}"; do trow "${run%%:*}"; done)

- HTTPS keep-alive proxying: sluice-tls / nginx-tls = **$(tratio sluice-tls nginx-tls)**, p99 $(tp99 sluice-tls nginx-tls).
- HTTP/2 over TLS: sluice-h2-tls / nginx-h2-tls = **$(tratio sluice-h2-tls nginx-h2-tls)**, p99 $(tp99 sluice-h2-tls nginx-h2-tls).
- HTTP/2 with prior knowledge: sluice-h2c / nginx-h2c = **$(tratio sluice-h2c nginx-h2c)**, p99 $(tp99 sluice-h2c nginx-h2c).
- 429s over HTTP/2: sluice-h2c-429 / nginx-h2c-429 = **$(tratio sluice-h2c-429 nginx-h2c-429)**, p99 $(tp99 sluice-h2c-429 nginx-h2c-429).
- New TLS connections per second: sluice-handshake / nginx-handshake = **$(tratio sluice-handshake nginx-handshake)**.
MD
fi
echo "raw wrk output: $OUT" >&2
