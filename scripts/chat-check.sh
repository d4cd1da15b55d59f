#!/usr/bin/env bash
# Serves the default model with the given extra `serve` arguments, asks the README's
# question (the capital of France, greedy) through the HTTP API, and fails unless the
# answer names Paris. CI runs it on the emulated CUDA device:
#
#   DCPEMU_MEMORY_MIB=16384 scripts/gpu-emulated.sh scripts/chat-check.sh --device cuda
#
# DCPSERVE_BIN picks the binary (default target/release/dcpserve).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN=${DCPSERVE_BIN:-target/release/dcpserve}
[ -x "$BIN" ] || cargo build --release --quiet --bin dcpserve
bash scripts/fetch-default-model.sh >/dev/null
. "$ROOT/scripts/lib/server.sh"
PORT=$(free_port)
mkdir -p target && LOG=target/chat-check.log

"$BIN" serve models/SmolLM2-135M-Instruct.Q4_1.gguf --port "$PORT" --threads 2 "$@" \
    >"$LOG" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT" "$LOG"

answer=$(curl -sS --max-time 300 "127.0.0.1:$PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_tokens": 32, "temperature": 0}')
text=$(printf '%s' "$answer" | python3 -c \
    'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])') || {
    echo "chat-check: not a chat completion: $answer" >&2
    tail -n 40 "$LOG" >&2
    exit 1
}
grep -m1 -i "device\|cuda" "$LOG" || true
echo "chat-check ($*): $text"
case "$text" in
*Paris*) ;;
*)
    echo "chat-check: the answer does not name Paris" >&2
    exit 1
    ;;
esac
