#!/usr/bin/env python3
"""Side-by-side benchmark: dcpserve vs llama.cpp on the default model, same machine, same run.

Measures prefill tok/s (512-token prompt), one-sequence decode tok/s and 32-sequence
aggregate decode tok/s, with 2 threads each, and prints the ratios dcpserve / llama.cpp.
Each engine is measured `--repeats` times, alternating, and medians are reported.

usage: python3 scripts/bench.py [--repeats 3] [--threads 2] [--decode-tokens 128] [--batch 32]
                               [--exe LABEL=PATH ...] [--isa avx2,avx512] [--quant Q4_K_M,...]
                               [--model FILE.gguf] [--matmul f32,int8]
--exe measures other dcpserve binaries in the same run (e.g. a build from before a change:
`--exe before=/tmp/before/dcpserve --exe after=target/release/dcpserve`); without it the
repository's release build is measured (and built first).
--isa measures each binary once per CPU kernel level (DCPSERVE_CPU_ISA), e.g. the AVX2
path an AVX2-only CPU takes, on an AVX-512 machine, in the same run.
--matmul measures each binary once per CPU matmul path (DCPSERVE_CPU_MATMUL: what
`--cpu-matmul auto` means), e.g. `f32,int8` to compare the two on every file and level.
--quant measures the same rows on requantized versions of the model too, made with the
peer install's `llama-quantize --allow-requantize` (cached under models/requant/); the
model given by --model (default: the shipped Q4_1 file) is always measured first.
llama.cpp is installed on first use with ../shared/peers/install-llama-cpp.sh (15-20 min).
Only the standard library is used.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def llama_bin_dir():
    for cand in [ROOT.parent / "shared" / "peers" / "install-llama-cpp.sh",
                 ROOT / ".." / "shared" / "peers" / "install-llama-cpp.sh"]:
        if cand.exists():
            out = run(["bash", str(cand)])
            return Path(out.strip().splitlines()[-1])
    sys.exit("install-llama-cpp.sh not found next to the repository (../shared/peers)")


def requantize(bin_dir, src, quant):
    """`src` requantized to `quant` by llama.cpp's own tool (cached)."""
    out = ROOT / "models" / "requant" / f"{src.stem}.{quant}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(src), str(tmp), quant],
            env=dict(os.environ, LD_LIBRARY_PATH=str(bin_dir)))
        tmp.rename(out)
    return out


def llama_cpp(bin_dir, model, threads, prompt, decode, batch):
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    bench = json.loads(run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads),
                            "-p", str(prompt), "-n", str(decode), "-r", "3", "-o", "json"], env=env))
    pp = next(r["avg_ts"] for r in bench if r["n_prompt"] == prompt and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in bench if r["n_gen"] == decode and r["n_prompt"] == 0)
    out = run([str(bin_dir / "llama-batched-bench"), "-m", str(model), "-t", str(threads),
               "-c", str(batch * (16 + decode) + 64), "-b", "2048", "-ub", "512",
               "-npp", "16", "-ntg", str(decode), "-npl", str(batch),
               "--output-format", "jsonl"], env=env)
    rows = [json.loads(l) for l in out.splitlines() if l.strip().startswith("{")]
    s_tg = next(r["speed_tg"] for r in rows if r.get("pl") == batch)
    return {"prefill_tok_s": pp, "decode_1_tok_s": tg, "decode_batch_tok_s": s_tg}


def dcpserve(exe, isa, matmul, model, threads, prompt, decode, batch):
    env = dict(os.environ, RUST_LOG="warn")
    if isa:
        env["DCPSERVE_CPU_ISA"] = isa
    if matmul:
        env["DCPSERVE_CPU_MATMUL"] = matmul
    out = run([str(exe), "bench-engine", "--model", str(model), "--threads", str(threads),
               "--prompt-tokens", str(prompt), "--decode-tokens", str(decode), "--batch", str(batch),
               "--repeats", "1"], env=env)
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--exe", action="append", default=[], metavar="LABEL=PATH",
                    help="a dcpserve binary to measure (repeatable); default: this repository's build")
    ap.add_argument("--isa", default="", help="comma-separated DCPSERVE_CPU_ISA caps to measure "
                    "each binary at (scalar, avx2, avx512); default: the CPU's best")
    ap.add_argument("--model", default=str(MODEL), help="the GGUF file (default: the shipped Q4_1)")
    ap.add_argument("--quant", default="", help="comma-separated llama-quantize types (Q4_K_M, "
                    "Q5_K_M, Q6_K, ...) to measure too, requantized from --model")
    ap.add_argument("--matmul", default="", help="comma-separated CPU matmul paths (f32, int8) to "
                    "measure each binary with (DCPSERVE_CPU_MATMUL); default: what auto picks")
    a = ap.parse_args()
    run(["bash", str(ROOT / "scripts" / "fetch-default-model.sh")])
    exes = []
    for spec in a.exe:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            sys.exit(f"--exe wants LABEL=PATH to an existing binary, got {spec!r}")
        exes.append((label, Path(path).resolve()))
    if not exes:
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
        exes = [("dcpserve", ROOT / "target" / "release" / "dcpserve")]
    bin_dir = llama_bin_dir()
    isas = [i.strip() for i in a.isa.split(",") if i.strip()] or [""]
    matmuls = [m.strip() for m in a.matmul.split(",") if m.strip()] or [""]
    # (label, binary, kernel level cap, matmul path) of every configuration of ours.
    configs = [(label + (f"@{isa}" if isa else "") + (f"/{mm}" if mm else ""), exe, isa, mm)
               for label, exe in exes for isa in isas for mm in matmuls]
    models = [("", Path(a.model).resolve())]
    models += [(q, requantize(bin_dir, Path(a.model).resolve(), q))
               for q in a.quant.split(",") if q.strip()]
    for quant, model in models:
        print(f"\n== {model.name} ==")
        measure(a, bin_dir, configs, model)


def measure(a, bin_dir, configs, model):
    keys = ["prefill_tok_s", "decode_1_tok_s", "decode_batch_tok_s"]
    ours = {label: {k: [] for k in keys} for label, _, _, _ in configs}
    peer = {k: [] for k in keys}
    # Alternate the engines within each round so that slow drifts of a noisy machine hit all alike.
    for i in range(a.repeats):
        line = []
        for label, exe, isa, matmul in configs:
            o = dcpserve(exe, isa, matmul, model, a.threads, a.prompt_tokens, a.decode_tokens, a.batch)
            for k in keys:
                ours[label][k].append(o[k])
            line.append(f"{label} {o}")
        p = llama_cpp(bin_dir, model, a.threads, a.prompt_tokens, a.decode_tokens, a.batch)
        for k in keys:
            peer[k].append(p[k])
        print(f"run {i + 1}: {'  '.join(line)}  llama.cpp {p}", file=sys.stderr)
    names = {"prefill_tok_s": f"prefill ({a.prompt_tokens}-token prompt)",
             "decode_1_tok_s": "decode, 1 sequence",
             "decode_batch_tok_s": f"decode, {a.batch} sequences (aggregate)"}
    head = "".join(f" {label:>16} {'ratio':>7}" for label, _, _, _ in configs)
    print(f"{'measure':40}{head} {'llama.cpp':>10}   (tok/s, medians of {a.repeats}, {a.threads} threads; ratio = / llama.cpp)")
    for k in keys:
        p = statistics.median(peer[k])
        cols = ""
        for label, _, _, _ in configs:
            o = statistics.median(ours[label][k])
            cols += f" {o:16.1f} {o / p:7.2f}"
        print(f"{names[k]:40}{cols} {p:10.1f}")


if __name__ == "__main__":
    main()
