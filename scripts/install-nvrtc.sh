#!/usr/bin/env bash
# Installs NVIDIA's NVRTC (the CUDA runtime compiler, PyPI wheel `nvidia-cuda-nvrtc`)
# into a cache directory, so the CUDA kernels can be compiled to PTX on a machine
# without CUDA (CI, developer laptops). Prints the directory holding libnvrtc.so.13;
# point DCPSERVE_NVRTC_LIB_DIR at it:
#
#   export DCPSERVE_NVRTC_LIB_DIR="$(scripts/install-nvrtc.sh)"
#   cargo test --release -p dcpserve-kernels --test cuda_nvrtc_compile
#
# Idempotent: skips the download when the library is already there.
set -euo pipefail

VERSION="${NVRTC_VERSION:-13.5.37}"
PREFIX="${DCPSERVE_NVRTC_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/dcpserve-nvrtc/$VERSION}"
LIB_DIR="$PREFIX/nvidia/cu13/lib"

if ! ls "$LIB_DIR"/libnvrtc.so.* >/dev/null 2>&1; then
    mkdir -p "$PREFIX"
    echo "installing nvidia-cuda-nvrtc==$VERSION into $PREFIX" >&2
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$PREFIX" "nvidia-cuda-nvrtc==$VERSION" >&2
fi
if ! ls "$LIB_DIR"/libnvrtc.so.* >/dev/null 2>&1; then
    echo "install-nvrtc: no libnvrtc.so.* under $LIB_DIR after installing" >&2
    exit 1
fi
echo "$LIB_DIR"
