#!/usr/bin/env bash
# Decode context parallelism in miniature, served: the same model and the same KV memory
# per rank at tp=N, dcp=1 (every rank holds a replica of the model's single KV head) and at
# tp=N, dcp=N (the KV cache is sharded by position), under a long-context agentic workload
# swept over concurrency. The replicated layout runs out of KV blocks after a few sessions
# (requests queue, sequences are preempted); dcp=N holds about N times as many.
#
# usage: scripts/bench-dcp.sh [--tp 4] [--concurrency 1,2,4,8,16] [--context 1536]
#            [--turns 2] [--turn-input 64] [--output 32] [--kv-bytes 16777216] [--threads 2]
#            [--result-dir bench-results/dcp]
#
# The model is a random-weight MQA Llama (hidden 256, 4 layers, 8 query heads, 1 KV head,
# head dim 64, float32) with the tiny fixture tokenizer, written into the result folder.
# Prints, per layout and concurrency: output tok/s, peak KV usage, preemptions and the most
# sequences running at once; writes the JSON runs and the plots into the result folder.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TP=4
CONCURRENCY=1,2,4,8,16
CONTEXT=1536
TURNS=2
TURN_INPUT=64
OUTPUT=32
KV_BYTES=$((16 << 20))
THREADS=2
RESULT_DIR=bench-results/dcp
while [ $# -gt 0 ]; do
  case "$1" in
    --tp) TP=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --context) CONTEXT=$2; shift 2 ;;
    --turns) TURNS=$2; shift 2 ;;
    --turn-input) TURN_INPUT=$2; shift 2 ;;
    --output) OUTPUT=$2; shift 2 ;;
    --kv-bytes) KV_BYTES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --result-dir) RESULT_DIR=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
MAX_C=$(tr ',' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)

cargo build --release -q --bin dcpserve
DCPSERVE=$ROOT/target/release/dcpserve
mkdir -p "$RESULT_DIR/logs"
rm -f "$RESULT_DIR"/*.json "$RESULT_DIR"/*.png
MODEL_DIR=$RESULT_DIR/model

# The synthetic MQA model: the shapes and config of tools/src/synthetic.rs (`bench-dcp` uses the
# same), written here because the CLI has no subcommand for it. Safetensors is an 8-byte
# header length, a JSON header and the raw little-endian tensors.
python3 - "$MODEL_DIR" "$ROOT/fixtures/tiny-llama" "$((CONTEXT + TURNS * (TURN_INPUT + OUTPUT) + 1024))" <<'EOF'
import json, math, random, shutil, struct, sys, pathlib
from array import array
out, fixtures, ctx = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
hidden, layers, heads, kv_heads, head_dim, inter, vocab = 256, 4, 8, 1, 64, 512, 384
max_pos = 1 << (ctx - 1).bit_length()
out.mkdir(parents=True, exist_ok=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(fixtures / f, out / f)
(out / "config.json").write_text(json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
    "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
    "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": max_pos,
    "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 2}))
rng = random.Random(7)
def rand(n, std): return array("f", (rng.gauss(0.0, std) for _ in range(n)))
def ones(n): return array("f", [1.0] * n)
q, kv, s = heads * head_dim, kv_heads * head_dim, 1 / math.sqrt(hidden)
tensors = [("model.embed_tokens.weight", [vocab, hidden], rand(vocab * hidden, 0.5)),
           ("model.norm.weight", [hidden], ones(hidden))]
for l in range(layers):
    p = f"model.layers.{l}."
    tensors += [
        (p + "self_attn.q_proj.weight", [q, hidden], rand(q * hidden, s)),
        (p + "self_attn.k_proj.weight", [kv, hidden], rand(kv * hidden, s)),
        (p + "self_attn.v_proj.weight", [kv, hidden], rand(kv * hidden, s)),
        (p + "self_attn.o_proj.weight", [hidden, q], rand(hidden * q, s)),
        (p + "mlp.gate_proj.weight", [inter, hidden], rand(inter * hidden, s)),
        (p + "mlp.up_proj.weight", [inter, hidden], rand(inter * hidden, s)),
        (p + "mlp.down_proj.weight", [hidden, inter], rand(hidden * inter, 1 / math.sqrt(inter))),
        (p + "input_layernorm.weight", [hidden], ones(hidden)),
        (p + "post_attention_layernorm.weight", [hidden], ones(hidden))]
header, offset = {}, 0
for name, shape, data in tensors:
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * len(data)]}
    offset += 4 * len(data)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for _, _, data in tensors:
        if sys.byteorder != "little":
            data.byteswap()
        f.write(data.tobytes())
EOF

. "$ROOT/scripts/lib/server.sh"

run_layout() { # dcp
  local dcp=$1 label="tp${TP}-dcp$1" port
  port=$(free_port)
  echo "== $label: $KV_BYTES KV bytes per rank, port $port (load average $(cut -d' ' -f1 /proc/loadavg))"
  RUST_LOG=warn "$DCPSERVE" serve "$MODEL_DIR" --served-model-name mqa --port "$port" \
    --tensor-parallel-size "$TP" --decode-context-parallel-size "$dcp" --dtype float32 \
    --kv-cache-memory-bytes "$KV_BYTES" --threads "$THREADS" --max-num-seqs 256 \
    --no-enable-prefix-caching >"$RESULT_DIR/logs/$label.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$port" "$RESULT_DIR/logs/$label.log"
  # Each concurrency c runs 2c sessions (TURNS turns each), c of them at a time.
  "$DCPSERVE" bench --base-url "http://127.0.0.1:$port" --model mqa --label "$label" \
    --dataset-name agentic --agentic-context-len "$CONTEXT" --agentic-turns "$TURNS" \
    --random-input-len "$TURN_INPUT" --random-output-len "$OUTPUT" --ignore-eos \
    --token-id-min 3 --token-id-max 384 --max-concurrency "$CONCURRENCY" \
    --num-prompts "$TURNS" --prompts-per-concurrency "$((2 * TURNS))" \
    --num-ranks "$TP" --metrics-interval 0.25 --seed 0 --result-dir "$RESULT_DIR" --no-plots
  stop_server
}

run_layout 1
run_layout "$TP"

python3 - "$RESULT_DIR" "$TP" <<'EOF'
import json, sys, pathlib
d, tp = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = [json.loads((d / f"tp{tp}-dcp{x}.json").read_text()) for x in ("1", tp)]
print(f"\n{'layout':>10} {'sessions':>8} {'out tok/s':>10} {'KV max %':>9} {'KV mean %':>10} "
      f"{'preempt':>8} {'running max':>12} {'waiting max':>12} {'TTFT p50 ms':>12} {'errors':>7}")
fmt = lambda v, s=1.0, d=1: "-" if v is None else f"{v * s:.{d}f}"
for r in runs:
    for p in r["points"]:
        s, m = p["summary"], p["server"]
        print(f"{r['label']:>10} {p['max_concurrency']:>8} {s['output_throughput']:>10.1f} "
              f"{fmt(m['kv_usage_max'], 100):>9} {fmt(m['kv_usage_mean'], 100):>10} "
              f"{fmt(m['preemptions'], 1, 0):>8} {fmt(m['running_max'], 1, 0):>12} "
              f"{fmt(m['waiting_max'], 1, 0):>12} {s['ttft_ms']['p50']:>12.0f} {p['error_count']:>7}")
EOF
"$DCPSERVE" bench --replot --result-dir "$RESULT_DIR"
