"""Tiny DeepSeek-V3 (MLA + MoE) fixtures and their transformers references."""

from __future__ import annotations

import json
import shutil

import torch

from reference.common import DTYPE_NAMES, FIXTURES, TINY_VOCAB, dump_json, log
from reference.dense import init_weights, reference_prompts
from reference.tokenizer import tiny_tokenizer_config


DEEPSEEK_SPECS = {
    # q_lora_rank, YaRN (mscale != mscale_all_dim, so both the rope attention factor and
    # the softmax mscale² matter), interleaved rope (DeepSeek's layout), 8 experts.
    "tiny-deepseek": dict(
        seed=2001,
        storage=torch.float32,
        q_lora_rank=24,
        n_routed_experts=8,
        norm_topk_prob=True,
        rope_interleave=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    ),
    # Plain q_proj, no rope scaling, rotate-half rope, 4 experts, bf16 weights.
    "tiny-deepseek-noq": dict(
        seed=2002,
        storage=torch.bfloat16,
        q_lora_rank=None,
        n_routed_experts=4,
        norm_topk_prob=False,
        rope_interleave=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def make_deepseek_config(name: str):
    from transformers import DeepseekV3Config

    spec = DEEPSEEK_SPECS[name]
    return DeepseekV3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=spec["n_routed_experts"],
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=spec["q_lora_rank"],
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        norm_topk_prob=spec["norm_topk_prob"],
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        rope_parameters=dict(spec["rope_parameters"]),
        rope_interleave=spec["rope_interleave"],
        attention_bias=False,
        attention_dropout=0.0,
        use_cache=True,
    )


@torch.no_grad()
def build_deepseek(name: str, tok_json: str) -> None:
    """Like build_tiny, for the MLA/MoE models. The router's e_score_correction_bias is a
    buffer (init_weights only touches parameters), so it is randomized here too: with zeros
    the grouped top-k would not show whether the bias is applied."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = DEEPSEEK_SPECS[name]
    out_dir = FIXTURES / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    torch.manual_seed(spec["seed"])
    config = make_deepseek_config(name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    init_weights(model, spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    for bname, b in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=g))
    model = model.to(spec["storage"])
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    arch = type(model).__name__
    del model
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = DTYPE_NAMES[spec["storage"]]
    cfg["dtype"] = DTYPE_NAMES[spec["storage"]]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "tokenizer.json").write_text(tok_json)
    dump_json(out_dir / "tokenizer_config.json", tiny_tokenizer_config(), indent=2)

    model = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with safe_open(out_dir / "model.safetensors", "pt") as f:
        keys = list(f.keys())
        tensor_list = {k: [DTYPE_NAMES[f.get_tensor(k).dtype], list(f.get_tensor(k).shape)] for k in keys}
    prompts, _, min_margin = reference_prompts(model, spec["seed"] + 7)
    dump_json(
        out_dir / "reference.json",
        {
            "model": name,
            "architecture": arch,
            "weights_dtype": DTYPE_NAMES[spec["storage"]],
            "compute": "transformers CPU float32 (eager attention), log_softmax in float64, rounded to 6 decimals",
            "notes": "logprobs[i] is the full log_softmax row at prompt position positions[i]; greedy = 16 "
            "argmax tokens with the KV cache, no EOS stop; greedy_margin = top1 - top2 logprob.",
            "tensors": tensor_list,
            "prompts": prompts,
        },
    )
    for p in out_dir.iterdir():
        p.chmod(0o644)
    log(f"{name}: {arch}, {len(keys)} tensors, min greedy margin {min_margin:.4f}")


def build_deepseek_all() -> None:
    """The tiny DeepSeek models reuse the tiny tokenizer already in fixtures/tiny-llama,
    so the existing fixtures stay byte-identical."""
    tok_json = (FIXTURES / "tiny-llama" / "tokenizer.json").read_text()
    for name in DEEPSEEK_SPECS:
        build_deepseek(name, tok_json)
