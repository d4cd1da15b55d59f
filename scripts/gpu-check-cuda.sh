#!/usr/bin/env bash
# GPU check of the CUDA backend: the generic Backend op tests (kernels/src/backend/tests*,
# whose `cuda` arms run on device 0 and print `skipped` without a GPU), from a test
# binary built on this machine and run on the GPU machine (no Rust toolchain there).
#
#   scripts/gpu-check-cuda.sh build   # here: writes target/gpu-check/kernels-tests
#   scripts/gpu-check-cuda.sh run     # there, carrying target/gpu-check: runs the CUDA arms
#
# On the GPU machine the CUDA 13 libraries (NVRTC, cuBLAS) come from python3's
# `nvidia-*` wheels; their directories are passed through DCPSERVE_CUDA_LIB_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/gpu-check

case "${1:-}" in
build)
    exe=$(cargo test --release -p dcpserve-kernels --lib --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "dcpserve_kernels":
        print(m["executable"])' | tail -1)
    mkdir -p "$OUT"
    cp "$exe" "$OUT/kernels-tests"
    echo "$OUT/kernels-tests"
    ;;
run)
    libs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = sorted({d for r in roots for d in glob.glob(os.path.join(r, "*", "lib"))})
print(":".join(dirs))
PY
)
    export DCPSERVE_CUDA_LIB_DIR="${DCPSERVE_CUDA_LIB_DIR:-$libs}"
    echo "CUDA library dirs: ${DCPSERVE_CUDA_LIB_DIR:-none}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    # The `cuda` arm of every generic op test; one at a time, so a failure names its op.
    "$OUT/kernels-tests" --test-threads=1 ::cuda 2>&1
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
