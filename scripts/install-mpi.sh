#!/usr/bin/env bash
# Open MPI (mpirun, mpicc) and libclang, which the `mpi` feature needs to build (the
# `mpi` crate generates its bindings from mpi.h) and its tests need to run. Installs
# Debian's packages when one is missing; does nothing otherwise.
set -euo pipefail
pkgs=(openmpi-bin libopenmpi-dev libclang-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
