#!/usr/bin/env bash
# Python tests of the HTTP API with the real `openai` client (pinned in requirements.txt):
# installs them in a venv, starts `dcpserve serve` on the default model on a free local
# port, waits for /health, runs pytest, and stops the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=target/python-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
BIN=target/release/dcpserve
# The same build as the Rust tests' (scripts/test.sh sets DCPSERVE_CARGO_FEATURES=mpi),
# so the binary is not rebuilt with other features.
cargo build --release --quiet --bin dcpserve ${DCPSERVE_CARGO_FEATURES:+--features "$DCPSERVE_CARGO_FEATURES"}
bash scripts/fetch-default-model.sh >/dev/null

PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=target/python-serve.log
"$BIN" serve --host 127.0.0.1 --port "$PORT" --served-model-name smollm2 \
    --kv-cache-memory-bytes 268435456 --max-model-len 2048 --threads 2 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

HEALTHY=0
for _ in $(seq 1 300); do
    if "$VENV/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then
        HEALTHY=1
        break
    fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "dcpserve serve exited:" >&2; tail -n 40 "$LOG" >&2; exit 1
    fi
    sleep 0.2
done
if [ "$HEALTHY" != 1 ]; then
    echo "dcpserve serve was not healthy on port $PORT; last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
fi

export DCPSERVE_BASE_URL="http://127.0.0.1:$PORT/v1"
export DCPSERVE_BIN="$BIN"
"$VENV/bin/python" -m pytest -q tests/python "$@"
