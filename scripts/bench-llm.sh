#!/usr/bin/env bash
# The LLM workload through the gateway, beside nginx and HAProxy doing the same limiting work,
# in one run, in front of one nginx upstream:
#
#   scripts/bench-llm.sh [DURATION_SECONDS] [ROUNDS] [CONNECTIONS]
#
# Rows (wrk -t2, --latency, ROUNDS interleaved rounds):
#   json    POST of a 1 KiB JSON body, answered with 1 KiB of JSON
#   stream  POST of the same body, answered with a 4 KiB server-sent event stream whose last
#           event carries OpenAI's `usage`: sluice settles it (`cost = { reserve = 1000,
#           settle = "openai" }`, the meter reading the stream as it passes), nginx and HAProxy
#           proxy it plainly (they have no settled cost)
#   upload  POST of 1 MiB, answered with 2 bytes
# Gateways, each with a limit per client address that never denies:
#   sluice   `sluice serve` (release) with the default [server] settings (request ids on)
#   nginx    limit_req per $binary_remote_addr, proxy_buffering off, upstream keep-alive
#   haproxy  a stick table tracking http_req_rate per source address, a deny rule it never
#            meets, option forwardfor, http-reuse always
# Per row and gateway: median req/s (range over rounds), p99, and the gateway's CPU per request
# (user + kernel, from /proc). Prints a Markdown section on stdout.
set -euo pipefail

DURATION=${1:-5}
ROUNDS=${2:-3}
CONNS=${3:-16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-bench-llm-XXXXXX)
NGINX=${NGINX:-/usr/sbin/nginx}
HAPROXY=${HAPROXY:-/usr/sbin/haproxy}
PIDS=()
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for d in "$WORK"/nginx-*; do
        [ -f "$d/nginx.pid" ] && kill "$(cat "$d/nginx.pid")" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

for tool in wrk "$NGINX" "$HAPROXY"; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed (apt-get install wrk nginx haproxy)" >&2; exit 2; }
done
(cd "$ROOT" && cargo build --release -q -p sluice-server)
SLUICE="$ROOT/target/release/sluice"

# What the upstream answers, and what the clients send.
mkdir -p "$WORK/www/v1"
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
answer = json.dumps({"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 880}}], "usage": {"prompt_tokens": 12, "completion_tokens": 200, "total_tokens": 212}})
open(f"{work}/www/v1/json", "w").write(answer)
events = []
while sum(map(len, events)) < 4096 - 200:
    events.append('data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a word or two"}}]}\n\n')
events.append('data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":40,"total_tokens":52}}\n\n')
events.append("data: [DONE]\n\n")
open(f"{work}/www/v1/stream", "w").write("".join(events))
open(f"{work}/www/v1/upload", "w").write("ok")
body = json.dumps({"model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": "y" * 960}]})
open(f"{work}/body.json", "w").write(body)
PY
cat > "$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/body.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA
cat > "$WORK/upload.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.body = string.rep("u", 1048576)
LUA
chmod -R a+rX "$WORK"

UP=$(free_port); NG=$(free_port); HA=$(free_port); SL=$(free_port); SLA=$(free_port)

nginx_start() { # name, http block body
    local dir="$WORK/nginx-$1"
    mkdir -p "$dir/logs"
    cat > "$dir/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    $2
}
EOF
    "$NGINX" -p "$dir" -c "$dir/nginx.conf"
}

# The upstream answers POSTs from files: the static module refuses POST (405), which
# `error_page 405 =200 $uri` turns into the file itself, the body read and dropped.
nginx_start upstream "
    types { }
    server {
        listen 127.0.0.1:$UP;
        keepalive_requests 1000000;
        client_max_body_size 2m;
        client_body_buffer_size 2m;
        root $WORK/www;
        location /v1/json { default_type application/json; error_page 405 =200 \$uri; }
        location /v1/stream { default_type text/event-stream; error_page 405 =200 \$uri; }
        location /v1/upload { default_type text/plain; error_page 405 =200 \$uri; }
    }"
nginx_start proxy "
    upstream up { server 127.0.0.1:$UP; keepalive 256; keepalive_requests 1000000; }
    limit_req_zone \$binary_remote_addr zone=open:10m rate=1000000r/s;
    limit_req_status 429;
    server {
        listen 127.0.0.1:$NG;
        keepalive_requests 1000000;
        client_max_body_size 2m;
        location / {
            limit_req zone=open burst=1000000 nodelay;
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
        }
    }"
mkdir -p "$WORK/haproxy"
haproxy_limiter_cfg "$HA" "$UP" > "$WORK/haproxy/haproxy.cfg"
"$HAPROXY" -db -f "$WORK/haproxy/haproxy.cfg" 2>"$WORK/haproxy/log" &
PIDS+=($!)
HAPID=$!

mkdir -p "$WORK/sluice"
cat > "$WORK/sluice/sluice.toml" <<EOF
[server]
listen = "127.0.0.1:$SL"
admin_listen = "127.0.0.1:$SLA"
max_body = "2MiB"

[[policy]]
name = "per-client"
algorithm = "gcra"
capacity = 1000000
rate = "1000000/s"
key = "ip"

[[policy]]
name = "tokens"
algorithm = "gcra"
capacity = 1000000000
rate = "1000000000/s"
key = "ip"
cost = { reserve = 1000, settle = "openai" }

[[route]]
path_prefix = "/v1/stream"
policies = ["per-client", "tokens"]
upstream = "http://127.0.0.1:$UP"

[[route]]
path_prefix = "/v1/"
policies = ["per-client"]
upstream = "http://127.0.0.1:$UP"
EOF
SLUICE_LOG=warn "$SLUICE" serve --config "$WORK/sluice/sluice.toml" 2> "$WORK/sluice/log" &
PIDS+=($!)
SLPID=$!
for p in "$UP" "$NG" "$HA" "$SL"; do wait_port "$p"; done

pids_of() { # gateway -> the processes that serve it
    case "$1" in
        sluice) echo "$SLPID" ;;
        nginx) pgrep -P "$(cat "$WORK/nginx-proxy/nginx.pid")" | tr '\n' ' ' ;;
        haproxy) echo "$HAPID" ;;
    esac
}
port_of() { case "$1" in sluice) echo "$SL" ;; nginx) echo "$NG" ;; haproxy) echo "$HA" ;; esac; }
ticks() { # pids... -> user + kernel clock ticks
    local t=0 p
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}
ms() { awk -v k="$1" '$1 == k {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}'; }

declare -A R
GATEWAYS=(sluice nginx haproxy)
ROWS=(json stream upload)
for round in $(seq 1 "$ROUNDS"); do
    for row in "${ROWS[@]}"; do
        script="$WORK/post.lua"
        [ "$row" = upload ] && script="$WORK/upload.lua"
        for g in "${GATEWAYS[@]}"; do
            # shellcheck disable=SC2046
            t0=$(ticks $(pids_of "$g"))
            out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$script" "http://127.0.0.1:$(port_of "$g")/v1/$row")
            # shellcheck disable=SC2046
            t1=$(ticks $(pids_of "$g"))
            if grep -q "Non-2xx" <<<"$out"; then
                echo "$g $row: answers other than 200:" >&2
                echo "$out" >&2
                exit 1
            fi
            n=$(awk '/requests in/ {print $1}' <<<"$out")
            R[$g,$row,rps,$round]=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
            R[$g,$row,p99,$round]=$(ms 99% <<<"$out")
            R[$g,$row,cpu,$round]=$(awk -v t=$((t1 - t0)) -v n="$n" -v k="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t * 1e6 / k / n}')
            echo "round $round $row $g: ${R[$g,$row,rps,$round]} req/s p99 ${R[$g,$row,p99,$round]} ms, ${R[$g,$row,cpu,$round]} µs CPU/request" >&2
        done
    done
done

median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }
range() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {print lo " to " hi}'; }
col() { for r in $(seq 1 "$ROUNDS"); do echo "${R[$1,$2,$3,$r]}"; done; }

echo "| row | gateway | req/s (range) | p99 ms (range) | CPU µs per request |"
echo "|---|---|---|---|---|"
for row in "${ROWS[@]}"; do
    for g in "${GATEWAYS[@]}"; do
        printf '| %s | %s | %s (%s) | %s (%s) | %s |\n' "$row" "$g" \
            "$(col "$g" "$row" rps | median)" "$(col "$g" "$row" rps | range)" \
            "$(col "$g" "$row" p99 | median)" "$(col "$g" "$row" p99 | range)" \
            "$(col "$g" "$row" cpu | median)"
    done
done
echo
for row in "${ROWS[@]}"; do
    s=$(col sluice "$row" rps | median); n=$(col nginx "$row" rps | median); h=$(col haproxy "$row" rps | median)
    sp=$(col sluice "$row" p99 | median); np=$(col nginx "$row" p99 | median); hp=$(col haproxy "$row" p99 | median)
    awk -v r="$row" -v s="$s" -v n="$n" -v h="$h" -v sp="$sp" -v np="$np" -v hp="$hp" 'BEGIN {
        f = (n > h) ? n : h; fp = (n > h) ? np : hp; peer = (n > h) ? "nginx" : "haproxy";
        printf "%s: sluice / nginx %.2f, sluice / haproxy %.2f; against the faster peer (%s) %.2f, p99 %+.2f ms\n", r, s/n, s/h, peer, s/f, sp - fp }'
done
