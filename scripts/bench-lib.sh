# Shell helpers the benchmark scripts source (scripts/bench-gateway.sh, scripts/bench-rls.sh).

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
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
