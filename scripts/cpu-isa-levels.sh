#!/usr/bin/env bash
# Prints the CPU kernel levels below this machine's best (DCPSERVE_CPU_ISA values), one
# per line: the levels the test command runs again with the cap (the best level runs in
# the main test run). Never AMX: the kernels have none.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl && has avx2 && has fma && has f16c; then
    echo avx2
fi
echo scalar
