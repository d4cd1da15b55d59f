#!/usr/bin/env python3
"""Generate the independent numeric references under fixtures/.

Everything here is computed with Hugging Face transformers on CPU in float32, so the
Rust engine can be checked against a third-party implementation.

    python3 -m venv /root/.cache/dcpserve-ref
    /root/.cache/dcpserve-ref/bin/pip install -r scripts/requirements-ref.txt
    scripts/fetch-default-model.sh
    /root/.cache/dcpserve-ref/bin/python scripts/make_references.py

Outputs (all deterministic: fixed seeds, single-threaded torch):

  fixtures/tiny-llama/   LlamaForCausalLM, llama3 rope scaling, untied, float32 weights
  fixtures/tiny-qwen2/   Qwen2ForCausalLM, q/k/v biases, tied, bfloat16 weights
  fixtures/tiny-qwen3/   Qwen3ForCausalLM, q_norm/k_norm, head_dim 16, tied, float16 weights
      each: config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
            generation_config.json, reference.json
  fixtures/tiny-deepseek/      DeepseekV3ForCausalLM: MLA with q_lora_rank, YaRN, interleaved rope,
                               MoE (8 experts, grouped top-k, dense first layer), float32 weights
  fixtures/tiny-deepseek-noq/  DeepseekV3ForCausalLM: plain q_proj, no rope scaling, 4 experts, bf16
      each also: model.gguf (deepseek2, by llama.cpp's convert_hf_to_gguf.py) + model.gguf.json
  fixtures/tiny-deepseek-fused/  DeepseekV3ForCausalLM in transformers 5's native format: fused experts
                               (mlp.experts.gate_up_proj / down_proj), rope_parameters (YaRN) only,
                               "architectures": null; bf16 weights
  fixtures/tiny_tokenizer_cases.json   encodings + a chat rendering with the shared tiny tokenizer
  fixtures/smollm2/      references for the default GGUF model (models/SmolLM2-135M-Instruct.Q4_1.gguf):
            tokenizer_cases.json, logits.json, chat.json, meta.json

Options: --models-dir DIR (default $DCPSERVE_MODELS_DIR or <repo>/models),
         --skip-smollm2 (only the tiny models; no GGUF needed),
         --only deepseek (only fixtures/tiny-deepseek*; the tokenizer is read from fixtures/tiny-llama),
         --only deepseek-gguf (only their model.gguf, by llama.cpp's converter: scripts/reference/gguf_deepseek.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from reference.common import FIXTURES, REPO, log
from reference.deepseek import build_deepseek_all
from reference.dense import build_tiny_all
from reference.gguf_deepseek import build_deepseek_ggufs
from reference.smollm2 import build_smollm2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--models-dir",
        type=Path,
        default=Path(os.environ.get("DCPSERVE_MODELS_DIR", REPO / "models")),
    )
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument(
        "--only",
        choices=["deepseek", "deepseek-gguf"],
        help="build only this group of fixtures (deepseek: fixtures/tiny-deepseek*), leaving the others as they are",
    )
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic reductions
    torch.use_deterministic_algorithms(True)
    FIXTURES.mkdir(exist_ok=True)

    if args.only in ("deepseek", "deepseek-gguf"):
        if args.only == "deepseek":
            build_deepseek_all()
        build_deepseek_ggufs(FIXTURES)
        return
    build_tiny_all()
    build_deepseek_all()
    build_deepseek_ggufs(FIXTURES)
    if not args.skip_smollm2:
        build_smollm2(args.models_dir.resolve())

    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    log(f"fixtures total: {total / 1e6:.2f} MB")
    assert total < 8_000_000, "fixtures exceed 8 MB"


if __name__ == "__main__":
    main()
