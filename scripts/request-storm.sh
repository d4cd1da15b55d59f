#!/usr/bin/env bash
# The request fuzzer (scripts/request-fuzz.py) against a server it starts, at tp=1 on the
# default model and at tp=4 dcp=2 on the tiny Llama fixture (the KV cache sharded by
# position over two ranks). CI runs 5,000 requests per layout; the README's 100k figures
# come from `scripts/request-storm.sh --requests 100000`.
#
# tp1tiny (tp=1 on the tiny Llama) is for long runs where the default model's generation
# time would dominate.
#
# usage: [STORM_LAYOUTS="tp1 tp4dcp2"] scripts/request-storm.sh [--requests N] [--seed S]
#            [--concurrency C]
set -euo pipefail
LAYOUTS=${STORM_LAYOUTS:-tp1 tp4dcp2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN=${DCPSERVE_BIN:-target/release/dcpserve}
[ -x "$BIN" ] || cargo build --release --quiet --bin dcpserve
bash scripts/fetch-default-model.sh >/dev/null
LOGS=target/request-storm
mkdir -p "$LOGS"

for layout in $LAYOUTS; do
  case $layout in
  tp1)
    echo "== tp=1, default model"
    REQUEST_FUZZ_LOG=$LOGS/tp1.log python3 scripts/request-fuzz.py --exe "$BIN" "$@" -- \
        models/SmolLM2-135M-Instruct.Q4_1.gguf --served-model-name smollm2 --threads 2 \
        --kv-cache-memory-bytes 268435456 --max-model-len 2048 --max-num-seqs 32 ;;
  tp1tiny)
    echo "== tp=1, tiny-llama"
    REQUEST_FUZZ_LOG=$LOGS/tp1tiny.log python3 scripts/request-fuzz.py --exe "$BIN" "$@" -- \
        fixtures/tiny-llama --served-model-name tiny --dtype float32 --threads 2 \
        --kv-cache-memory-bytes 16777216 --max-num-seqs 64 ;;
  tp4dcp2)
    echo "== tp=4 dcp=2, tiny-llama"
    REQUEST_FUZZ_LOG=$LOGS/tp4dcp2.log python3 scripts/request-fuzz.py --exe "$BIN" "$@" -- \
        fixtures/tiny-llama --served-model-name tiny --dtype float32 \
        --tensor-parallel-size 4 --decode-context-parallel-size 2 --threads 1 \
        --kv-cache-memory-bytes 16777216 --max-num-seqs 64 ;;
  *) echo "unknown layout $layout (tp1, tp1tiny, tp4dcp2)" >&2; exit 2 ;;
  esac
done
