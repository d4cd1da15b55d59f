#!/usr/bin/env bash
# The GPU check (issue #13), in one command that writes its report to a folder.
#
#   scripts/gpu-check.sh --prepare          # on the CPU machine: build and pack the bundle
#   scripts/gpu-check.sh REPORT_DIR         # on the GPU machine (no Rust, no network)
#   DEVICE=cpu scripts/gpu-check.sh DIR     # the same steps on the CPU: a dry run
#
# The GPU machine has no Rust toolchain and no network, and one call carries at most
# 64 MiB together with the repository's own files, so `--prepare` packs what it needs
# into gpu-bundle/ (ignored by git), each folder sized to fit one call:
#   gpu-bundle/1/dcpserve.gz, the kernels' test binary, the model's first part,
#   gpu-bundle/2/, …         the model's next parts; the last holds its checksum.
# Send them in back-to-back device calls (carry gpu-bundle/1, gpu-bundle/2, … with this
# script as the command each time); every call but the last only unpacks.
#
# Steps, each with a time limit so the whole run stays under 8 minutes on one H200:
#   1. nvidia-smi and the CUDA libraries found;
#   2. the generic op tests' CUDA arms (against f64 references), then
#      `dcpserve gpu-check`: every op against the CPU backend, decode attention at 32k
#      and 128k tokens against a device copy's bandwidth, the engine on the fixtures at
#      tp=1, tp=2 dcp=2, tp=4 dcp=2 I=16 and MLA tp=4 dcp=4 against the CPU engine;
#   3. `dcpserve serve` on the default model: the capital-of-France chat must say Paris;
#   4. `dcpserve bench` against it at concurrency 1, 32 and 128 (output tok/s);
#   5. the planner's H200 capacity at tp=1 against the KV tokens the server logged.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
BUNDLE="$ROOT/gpu-bundle"

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    bash scripts/fetch-default-model.sh >/dev/null
    cargo build --release -q
    grep -qx '/gpu-bundle/' .git/info/exclude 2>/dev/null || echo '/gpu-bundle/' >>.git/info/exclude
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/1"
    gzip -c target/release/dcpserve >"$BUNDLE/1/dcpserve.gz"
    # The generic op tests (their `cuda` arms compare each op with an f64 reference).
    tests=$(cargo test --release -p dcpserve-kernels --lib --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "dcpserve_kernels":
        print(m["executable"])' | tail -1)
    gzip -c "$tests" >"$BUNDLE/1/kernels-tests.gz"
    # What travels with every call besides the carried folder: tracked and untracked,
    # not ignored files. One MiB of margin for files added before the call.
    tree=$( (git ls-files -z; git ls-files -z -o --exclude-standard) | xargs -0 stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s + 0}')
    budget=$(((64 << 20) - tree - (1 << 20)))
    room=$((budget - $(stat -c %s "$BUNDLE/1/dcpserve.gz") - $(stat -c %s "$BUNDLE/1/kernels-tests.gz")))
    ((room > (4 << 20))) || { echo "gpu-check: the binaries leave no room for the model in one call" >&2; exit 1; }
    size=$(stat -c %s "models/$MODEL_FILE")
    offset=0 part=1
    while ((offset < size)); do
        n=$((size - offset < room ? size - offset : room))
        mkdir -p "$BUNDLE/$part"
        dd if="models/$MODEL_FILE" of="$BUNDLE/$part/model.part" bs=1M status=none \
            iflag=skip_bytes,count_bytes skip="$offset" count="$n"
        offset=$((offset + n)) part=$((part + 1)) room=$budget
    done
    last=$((part - 1))
    echo "$last" >"$BUNDLE/$last/model.parts"
    sha256sum "models/$MODEL_FILE" | cut -d' ' -f1 >"$BUNDLE/$last/model.sha256"
    du -sh "$BUNDLE"/*
    echo "each call carries ≤ $((budget >> 20)) MiB beside the repository's $((tree >> 20)) MiB"
    echo "carry gpu-bundle/1 … gpu-bundle/$last in turn, each with: bash scripts/gpu-check.sh \$OUT"
    exit 0
fi

REPORT="${1:?usage: scripts/gpu-check.sh REPORT_DIR | --prepare}"
DEVICE="${DEVICE:-cuda}"
mkdir -p "$REPORT"
LOG="$REPORT/gpu-check.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
START=$(date +%s)
elapsed() { echo "$(($(date +%s) - START)) s"; }

# --- the binary and the model ------------------------------------------------------
BIN="${DCPSERVE_BIN:-}"
if [[ -z "$BIN" ]]; then
    if [[ -f "$BUNDLE/1/dcpserve.gz" ]]; then
        BIN=/tmp/dcpserve-gpu/dcpserve
        mkdir -p /tmp/dcpserve-gpu
        [[ -x "$BIN" ]] || { gunzip -c "$BUNDLE/1/dcpserve.gz" >"$BIN" && chmod +x "$BIN"; }
    else
        BIN="$ROOT/target/release/dcpserve"
    fi
fi
if [[ ! -f "models/$MODEL_FILE" && -f "$BUNDLE/1/model.part" ]]; then
    # The last bundle names the part count; until it has come, each call only unpacks.
    sums=$(ls "$BUNDLE"/*/model.sha256 2>/dev/null | head -1)
    if [[ -z "$sums" ]]; then
        echo "unpacked $(ls -d "$BUNDLE"/*/ | wc -l) bundle(s); carry the next one and run this script again"
        exit 0
    fi
    parts=$(cat "$(dirname "$sums")/model.parts")
    mkdir -p models
    for i in $(seq 1 "$parts"); do
        [[ -f "$BUNDLE/$i/model.part" ]] || { say "gpu-bundle/$i is missing (the machine was released between calls?)"; exit 1; }
        cat "$BUNDLE/$i/model.part"
    done >"models/$MODEL_FILE"
    if [[ "$(sha256sum "models/$MODEL_FILE" | cut -d' ' -f1)" != "$(cat "$sums")" ]]; then
        say "the reassembled model does not match its checksum"; rm -f "models/$MODEL_FILE"; exit 1
    fi
fi
[[ -x "$BIN" ]] || { say "no dcpserve binary at $BIN (run scripts/gpu-check.sh --prepare)"; exit 1; }

# --- 1. the device and its libraries -----------------------------------------------
if [[ "$DEVICE" == cuda ]]; then
    # The GPU image keeps the CUDA libraries in python3's nvidia-* wheels.
    libdirs=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)})
print(":".join(dirs))
EOF
)
    # cudarc looks for libnccl.so, the NCCL wheel ships only libnccl.so.2.
    mkdir -p /tmp/dcpserve-gpu/lib
    for d in ${libdirs//:/ }; do
        [[ -e "$d/libnccl.so.2" ]] && ln -sf "$d/libnccl.so.2" /tmp/dcpserve-gpu/lib/libnccl.so
    done
    export LD_LIBRARY_PATH="/tmp/dcpserve-gpu/lib:${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export DCPSERVE_CUDA_LIB_DIR="${DCPSERVE_CUDA_LIB_DIR:-$libdirs}"
    export DCPSERVE_NVRTC_LIB_DIR="${DCPSERVE_NVRTC_LIB_DIR:-$(tr ':' '\n' <<<"$libdirs" | grep -m1 nvrtc || true)}"
    say "== device"
    (nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true) | tee -a "$LOG"
    say "CUDA library folders: ${libdirs:-none found}"
fi
say "binary: $BIN ($("$BIN" --version 2>&1))"

status=0
# --- 2a. the generic op tests' CUDA arms (each op against an f64 reference) ---------
if [[ "$DEVICE" == cuda && -f "$BUNDLE/1/kernels-tests.gz" ]]; then
    say "== op tests, cuda arms ($(elapsed))"
    gunzip -c "$BUNDLE/1/kernels-tests.gz" >/tmp/dcpserve-gpu/kernels-tests
    chmod +x /tmp/dcpserve-gpu/kernels-tests
    timeout 120 /tmp/dcpserve-gpu/kernels-tests --test-threads=1 ::cuda >"$REPORT/op-tests.txt" 2>&1 || status=1
    grep -E "^test |test result" "$REPORT/op-tests.txt" | tee -a "$LOG"
fi
# --- 2b. ops, bandwidth, engine on the fixtures ------------------------------------
say "== gpu-check ($(elapsed))"
if [[ "$DEVICE" == cuda ]]; then
    contexts=32768,131072
    copy=1024
else
    contexts=2048,8192
    copy=64
fi
timeout 240 "$BIN" gpu-check --device "$DEVICE" --report "$REPORT" --fixtures fixtures \
    --contexts "$contexts" --copy-mib "$copy" >>"$LOG" 2>"$REPORT/gpu-check.stderr" || status=1
cat "$REPORT/gpu-check.txt" 2>/dev/null || tail -20 "$REPORT/gpu-check.stderr"

# --- 3. serve the default model: Paris ---------------------------------------------
say "== serve ($(elapsed))"
PORT=18734
"$BIN" serve "models/$MODEL_FILE" --device "$DEVICE" --port "$PORT" \
    >"$REPORT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
up=0
for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then up=1; break; fi
    kill -0 $SERVER 2>/dev/null || break
    sleep 1
done
if [[ $up == 1 ]]; then
    answer=$(curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":24,"temperature":0}')
    say "chat: $answer"
    if grep -q Paris <<<"$answer"; then say "Paris: yes"; else say "Paris: NO"; status=1; fi

    # --- 4. throughput at concurrency 1, 32, 128 -----------------------------------
    # The CPU dry run keeps the same steps at sizes a 2-core machine finishes.
    if [[ "$DEVICE" == cuda ]]; then levels="1 32 128"; else levels="1 4 8"; fi
    for c in $levels; do
        say "== bench, concurrency $c ($(elapsed))"
        n=$((c > 16 ? c : 16))
        timeout 150 "$BIN" bench --base-url "http://127.0.0.1:$PORT" --num-prompts "$n" \
            --max-concurrency "$c" --random-input-len 256 --random-output-len 128 --ignore-eos \
            >"$REPORT/bench-c$c.txt" 2>&1 || status=1
        # The header and the row (out tok/s is the fifth column).
        tail -2 "$REPORT/bench-c$c.txt" | tee -a "$LOG"
    done
else
    say "the server did not come up:"; tail -20 "$REPORT/serve.log" | tee -a "$LOG"; status=1
fi
kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null

# --- 5. the planner against the KV tokens the server logged ------------------------
if [[ "$DEVICE" == cuda ]]; then
    say "== plan ($(elapsed))"
    grep -m2 "KV cache" "$REPORT/serve.log" | tee -a "$LOG"
    # The same rule and inputs as the engine: bf16 weights (GGUF dequantized at load), a
    # bf16 cache, the device's memory as the driver reports it.
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    gb=$(python3 -c "print(${mib:-0} * 1048576 / 1e9)")
    "$BIN" plan --model "models/$MODEL_FILE" --hardware h200 --gpus 1 --mem-per-gpu-gb "$gb" \
        --weight-dtype bf16 --kv-dtype bf16 2>&1 | tee -a "$LOG" | tail -15
fi
say "== done in $(elapsed), status $status"
exit $status
