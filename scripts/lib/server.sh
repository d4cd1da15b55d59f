# Shared by the benchmark scripts: start one server at a time, wait for it, stop it.
# Source it; the caller sets SERVER_PID after starting a server in the background.

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}
trap stop_server EXIT

wait_ready() { # port, log
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server died; log:" >&2; tail -20 "$2" >&2; exit 1; }
    sleep 1
  done
  echo "server not ready after 300 s" >&2; exit 1
}
