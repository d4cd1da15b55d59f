"""Tiny DeepSeek-V3 (MLA + MoE) fixtures and their transformers references."""

from __future__ import annotations

import json

import torch

from reference.common import DTYPE_NAMES, FIXTURES, TINY_VOCAB, dump_json, log
from reference.dense import fresh_fixture_model, reference_prompts, reload_fixture, save_fixture


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


# Saved in transformers 5's native format: `save_pretrained(..., save_original_format=False)`
# keeps the routed experts fused (`mlp.experts.gate_up_proj` [experts, 2·moe_inter, hidden],
# gate rows first, and `mlp.experts.down_proj` [experts, hidden, moe_inter]); config.json is
# left as transformers writes it (`rope_parameters` only, no `rope_theta` / `rope_scaling` /
# `torch_dtype`), except `"architectures": null`, so the model must be found from `model_type`
# (transformers itself does so when it reloads the folder for the reference).
NATIVE_SPECS = {
    "tiny-deepseek-fused": dict(
        seed=2004,
        storage=torch.bfloat16,
        q_lora_rank=16,
        n_routed_experts=8,
        norm_topk_prob=True,
        rope_interleave=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
}


def make_deepseek_config(name: str):
    from transformers import DeepseekV3Config

    spec = {**DEEPSEEK_SPECS, **NATIVE_SPECS}[name]
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


def patch_config(path, storage, arch: str) -> None:
    """Names the architecture and the storage dtype in config.json."""
    cfg = json.loads(path.read_text())
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = DTYPE_NAMES[storage]
    cfg["dtype"] = DTYPE_NAMES[storage]
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def null_architectures(path) -> None:
    """Only `architectures` changes (to null); the rest stays as transformers wrote it."""
    cfg = json.loads(path.read_text())
    cfg["architectures"] = None
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def build_deepseek(name: str, tok_json: str) -> None:
    """Like build_tiny, for the MLA/MoE models. The router's e_score_correction_bias is a
    buffer (init_weights only touches parameters), so it is randomized here too: with zeros
    the grouped top-k would not show whether the bias is applied."""
    native = name in NATIVE_SPECS
    spec = {**DEEPSEEK_SPECS, **NATIVE_SPECS}[name]
    storage = spec["storage"]
    model, out_dir = fresh_fixture_model(name, spec["seed"], lambda: make_deepseek_config(name))
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    for bname, b in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=g))
    if native:
        arch = save_fixture(
            model, out_dir, storage, tok_json, lambda path, arch: null_architectures(path), original_format=False
        )
    else:
        arch = save_fixture(model, out_dir, storage, tok_json, lambda path, arch: patch_config(path, storage, arch))
    del model
    # The native layout names every stored tensor as the model does, so each can be checked.
    model, keys, tensor_list = reload_fixture(out_dir, storage, check_weights=native)
    if native:
        cfg = json.loads((out_dir / "config.json").read_text())
        assert cfg["architectures"] is None and "rope_parameters" in cfg, cfg
        assert not {"rope_theta", "rope_scaling", "torch_dtype"} & set(cfg), cfg
        fused = [k for k in keys if k.endswith("mlp.experts.gate_up_proj")]
        assert fused and not any(".experts.0." in k for k in keys), keys
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
    for name in [*DEEPSEEK_SPECS, *NATIVE_SPECS]:
        build_deepseek(name, tok_json)
