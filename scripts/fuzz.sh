#!/usr/bin/env bash
# Builds every fuzz target in fuzz/ (libFuzzer) and runs each for N seconds, failing on the
# first crash, timeout, or allocation past the input's bound. Usage:
#   scripts/fuzz.sh [--seconds N] [TARGET...]      (default: 20 s each, every target)
#
# The build uses the stable toolchain with the instrumentation `cargo fuzz build -s none`
# uses (SanitizerCoverage, debug assertions, overflow checks), so it needs neither nightly
# nor cargo-fuzz. With a nightly toolchain and cargo-fuzz, `cd fuzz && cargo +nightly fuzz
# run <target>` runs the same targets under AddressSanitizer.
#
# Seeds: fuzz/corpus/<target>/ (committed, from fuzz/make_seeds.py). What the fuzzer adds goes
# to fuzz/corpus-work/<target>/, crashing inputs to fuzz/artifacts/<target>/ (both ignored by
# git). A crash found here becomes a regression input: copy it to fuzz/regressions/<target>/,
# where the crates' unit tests replay it (`cargo test -p dcpserve-model --lib fuzzing`).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --seconds=*) seconds="${1#--seconds=}"; shift ;;
        -h|--help) sed -n 2,4p "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
all=(gguf quant_blocks safetensors config_json chat_template request tool_output)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# Longest input each target is given (bytes): room for the seeds and a little more.
max_len() {
    case "$1" in
        gguf) echo 65536 ;;
        request|safetensors) echo 16384 ;;
        tool_output) echo 1024 ;; # each input is parsed at every chunk boundary
        *) echo 4096 ;;
    esac
}

command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }
host=$(rustc -vV | sed -n 's/^host: //p')
# The flags cargo-fuzz passes for `-s none`. An explicit --target keeps them off build
# scripts and proc macros.
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
export RUSTFLAGS
bin_args=()
for t in "${targets[@]}"; do bin_args+=(--bin "$t"); done
echo "== building ${#targets[@]} fuzz targets"
cargo build --release --manifest-path fuzz/Cargo.toml --target "$host" "${bin_args[@]}"

failed=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus-work/$t" "fuzz/artifacts/$t"
    dict=()
    [ -f "fuzz/dicts/$t.dict" ] && dict=(-dict="fuzz/dicts/$t.dict")
    # The inputs that once crashed are read first too, so each is replayed under the
    # allocation and time bounds (the unit tests replay them without those bounds).
    regressions=()
    [ -d "fuzz/regressions/$t" ] && regressions=("fuzz/regressions/$t")
    echo "== $t: ${seconds} s"
    # -timeout: seconds per input; -rss_limit_mb: the whole process; the allocation bound
    # per input is fuzz/src/lib.rs's. -close_fd_mask=1 keeps the targets' stdout quiet.
    if ! "fuzz/target/$host/release/$t" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len="$(max_len "$t")" -close_fd_mask=1 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" "${dict[@]}" \
        "fuzz/corpus-work/$t" "fuzz/corpus/$t" "${regressions[@]}" 2>"fuzz/artifacts/$t.log"; then
        failed+=("$t")
        tail -n 60 "fuzz/artifacts/$t.log"
    fi
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|Done [0-9]+ runs" \
        "fuzz/artifacts/$t.log" | tr '\n' ' ' || true
    echo
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzzing: ${#targets[@]} targets, ${seconds} s each, no crash"
