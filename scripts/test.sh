#!/usr/bin/env bash
# The project's test command: formatting, lints, and every test (unit, integration,
# doc), after fetching the default model the tests compare against.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-default-model.sh >/dev/null
# Rank processes over MPI (feature `mpi`) are built and tested too: Open MPI + libclang.
bash scripts/install-mpi.sh
command -v cargo >/dev/null || { echo "cargo is required (rustup)"; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
# The default build (no MPI) and the MPI build both lint clean.
cargo clippy --workspace --release -- -D warnings
cargo clippy --workspace --all-targets --release --features mpi -- -D warnings
# Every CUDA kernel compiles with NVRTC, also here without a GPU (PyPI's wheel, cached).
DCPSERVE_NVRTC_LIB_DIR="$(bash scripts/install-nvrtc.sh)"
export DCPSERVE_NVRTC_LIB_DIR
cargo test --workspace --release --features mpi
# The CUDA backend on the emulated CUDA device (gpu_emu/: stand-in driver, NVRTC, cuBLAS and
# NCCL that cudarc loads as it loads the real ones): every `cuda` arm of
# test_on_every_backend! and the device-local collectives, on one emulated device and on
# four. A `cuda` arm that finds no device skips, so a skip here is a failure.
emulated_cuda_tests() {
    local log
    log=$(mktemp)
    bash scripts/gpu-emulated.sh cargo test --release --features mpi -p dcpserve-kernels \
        --lib cuda 2>&1 | tee "$log"
    if grep -q "skipped: no CUDA device" "$log"; then
        echo "the emulated CUDA device was not found" >&2
        exit 1
    fi
}
emulated_cuda_tests
DCPEMU_DEVICES=4 emulated_cuda_tests
# gpu-check on one emulated device (every rank on it: device-local collectives within one
# GPU) and on four (a rank per GPU): op comparisons with the CPU backend, the engine cases
# (tp=4 dcp=2, MLA tp=2 dcp=2, ...) against the CPU engine, micro-batch streams, graphs vs
# eager launches; the bandwidth section says it is emulated (about 90 s each).
for devices in 1 4; do
    DCPEMU_DEVICES=$devices bash scripts/gpu-emulated.sh target/release/dcpserve gpu-check \
        --report "target/gpu-check-emulated-$devices" --contexts 1024 --copy-mib 16
done
# The default model served with --device cuda on the emulated device answers the README's
# question with Paris (the KV budget needs more than the emulator's default 4 GiB).
DCPEMU_MEMORY_MIB=16384 bash scripts/gpu-emulated.sh bash scripts/chat-check.sh --device cuda
# Every CPU kernel level the machine has, whatever its best: the kernel tests compare
# each level explicitly; these runs cap the level process-wide (DCPSERVE_CPU_ISA), so the
# backend and the default model (against transformers) also run on the AVX2 paths an
# AVX2-only CPU takes, and on the scalar fallback.
for isa in $(bash scripts/cpu-isa-levels.sh); do
    DCPSERVE_CPU_ISA=$isa cargo test --release --features mpi -p dcpserve-kernels --lib
    DCPSERVE_CPU_ISA=$isa cargo test --release --features mpi --test default_model --test tiny_models
done
# The NEON kernels: the kernel tests cross-compiled for aarch64 and run under qemu-user
# (says so and skips when the target or the emulator cannot be installed).
bash scripts/test-aarch64.sh
# Every TP/DCP layout equal to one rank on the AVX2 paths too (attention merges).
if bash scripts/cpu-isa-levels.sh | grep -qx avx2; then
    DCPSERVE_CPU_ISA=avx2 cargo test --release --features mpi --test parallel_equivalence
fi
# The HTTP API through the real `openai` Python client (pinned; installed in a venv).
DCPSERVE_CARGO_FEATURES=mpi bash tests/python/run.sh
# The web page at `GET /` in headless Chromium (installed from Debian's packages): a
# streamed chat, Stop, and the engine view's KV placement changing during a request.
DCPSERVE_CARGO_FEATURES=mpi bash scripts/web-ui-test.sh
# Every fuzz target (GGUF, quantized blocks, safetensors, config.json, chat templates,
# requests, tool-call / reasoning parsers) for 10 s from the committed seeds: no panic, no
# allocation past the input's bound, no input over its time bound (libFuzzer, stable
# toolchain; the found inputs are replayed by the unit tests above).
bash scripts/fuzz.sh --seconds 10
# 5,000 generated requests (valid, boundary, malformed, disconnects) per layout, tp=1
# and tp=4 dcp=2: no 5xx, no hang, everything drained, memory bounded, same greedy text.
bash scripts/request-storm.sh --requests 5000
