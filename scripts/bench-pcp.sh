#!/usr/bin/env bash
# Time to first token of long-prompt requests through the server, with and without
# prefill context parallelism: `dcpserve serve -pcp N` on the default model, one compute
# thread per rank (--threads N), one request at a time (`dcpserve bench`, random token
# ids, `--input-len` tokens in, 8 out), one server at a time.
#
# usage: scripts/bench-pcp.sh [--pcp 1,2] [--input-len 7000] [--prompts 3]
#            [--result-dir bench-results/pcp] [--exe PATH]
#
# Prints TTFT p50 per pcp and its speedup over pcp=1 with the parallel efficiency
# (speedup / pcp). The default model's context is 8,192 tokens.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
PCPS=1,2
INPUT_LEN=7000
PROMPTS=3
RESULT_DIR=bench-results/pcp
EXE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pcp) PCPS=$2; shift 2 ;;
    --input-len) INPUT_LEN=$2; shift 2 ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --result-dir) RESULT_DIR=$2; shift 2 ;;
    --exe) EXE=$(realpath "$2"); shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done

bash scripts/fetch-default-model.sh >/dev/null
if [ -n "$EXE" ]; then
  DCPSERVE=$EXE
else
  cargo build --release -q --bin dcpserve
  DCPSERVE=$ROOT/target/release/dcpserve
fi
. "$ROOT/scripts/lib/server.sh"
mkdir -p "$RESULT_DIR/logs"

for pcp in ${PCPS//,/ }; do
  PORT=$(free_port)
  echo "== dcpserve -pcp $pcp (threads $pcp, one per rank) on port $PORT"
  RUST_LOG=warn "$DCPSERVE" serve "$MODEL" --port "$PORT" -pcp "$pcp" --threads "$pcp" \
    --no-enable-prefix-caching >"$RESULT_DIR/logs/pcp$pcp.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$PORT" "$RESULT_DIR/logs/pcp$pcp.log"
  "$DCPSERVE" bench --base-url "http://127.0.0.1:$PORT" --label "pcp$pcp" \
    --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len 8 \
    --random-range-ratio 0 --max-concurrency 1 --num-prompts "$PROMPTS" \
    --ignore-eos --seed 0 --result-dir "$RESULT_DIR" --no-plots >/dev/null
  stop_server
done

python3 - "$RESULT_DIR" "$PCPS" "$INPUT_LEN" <<'EOF'
import json, sys, pathlib
d, pcps, n = pathlib.Path(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")], sys.argv[3]
ttft = {}
for p in pcps:
    run = json.loads((d / f"pcp{p}.json").read_text())
    point = run["points"][0]
    if point["error_count"]:
        sys.exit(f"pcp={p}: {point['error_count']} requests failed")
    ttft[p] = point["summary"]["ttft_ms"]["p50"]
print(f"\nTTFT of a {n}-token prompt through the server (p50, one request at a time):")
print(f"{'pcp':>4} {'TTFT p50':>10} {'speedup':>8} {'efficiency':>11}")
for p in pcps:
    s = ttft[pcps[0]] / ttft[p]
    print(f"{p:>4} {ttft[p]:>8.0f}ms {s:>8.2f} {s * pcps[0] / p:>11.2f}")
EOF
