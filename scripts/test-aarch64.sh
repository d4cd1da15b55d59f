#!/usr/bin/env bash
# The kernel unit tests cross-compiled for aarch64 and run under qemu-user, so the NEON
# kernels (and the scalar fallback as an aarch64 CPU runs it) are tested on x86 machines.
# Installs what it needs when missing: the Rust target (rustup) and Debian's
# cross linker, arm64 libc and qemu-user (apt-get, as root). When they cannot be
# fetched (offline, no root) it says so and exits 0: a missing download is not a test
# failure. Extra arguments go to the test binary (e.g. a test-name filter).
#
# Under qemu the run takes about two minutes (every kernel test runs at the scalar and
# NEON levels, emulated).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

not_run() {
    echo "test-aarch64: NEON kernel tests NOT run: $*" >&2
    exit 0
}

command -v cargo >/dev/null || { echo "cargo is required (rustup)"; exit 1; }

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    rustup target add "$TARGET" >/dev/null 2>&1 ||
        not_run "could not install the Rust target $TARGET (rustup target add failed: offline?)"
fi

# The cross tools: linker, the arm64 C library to link against, and the emulator.
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
[[ -e $SYSROOT/lib/libc.so ]] || missing+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null ||
            not_run "missing ${missing[*]} and not root (apt-get needs root)"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null || not_run "missing ${missing[*]} and no apt-get"
    { "${sudo[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 ||
        not_run "could not install ${missing[*]} with apt-get"
fi

# Explicit settings in the environment win.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER:-qemu-aarch64 -L $SYSROOT}"
cargo test --release -p dcpserve-kernels --lib --target "$TARGET" -- "$@"
