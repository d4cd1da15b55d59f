#!/usr/bin/env bash
# What structured outputs cost: time per output token (TPOT) with a JSON-schema constraint
# versus without, on the default model, one server, `dcpserve bench` alternating the two
# workloads at each concurrency (ROUNDS times; the medians of the per-run median TPOTs).
#
# usage: scripts/bench-structured.sh [--concurrency 1,32] [--input-len 64] [--output-len 96]
#            [--rounds 3] [--threads 2] [--schema examples/structured/bench-schema.json]
#            [--temperature 0]
#
# The plain requests use `ignore_eos`; the constrained ones cannot finish within
# --output-len (the schema wants at least 200 array items), so both make exactly
# --output-len tokens. Greedy by default (greedy rows without logprobs check the grammar
# against the favourite token before building a mask; --temperature 0.8 measures the
# sampled path, which always builds the mask), random token-id prompts, completions endpoint, 2·c requests
# per point.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
CONCURRENCY=1,32
INPUT_LEN=64
OUTPUT_LEN=96
ROUNDS=3
THREADS=2
SCHEMA=examples/structured/bench-schema.json
TEMPERATURE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --input-len) INPUT_LEN=$2; shift 2 ;;
    --output-len) OUTPUT_LEN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --schema) SCHEMA=$2; shift 2 ;;
    --temperature) TEMPERATURE=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet --bin dcpserve
DCPSERVE=target/release/dcpserve
bash scripts/fetch-default-model.sh >/dev/null
. "$ROOT/scripts/lib/server.sh"

OUT=$(mktemp -d)
PORT=$(free_port)
"$DCPSERVE" serve "$MODEL" --served-model-name smollm2 --port "$PORT" --threads "$THREADS" \
  --kv-cache-memory-bytes 268435456 --max-model-len 1024 --max-num-seqs 64 >"$OUT/serve.log" 2>&1 &
SERVER_PID=$!
wait_ready "$PORT" "$OUT/serve.log"

# One point: prints its median TPOT in ms (nothing if a request failed).
tpot() { # concurrency, extra flags...
  local c=$1; shift
  "$DCPSERVE" bench --base-url "http://127.0.0.1:$PORT" --model smollm2 --disable-tqdm \
    --max-concurrency "$c" --num-prompts $((2 * c)) --random-input-len "$INPUT_LEN" \
    --random-output-len "$OUTPUT_LEN" --seed 1 --temperature "$TEMPERATURE" --result-dir "$OUT/r" --label "x$RANDOM" \
    --no-plots "$@" >"$OUT/bench.txt" 2>&1 || { cat "$OUT/bench.txt" >&2; exit 1; }
  # The point's row of the table: conc rate done err ... TPOT50 is the 11th column.
  awk -v c="$c" '$1 == c && $4 == 0 && NF >= 17 {print $11; exit}' "$OUT/bench.txt"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| concurrency | TPOT plain (ms) | TPOT json_schema (ms) | ratio |"
echo "|---:|---:|---:|---:|"
IFS=',' read -ra CS <<<"$CONCURRENCY"
for c in "${CS[@]}"; do
  # A warm-up of each kind (grammar engine built, caches warm).
  tpot "$c" --ignore-eos >/dev/null
  tpot "$c" --json-schema "@$SCHEMA" >/dev/null
  plain=(); constrained=()
  for _ in $(seq "$ROUNDS"); do
    plain+=("$(tpot "$c" --ignore-eos)")
    constrained+=("$(tpot "$c" --json-schema "@$SCHEMA")")
  done
  p=$(printf '%s\n' "${plain[@]}" | median)
  s=$(printf '%s\n' "${constrained[@]}" | median)
  echo "| $c | $p | $s | $(awk -v a="$s" -v b="$p" 'BEGIN {printf "%.3f", a / b}') |"
done
rm -rf "$OUT"
