#!/usr/bin/env bash
# Runs a command on the emulated CUDA device (issue #26): the engine's CUDA backend, its
# NVRTC kernels, cuBLAS and NCCL calls execute on the CPU through gpu_emu/.
#
#   scripts/gpu-emulated.sh target/release/dcpserve serve MODEL --device cuda
#   DCPEMU_DEVICES=4 scripts/gpu-emulated.sh target/release/dcpserve gpu-check --report /tmp/gc
#
# Builds the emulator (release, `-p dcpserve-gpu-emu`) when any of its sources is newer
# than the library, links it under every file name cudarc and the engine open
# (libcuda.so.1, libnvrtc.so.13, libcublas.so.13, libnccl.so.2, ...) in one folder, puts
# that folder on LD_LIBRARY_PATH and in DCPSERVE_NVRTC_LIB_DIR / DCPSERVE_CUDA_LIB_DIR
# (the engine dlopens some libraries by full path from there), then execs the command.
# All names are links to one file, so the dynamic loader maps it once: the "driver",
# "NVRTC", "cuBLAS" and "NCCL" share one emulated device memory.
#
# Settings (see gpu_emu/NOTES-driver.md): DCPEMU_DEVICES (default 1), DCPEMU_MEMORY_MIB
# per device (default 4096), DCPEMU_POISON=1, DCPEMU_RANDOM_DELAY_US=N.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -eq 0 ]; then
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
LIB="$TARGET/release/libdcpserve_gpu_emu.so"

stale() {
    [ ! -f "$LIB" ] && return 0
    [ -n "$(find "$ROOT/gpu_emu/src" "$ROOT/gpu_emu/include" "$ROOT/gpu_emu/Cargo.toml" \
        -newer "$LIB" -type f -print -quit 2>/dev/null)" ]
}
if stale; then
    echo "gpu-emulated: building the emulator (cargo build --release -p dcpserve-gpu-emu)" >&2
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" cargo build --release -p dcpserve-gpu-emu >&2)
fi

DIR="$TARGET/gpu-emu-libs"
mkdir -p "$DIR"
for name in libcuda.so libcuda.so.1 \
    libnvrtc.so libnvrtc.so.13 libnvrtc-builtins.so.13.0 \
    libcublas.so libcublas.so.13 libcublasLt.so libcublasLt.so.13 \
    libnccl.so libnccl.so.2; do
    ln -sfn "$LIB" "$DIR/$name"
done

export LD_LIBRARY_PATH="$DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DCPSERVE_NVRTC_LIB_DIR="$DIR"
export DCPSERVE_CUDA_LIB_DIR="$DIR"
exec "$@"
