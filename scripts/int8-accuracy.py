#!/usr/bin/env python3
"""The accuracy rule for int8 activations: dcpserve's int8 matmul against its f32 path,
next to llama.cpp's own (int8-activation) kernels against llama.cpp on the same weights
decoded to F32, on the same text, for the shipped Q4_1 file and requantized K-quant files.

Both sides are measured as `llama-perplexity --kl-divergence` measures: chunks of --ctx
tokens, the second half of each scored, KL(f32 ‖ int8) per position. An int8 path may be
the default (`--cpu-matmul auto`) for a type when its mean KL is within llama.cpp's.

usage: python3 scripts/int8-accuracy.py [--quant Q4_1,Q4_K_M,Q5_K_M,Q6_K] [--chunks 8]
                                        [--ctx 512] [--text FILE] [--exe PATH] [--step N]
                                        [--against int8|auto]
--step 4 (or 1) feeds our side 4 (1) tokens per forward pass, so that the decode-size
kernels are the ones measured (llama.cpp quantizes activations the same way at any size);
--against auto compares what `--cpu-matmul auto` runs (int8 only where it picks int8).
Needs llama.cpp (../shared/peers/install-llama-cpp.sh, 15-20 min on first use).
Only the standard library is used.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import MODEL, ROOT, llama_bin_dir, requantize, run  # noqa: E402

# Plain English that every Debian machine has (the GNU GPL, ~8k tokens).
TEXT = Path("/usr/share/common-licenses/GPL-3")


def llama_kld(bin_dir, model, base, text, ctx, chunks):
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    ppl = str(bin_dir / "llama-perplexity")
    with tempfile.TemporaryDirectory() as tmp:
        kld = str(Path(tmp) / "base.kld")
        run([ppl, "-m", str(base), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
             "-t", "2", "--kl-divergence-base", kld], env=env)
        out = subprocess.run([ppl, "-m", str(model), "-t", "2", "--kl-divergence-base", kld,
                              "--kl-divergence"], env=env, text=True, capture_output=True,
                             check=True)
    log = out.stdout + out.stderr

    def grab(pattern):
        m = re.search(pattern, log)
        if not m:
            sys.exit(f"llama-perplexity printed no {pattern!r}:\n{log[-2000:]}")
        return float(m.group(1))
    return {"mean_kld": grab(r"Mean\s+KLD:\s+([0-9.eE+-]+)"),
            "p99_kld": grab(r"99\.0%\s+KLD:\s+([0-9.eE+-]+)"),
            "max_kld": grab(r"Maximum KLD:\s+([0-9.eE+-]+)"),
            "same_top1": grab(r"Same top p:\s+([0-9.]+)") / 100.0}


def ours_kld(exe, model, text, ctx, chunks, step, against):
    cmd = [str(exe), "kl-divergence", "--model", str(model), "--text", str(text),
           "--ctx", str(ctx), "--chunks", str(chunks), "--against", against]
    if step:
        cmd += ["--step", str(step)]
    out = run(cmd, env=dict(os.environ, RUST_LOG="warn"))
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="Q4_1,Q4_K_M,Q5_K_M,Q6_K",
                    help="Q4_1 is the shipped file; others are requantized from it by llama-quantize")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--text", default=str(TEXT))
    ap.add_argument("--step", type=int, default=0,
                    help="tokens per forward pass on our side (default: one prefill per chunk; "
                         "1-4: as decode steps, through the one-row kernels)")
    ap.add_argument("--against", default="int8",
                    help="our path compared with f32: int8 (every product) or auto (the products "
                         "--cpu-matmul auto sends to int8)")
    ap.add_argument("--exe", default="", help="dcpserve binary (default: build this repository's)")
    a = ap.parse_args()
    run(["bash", str(ROOT / "scripts" / "fetch-default-model.sh")])
    exe = Path(a.exe) if a.exe else ROOT / "target" / "release" / "dcpserve"
    if not a.exe:
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    bin_dir = llama_bin_dir()
    rows = []
    for q in [q.strip() for q in a.quant.split(",") if q.strip()]:
        model = MODEL if q == "Q4_1" else requantize(bin_dir, MODEL, q)
        # The same weights decoded to F32: llama.cpp's exact-activation reference.
        base = requantize(bin_dir, model, "F32")
        lc = llama_kld(bin_dir, model, base, a.text, a.ctx, a.chunks)
        us = ours_kld(exe, model, a.text, a.ctx, a.chunks, a.step, a.against)
        rows.append((q, us, lc))
        print(f"{q}: dcpserve {us}  llama.cpp {lc}", file=sys.stderr)
    print(f"KL(f32 path ‖ int8 activations), {a.chunks} chunks of {a.ctx} tokens of {Path(a.text).name}, "
          f"second halves scored ({rows[0][1]['positions'] if rows else 0} positions)")
    print(f"{'file':8} {'':10} {'mean KLD':>9} {'p99 KLD':>9} {'max KLD':>9} {'same top-1':>10}")
    for q, us, lc in rows:
        for who, r in (("dcpserve", us), ("llama.cpp", lc)):
            print(f"{q:8} {who:10} {r['mean_kld']:9.5f} {r['p99_kld']:9.5f} {r['max_kld']:9.5f} "
                  f"{100 * r['same_top1']:9.1f}%")
        verdict = "within" if us["mean_kld"] <= lc["mean_kld"] else "above"
        print(f"{q:8} {'':10} dcpserve's mean KLD is {verdict} llama.cpp's "
              f"({us['mean_kld'] / lc['mean_kld']:.2f}x)")


if __name__ == "__main__":
    main()
