#!/usr/bin/env bash
# Side-by-side serving benchmark: dcpserve vs llama.cpp's llama-server on the default model,
# same machine, same threads, same workload (`dcpserve bench`), one server at a time.
#
# usage: scripts/bench-serve.sh [--concurrency 1,8,32,64] [--input-len 96] [--output-len 96]
#            [--range-ratio 0.34] [--prompts-per-concurrency 2] [--min-prompts 8]
#            [--threads 2] [--result-dir bench-results/serve] [--quiet-wait 0] [--exe PATH]
#
# --exe serves (and benchmarks with) another dcpserve binary, e.g. a build from before a
# change, instead of building this repository.
#
# Lengths are drawn uniformly from [L·(1−R), L·(1+R)] (default 64..128 tokens in and out),
# prompts are random token ids, `ignore_eos` makes every request generate its full length.
# Each concurrency c sends max(min-prompts, 2·c) requests. llama.cpp is installed with
# ../shared/peers/install-llama-cpp.sh on first use (15-20 min). Prints output tok/s and
# TTFT p50 per concurrency with the ratios dcpserve / llama.cpp, and the plot paths.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
CONCURRENCY=1,8,32,64
INPUT_LEN=96
OUTPUT_LEN=96
RANGE_RATIO=0.34
PER_CONCURRENCY=2
MIN_PROMPTS=8
THREADS=2
RESULT_DIR=bench-results/serve
QUIET_WAIT=0
EXE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --input-len) INPUT_LEN=$2; shift 2 ;;
    --output-len) OUTPUT_LEN=$2; shift 2 ;;
    --range-ratio) RANGE_RATIO=$2; shift 2 ;;
    --prompts-per-concurrency) PER_CONCURRENCY=$2; shift 2 ;;
    --min-prompts) MIN_PROMPTS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --result-dir) RESULT_DIR=$2; shift 2 ;;
    --quiet-wait) QUIET_WAIT=$2; shift 2 ;;
    --exe) EXE=$(realpath "$2"); shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
MAX_C=$(tr ',' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)

bash scripts/fetch-default-model.sh >/dev/null
if [ -n "$EXE" ]; then
  DCPSERVE=$EXE
else
  cargo build --release -q --bin dcpserve
  DCPSERVE=$ROOT/target/release/dcpserve
fi

# The peer: the same lookup as scripts/bench.py (install script next to the repository).
INSTALL=""
for cand in "$ROOT/../shared/peers/install-llama-cpp.sh" "$ROOT/../../shared/peers/install-llama-cpp.sh"; do
  [ -f "$cand" ] && INSTALL=$cand && break
done
[ -n "$INSTALL" ] || { echo "install-llama-cpp.sh not found (../shared/peers)" >&2; exit 1; }
LLAMA_BIN=$(bash "$INSTALL" | tail -1)

. "$ROOT/scripts/lib/server.sh"

# Other jobs on the machine distort a 2-core benchmark: optionally wait for a quiet moment.
wait_quiet() {
  local waited=0
  while [ "$waited" -lt "$QUIET_WAIT" ] && awk '{exit !($1 > 0.7)}' /proc/loadavg; do
    sleep 5; waited=$((waited + 5))
  done
  echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
}

bench() { # label, port
  "$DCPSERVE" bench --base-url "http://127.0.0.1:$2" --label "$1" \
    --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
    --random-range-ratio "$RANGE_RATIO" --max-concurrency "$CONCURRENCY" \
    --num-prompts "$MIN_PROMPTS" --prompts-per-concurrency "$PER_CONCURRENCY" \
    --ignore-eos --seed 0 --result-dir "$RESULT_DIR" --no-plots
}

mkdir -p "$RESULT_DIR"
LOGS=$RESULT_DIR/logs
mkdir -p "$LOGS"

PORT=$(free_port)
echo "== dcpserve (threads $THREADS) on port $PORT"
RUST_LOG=warn "$DCPSERVE" serve "$MODEL" --port "$PORT" --threads "$THREADS" \
  --max-num-seqs "$MAX_C" >"$LOGS/dcpserve.log" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT" "$LOGS/dcpserve.log"
wait_quiet
bench dcpserve "$PORT"
stop_server

PORT=$(free_port)
# One slot per concurrent request, each with room for the longest prompt + output.
SLOT_CTX=$(python3 -c "import math; print(int(math.ceil(($INPUT_LEN + $OUTPUT_LEN) * (1 + $RANGE_RATIO))) + 64)")
echo "== llama.cpp llama-server (threads $THREADS, $MAX_C slots x $SLOT_CTX tokens) on port $PORT"
LD_LIBRARY_PATH=$LLAMA_BIN "$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" -tb "$THREADS" \
  --parallel "$MAX_C" -c $((MAX_C * SLOT_CTX)) --metrics --port "$PORT" --host 127.0.0.1 \
  >"$LOGS/llama-server.log" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT" "$LOGS/llama-server.log"
wait_quiet
bench llama.cpp "$PORT"
stop_server

# The comparison table, read from the two runs' JSON.
python3 - "$RESULT_DIR" <<'EOF'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
ours = json.loads((d / "dcpserve.json").read_text())
peer = json.loads((d / "llama.cpp.json").read_text())
by_c = lambda run: {p["max_concurrency"]: p for p in run["points"]}
o, p = by_c(ours), by_c(peer)
print(f"\n{'conc':>5} {'dcpserve tok/s':>15} {'llama.cpp tok/s':>16} {'ratio':>6}   "
      f"{'dcpserve TTFT p50':>17} {'llama.cpp TTFT p50':>18} {'ratio':>6}   errors")
for c in sorted(set(o) & set(p)):
    a, b = o[c]["summary"], p[c]["summary"]
    r_tok = a["output_throughput"] / b["output_throughput"] if b["output_throughput"] else float("nan")
    r_ttft = a["ttft_ms"]["p50"] / b["ttft_ms"]["p50"] if b["ttft_ms"]["p50"] else float("nan")
    print(f"{c:>5} {a['output_throughput']:>15.1f} {b['output_throughput']:>16.1f} {r_tok:>6.2f}   "
          f"{a['ttft_ms']['p50']:>15.0f}ms {b['ttft_ms']['p50']:>16.0f}ms {r_ttft:>6.2f}   "
          f"{o[c]['error_count']}/{p[c]['error_count']}")
print("(output tok/s ratio: higher is better for dcpserve; TTFT ratio: lower is better)")
EOF

# Plots of every run in the folder (both servers overlaid).
"$DCPSERVE" bench --replot --result-dir "$RESULT_DIR"
