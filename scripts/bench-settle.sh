#!/usr/bin/env bash
# Settled cost benchmark: the same server-sent event stream (an OpenAI-style answer, usage in
# its last event) through sluice with a settled policy, through sluice with the same policy
# settling nothing, and through nginx proxying it (proxy_buffering off, as streams are
# proxied), all in front of one nginx upstream that serves the stream from a file, in one run.
#
#   scripts/bench-settle.sh [DURATION_SECONDS] [ROUNDS] [OPEN_STREAMS]
#
# With BASE_SLUICE=/path/to/an/older/sluice, that binary runs the settled policy too (row
# "base"), beside this tree's, in the same rounds: the same policy before a change.
#
# Per gateway and round (interleaved, wrk -t2 --latency):
#   small   a 4 KiB stream (20 events, then usage, then [DONE]), 16 connections: requests/s,
#           p50 and p99 of the whole answer (its first byte is a few hundred bytes earlier)
#   big     a 1 MiB stream, 16 connections: MB/s through the gateway
#   open    OPEN_STREAMS (default 400) streams held open at once (the upstream sends at 2 KiB/s):
#           the gateway's resident memory grown per open stream (sluice: its process; nginx:
#           its workers), sampled after 3 s
#   paced   30 streams of 20 events, one every 5 ms, from scripts/bench/stream_latency.py's
#           upstream (each event carries the time it was written): the time to first byte and
#           each event's latency, written to received, median and p99; also straight from
#           that upstream (direct), for scale
# Prints a Markdown section on stdout: medians, and the range over rounds.
set -euo pipefail

DURATION=${1:-5}
ROUNDS=${2:-3}
OPEN=${3:-400}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-bench-settle-XXXXXX)
NGINX=${NGINX:-/usr/sbin/nginx}
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

(cd "$ROOT" && cargo build --release -q -p sluice-server)
SLUICE="$ROOT/target/release/sluice"

# The streams: events as an OpenAI-compatible server sends them.
event() { printf 'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}],"usage":null}\n\n' "$1"; }
mkdir -p "$WORK/www/v1"
{
    for i in $(seq 1 20); do event "word $i of a short answer, padded to look like a real token or two"; done
    printf 'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":20,"total_tokens":32}}\n\n'
    printf 'data: [DONE]\n\n'
} > "$WORK/www/v1/small"
{
    line=$(event "$(head -c 300 /dev/zero | tr '\0' 'x')")
    n=$((1048576 / (${#line} + 2)))
    for _ in $(seq 1 "$n"); do printf '%s\n\n' "$line"; done
    printf 'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4000,"total_tokens":4012}}\n\n'
    printf 'data: [DONE]\n\n'
} > "$WORK/www/v1/big"
cp "$WORK/www/v1/big" "$WORK/www/v1/slow"
# nginx's workers (user nobody when started as root) read the files.
chmod -R a+rX "$WORK"

UP=$(free_port)
PY=$(free_port)
NG=$(free_port)
SETTLED=$(free_port)
PLAIN=$(free_port)
BASE=$(free_port)

nginx_start() { # name, conf body
    local dir="$WORK/nginx-$1"
    mkdir -p "$dir/logs"
    cat > "$dir/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $2
}
EOF
    "$NGINX" -p "$dir" -c "$dir/nginx.conf"
}

nginx_start upstream "
    server {
        listen 127.0.0.1:$UP;
        keepalive_requests 1000000;
        root $WORK/www;
        default_type text/event-stream;
        location /v1/slow { limit_rate 2k; }
    }"
python3 "$ROOT/scripts/bench/stream_latency.py" upstream "$PY" &
PIDS+=($!)
nginx_start proxy "
    upstream up { server 127.0.0.1:$UP; keepalive 64; }
    upstream paced { server 127.0.0.1:$PY; keepalive 64; }
    server {
        listen 127.0.0.1:$NG;
        keepalive_requests 1000000;
        location /t/ {
            proxy_pass http://paced;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
        }
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
        }
    }"

sluice_start() { # port, cost line, [binary]
    local dir="$WORK/sluice-$1" bin=${3:-$SLUICE}
    mkdir -p "$dir"
    cat > "$dir/sluice.toml" <<EOF
[server]
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$(free_port)"
workers = 2
request_id = false
max_requests_per_connection = 1000000

[[policy]]
name = "llm"
algorithm = "gcra"
capacity = 1000000000
rate = "1000000000/s"
key = "global"
$2

[[route]]
path_prefix = "/v1/"
policies = ["llm"]
upstream = "http://127.0.0.1:$UP"

[[route]]
path_prefix = "/t/"
policies = ["llm"]
upstream = "http://127.0.0.1:$PY"
EOF
    SLUICE_LOG=warn "$bin" serve --config "$dir/sluice.toml" 2> "$dir/log" &
    PIDS+=($!)
    echo $! > "$dir/pid"
}
sluice_start "$SETTLED" 'cost = { reserve = 1000, settle = "openai" }'
sluice_start "$PLAIN" ''
GATEWAYS=(settled plain nginx)
if [ -n "${BASE_SLUICE:-}" ]; then
    sluice_start "$BASE" 'cost = { reserve = 1000, settle = "openai" }' "$BASE_SLUICE"
    wait_port "$BASE"
    GATEWAYS=(settled base plain nginx)
fi
for p in "$UP" "$PY" "$NG" "$SETTLED" "$PLAIN"; do wait_port "$p"; done

rss_kib() { # pids...
    local total=0
    for p in "$@"; do
        total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status")))
    done
    echo "$total"
}
pids_of() { # name
    case "$1" in
        settled) cat "$WORK/sluice-$SETTLED/pid" ;;
        plain) cat "$WORK/sluice-$PLAIN/pid" ;;
        base) cat "$WORK/sluice-$BASE/pid" ;;
        nginx) pgrep -P "$(cat "$WORK/nginx-proxy/nginx.pid")" | tr '\n' ' ' ;;
    esac
}
port_of() { case "$1" in settled) echo "$SETTLED" ;; plain) echo "$PLAIN" ;; base) echo "$BASE" ;; nginx) echo "$NG" ;; direct) echo "$PY" ;; esac; }
paced() { # gateway, round
    local out
    out=$(python3 "$ROOT/scripts/bench/stream_latency.py" client "http://127.0.0.1:$(port_of "$1")/t/s?events=20&gap_ms=5" 30)
    R[$1,ttfb,$2]=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["ttfb_ms_median"])' <<<"$out")
    R[$1,ttfb99,$2]=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["ttfb_ms_p99"])' <<<"$out")
    R[$1,chunk,$2]=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["chunk_ms_median"])' <<<"$out")
    R[$1,chunk99,$2]=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["chunk_ms_p99"])' <<<"$out")
    echo "round $2 $1 paced: $out" >&2
}

# Fails the run when wrk saw an answer other than 200 (a benchmark of errors is no benchmark).
all_ok() {
    if grep -q "Non-2xx" <<<"$1"; then
        echo "$2: answers other than 200:" >&2
        echo "$1" >&2
        exit 1
    fi
}

# wrk's latency line value in ms.
ms() { awk -v k="$1" '$1 == k {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}'; }
rps() { awk '/Requests\/sec/ {print $2}'; }
mbs() { awk '/Transfer\/sec/ {v=$2; if (v ~ /GB$/) {sub(/GB/,"",v); v*=1024} else if (v ~ /MB$/) {sub(/MB/,"",v)} else if (v ~ /KB$/) {sub(/KB/,"",v); v/=1024}; print v}'; }

declare -A R
for round in $(seq 1 "$ROUNDS"); do
    paced direct "$round"
    for g in "${GATEWAYS[@]}"; do
        paced "$g" "$round"
        port=$(port_of "$g")
        out=$(wrk -t2 -c16 -d"${DURATION}s" --latency "http://127.0.0.1:$port/v1/small")
        all_ok "$out" "$g small"
        R[$g,small,$round]=$(rps <<<"$out")
        R[$g,p50,$round]=$(ms 50% <<<"$out")
        R[$g,p99,$round]=$(ms 99% <<<"$out")
        out=$(wrk -t2 -c16 -d"${DURATION}s" "http://127.0.0.1:$port/v1/big")
        all_ok "$out" "$g big"
        R[$g,big,$round]=$(mbs <<<"$out")
        # shellcheck disable=SC2046
        idle=$(rss_kib $(pids_of "$g"))
        wrk -t2 -c"$OPEN" -d6s --timeout 30s "http://127.0.0.1:$port/v1/slow" > /dev/null 2>&1 &
        held=$!
        sleep 3
        # shellcheck disable=SC2046
        busy=$(rss_kib $(pids_of "$g"))
        wait "$held" || true
        R[$g,open,$round]=$(awk -v a="$busy" -v b="$idle" -v n="$OPEN" 'BEGIN {printf "%.1f", (a - b) / n}')
        echo "round $round $g: ${R[$g,small,$round]} req/s p50 ${R[$g,p50,$round]} p99 ${R[$g,p99,$round]} ms, ${R[$g,big,$round]} MB/s, ${R[$g,open,$round]} KiB/stream" >&2
    done
done

median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }
range() { sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {print lo " to " hi}'; }
col() { for r in $(seq 1 "$ROUNDS"); do echo "${R[$1,$2,$r]}"; done; }

echo "| gateway | 4 KiB stream req/s | p50 ms | p99 ms | 1 MiB stream MB/s | KiB per open stream |"
echo "|---|---|---|---|---|---|"
for g in "${GATEWAYS[@]}"; do
    printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s (%s) |\n' "$g" \
        "$(col "$g" small | median)" "$(col "$g" small | range)" \
        "$(col "$g" p50 | median)" "$(col "$g" p50 | range)" \
        "$(col "$g" p99 | median)" "$(col "$g" p99 | range)" \
        "$(col "$g" big | median)" "$(col "$g" big | range)" \
        "$(col "$g" open | median)" "$(col "$g" open | range)"
done
echo
echo "| paced stream | time to first byte, median ms | p99 | per-event latency, median ms | p99 |"
echo "|---|---|---|---|---|"
for g in direct "${GATEWAYS[@]}"; do
    printf '| %s | %s (%s) | %s | %s (%s) | %s |\n' "$g" \
        "$(col "$g" ttfb | median)" "$(col "$g" ttfb | range)" "$(col "$g" ttfb99 | median)" \
        "$(col "$g" chunk | median)" "$(col "$g" chunk | range)" "$(col "$g" chunk99 | median)"
done
s=$(col settled small | median); p=$(col plain small | median); n=$(col nginx small | median)
sb=$(col settled big | median); pb=$(col plain big | median); nb=$(col nginx big | median)
awk -v s="$s" -v p="$p" -v n="$n" -v sb="$sb" -v pb="$pb" -v nb="$nb" 'BEGIN {
    printf "\nsettled / plain: %.2f (4 KiB req/s), %.2f (1 MiB MB/s); settled / nginx: %.2f, %.2f\n", s/p, sb/pb, s/n, sb/nb }'
if [ -n "${BASE_SLUICE:-}" ]; then
    b=$(col base small | median); bb=$(col base big | median)
    awk -v s="$s" -v b="$b" -v sb="$sb" -v bb="$bb" 'BEGIN {
        printf "settled / base (the same policy, the older binary): %.2f (4 KiB req/s), %.2f (1 MiB MB/s)\n", s/b, sb/bb }'
fi
