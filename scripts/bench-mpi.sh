#!/usr/bin/env bash
# Decode step times at tp=2 dcp=2 with the ranks (1) as threads of one process, (2) as
# two MPI processes on this host (Open MPI's shared-memory transport), (3) as two MPI
# processes in two network namespaces joined by a veth pair (Open MPI's TCP transport;
# needs root): `dcpserve bench-dcp --section ranks` in each, then one table.
# Extra arguments go to bench-dcp (e.g. --context 16384 --overlap-batch 32).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-mpi.sh
cargo build --release --quiet --features mpi --bin dcpserve
BIN=$PWD/target/release/dcpserve
ARGS=(bench-dcp --section ranks --tensor-parallel-size 2 "$@")
# Unbound: Open MPI binds each of 2 processes to one core by default, and in the
# two-namespace case both to the same core (each "host" thinks it is alone).
MPI=(--allow-run-as-root --oversubscribe --bind-to none -np 2)
OUT=$(mktemp -d)
trap 'bash scripts/netns-two-hosts.sh down; rm -rf "$OUT"' EXIT

"$BIN" "${ARGS[@]}" >"$OUT/in-process.txt"
mpirun "${MPI[@]}" "$BIN" "${ARGS[@]}" --distributed-executor-backend mpi >"$OUT/mpi-shm.txt"
bash scripts/netns-two-hosts.sh up
ip netns exec dcpserve-10.231.7.1 mpirun "${MPI[@]}" \
    --mca plm_rsh_agent "$PWD/scripts/netns-rsh.sh" --host 10.231.7.1,10.231.7.2 \
    --mca btl tcp,self --mca btl_tcp_if_include 10.231.7.0/24 \
    --mca oob_tcp_if_include 10.231.7.0/24 \
    "$BIN" "${ARGS[@]}" --distributed-executor-backend mpi >"$OUT/mpi-tcp.txt"

python3 - "$OUT" <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [("in-process (threads, shared memory)", "in-process.txt"),
        ("MPI, 2 processes, shared memory", "mpi-shm.txt"),
        ("MPI, 2 namespaces, TCP over veth", "mpi-tcp.txt")]
pat = re.compile(r"one (\d+)-token sequence ([\d.]+) ms; (\d+) sequences of (\d+) tokens: "
                 r"one step at a time ([\d.]+) ms, two micro-batches ([\d.]+) ms")
print("decode step at tp=2 dcp=2 (bench-dcp --section ranks; medians)")
head = None
for name, f in rows:
    m = pat.search((out / f).read_text())
    if not m:
        sys.exit(f"no result in {f}: {(out / f).read_text()}")
    ctx, one, n, nctx, seq, mb = m.groups()
    if head is None:
        head = (f"| ranks | 1 × {ctx}-token seq | {n} × {nctx}-token seqs, one step at a time "
                f"| {n} seqs, two micro-batches | overlap gain |")
        print(head)
        print("|---|---:|---:|---:|---:|")
    print(f"| {name} | {float(one):.2f} ms | {float(seq):.2f} ms | {float(mb):.2f} ms "
          f"| {float(seq) / float(mb):.2f}× |")
PY
