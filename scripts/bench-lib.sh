# Shell helpers the benchmark scripts source (bench-gateway.sh, bench-llm.sh, bench-rls.sh, ...).

# A free TCP port on 127.0.0.1, below the kernel's ephemeral range: a port from that range,
# free when picked, can be taken by an outgoing connection (wrk's, the idle clients' 20,000)
# before the server meant for it binds it.
free_port() {
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    port = random.randint(max(1024, low - 12000), low - 1)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range")
'
}

# Waits up to 10 s for 127.0.0.1:$1 to accept connections; exits the script if it never does.
wait_port() {
  for _ in $(seq 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "port $1 never opened" >&2
  exit 1
}

# HAProxy doing the work of a limiter gateway, as the benchmarks compare it: the client's
# address tracked in a stick table (its request rate), a deny rule the rate never reaches,
# X-Forwarded-For added, keep-alive on both sides. Prints the configuration for a frontend on
# 127.0.0.1:$1 in front of 127.0.0.1:$2.
haproxy_limiter_cfg() {
  cat <<CONF
global
  nbthread 2
  maxconn 9000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  option http-keep-alive
  option forwardfor
frontend fe
  bind 127.0.0.1:$1
  stick-table type ip size 1m expire 60s store http_req_rate(1s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 100000000 }
  default_backend be
backend be
  http-reuse always
  server up 127.0.0.1:$2 maxconn 2000
CONF
}
