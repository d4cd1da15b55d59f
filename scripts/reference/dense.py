"""Tiny Llama / Qwen2 / Qwen3 fixtures and their transformers references."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from reference.common import DTYPE_NAMES, FIXTURES, TINY_VOCAB, dump_json, log, r6, rows6
from reference.tokenizer import tiny_tokenizer_cases, tiny_tokenizer_config, train_tiny_tokenizer


TINY_SPECS = {
    "tiny-llama": dict(
        seed=1001,
        storage=torch.float32,
        legacy_rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "tiny-qwen2": dict(seed=1002, storage=torch.bfloat16, legacy_rope_scaling=None),
    "tiny-qwen3": dict(seed=1003, storage=torch.float16, legacy_rope_scaling=None),
}


def make_config(name: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        hidden_act="silu",
        attention_dropout=0.0,
        use_cache=True,
    )
    if name == "tiny-llama":
        return LlamaConfig(
            **common,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=160,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_theta": 10000.0, **TINY_SPECS[name]["legacy_rope_scaling"]},
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
        )
    if name == "tiny-qwen2":
        return Qwen2Config(
            **common,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=128,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
            tie_word_embeddings=True,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
        )
    if name == "tiny-qwen3":
        return Qwen3Config(
            **common,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
            tie_word_embeddings=True,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
        )
    raise ValueError(name)


@torch.no_grad()
def init_weights(model, seed: int) -> None:
    """Deterministic, non-degenerate init.

    Linear weights N(0, 0.15) so attention scores have std ~1.5 (attention far from uniform,
    so RoPE/masking errors show up); embeddings/lm_head N(0, 0.08) so the layers, not the
    residual embedding, dominate (otherwise tied models just repeat the last token); q/k/v
    biases N(0, 0.5) so they matter; RMSNorm weights (incl. q_norm/k_norm) 1 + N(0, 0.1);
    the final norm 2.5 * (1 + N(0, 0.1)) to sharpen the logits (larger greedy margins)."""
    g = torch.Generator().manual_seed(seed)
    seen = set()
    for pname, p in model.named_parameters():  # tied params are listed once
        if id(p) in seen:
            continue
        seen.add(id(p))
        if pname == "model.norm.weight":
            p.copy_(2.5 * (1.0 + 0.1 * torch.randn(p.shape, generator=g)))
        elif "norm" in pname:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif pname.endswith(".bias"):
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in pname or "lm_head" in pname:
            p.copy_(0.08 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(0.15 * torch.randn(p.shape, generator=g))


def patch_config_json(path: Path, storage, legacy_rope_scaling, arch: str) -> None:
    """transformers 5 writes only `rope_parameters`; also write the classic keys
    (`rope_theta`, `rope_scaling`, `torch_dtype`) most published checkpoints carry."""
    cfg = json.loads(path.read_text())
    rp = cfg.get("rope_parameters") or {}
    cfg["architectures"] = [arch]
    cfg["rope_theta"] = rp.get("rope_theta")
    cfg["rope_scaling"] = dict(legacy_rope_scaling) if legacy_rope_scaling else None
    cfg["torch_dtype"] = DTYPE_NAMES[storage]
    cfg["dtype"] = DTYPE_NAMES[storage]
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def greedy(model, ids: list, n: int):
    """Manual argmax loop with the KV cache (no EOS stop). Cross-checked against a full
    recompute without the cache. Returns (tokens, margins) where margin = top1 - top2 logprob."""
    x = torch.tensor([ids])
    out = model(input_ids=x, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1]
    toks, margins = [], []
    for step in range(n):
        lp = torch.log_softmax(logits.double(), -1)
        top2 = torch.topk(lp, 2)
        t = int(top2.indices[0])
        toks.append(t)
        margins.append(r6(top2.values[0] - top2.values[1]))
        if step + 1 == n:
            break
        out = model(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
    # cross-check with a full, cache-free recompute
    full = model(input_ids=torch.tensor([ids + toks[:-1]]), use_cache=False).logits[0]
    check = full[len(ids) - 1 :].argmax(-1).tolist()
    if check != toks:
        log(f"  WARNING: cached greedy {toks} != uncached {check}")
    return toks, margins


def make_prompts(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    specs = [("len1", 1, None), ("len7", 7, None), ("len40", 40, None), ("long", 300, 8)]
    prompts = []
    for name, n, last in specs:
        ids = torch.randint(0, TINY_VOCAB, (n,), generator=g).tolist()
        positions = list(range(n)) if last is None else list(range(n - last, n))
        prompts.append((name, ids, positions))
    return prompts


@torch.no_grad()
def reference_prompts(model, seed: int):
    """For each probe prompt: the full log_softmax rows at its probe positions and 16
    greedy tokens with their margins. Returns (prompts, mean row spreads, min margin)."""
    prompts = []
    spreads, min_margin = [], float("inf")
    for pname, ids, positions in make_prompts(seed):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        lp = torch.log_softmax(logits.double(), -1)
        rows = lp[positions]
        spreads.append(float((rows.max(-1).values - rows.min(-1).values).mean()))
        g_ids, g_margins = greedy(model, ids, 16)
        min_margin = min(min_margin, min(g_margins))
        prompts.append(
            {
                "name": pname,
                "ids": ids,
                "positions": positions,
                "logprobs": rows6(rows),
                "greedy": g_ids,
                "greedy_margin": g_margins,
            }
        )
    return prompts, spreads, min_margin


def fresh_fixture_model(name: str, seed: int, make_config_fn):
    """An empty fixtures/<name>/ and a float32 model of `make_config_fn()` with seeded random weights."""
    from transformers import AutoModelForCausalLM

    out_dir = FIXTURES / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    torch.manual_seed(seed)
    config = make_config_fn()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    init_weights(model, seed)
    return model, out_dir


def save_fixture(model, out_dir: Path, storage, tok_json: str, patch_config, original_format: bool = True) -> str:
    """Writes `model` in `storage` dtype with its generation config and the tiny tokenizer;
    `patch_config(config_path, arch)` then adjusts config.json. Returns the architecture.
    `original_format=False` keeps transformers 5's own weight layout (e.g. fused MoE experts)
    instead of converting back to the checkpoint layout it was loaded from."""
    from transformers import GenerationConfig

    model = model.to(storage)
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False
    )
    model.save_pretrained(out_dir, safe_serialization=True, save_original_format=original_format)
    arch = type(model).__name__
    patch_config(out_dir / "config.json", arch)
    (out_dir / "tokenizer.json").write_text(tok_json)
    dump_json(out_dir / "tokenizer_config.json", tiny_tokenizer_config(), indent=2)
    return arch


def reload_fixture(out_dir: Path, storage, check_weights: bool = True):
    """Reloads the written fixture (this also proves its config.json parses) to compute in
    float32 from the weights exactly as stored; with `check_weights`, every stored tensor
    must be in `storage` dtype and equal the reloaded weight of the same name (not for MoE
    checkpoints, whose per-expert tensors transformers fuses on load). Returns (model,
    tensor names, tensor list)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with safe_open(out_dir / "model.safetensors", "pt") as f:
        keys = list(f.keys())
        sd = model.state_dict()
        for k in keys if check_weights else []:
            t = f.get_tensor(k)
            assert t.dtype == storage, (k, t.dtype)
            assert torch.equal(sd[k], t.float()), f"reloaded weight {k} differs"
        tensor_list = {k: [DTYPE_NAMES[f.get_tensor(k).dtype], list(f.get_tensor(k).shape)] for k in keys}
    return model, keys, tensor_list


@torch.no_grad()
def build_tiny(name: str, tok_json: str) -> dict:
    spec = TINY_SPECS[name]
    model, out_dir = fresh_fixture_model(name, spec["seed"], lambda: make_config(name))
    storage = spec["storage"]
    arch = save_fixture(
        model,
        out_dir,
        storage,
        tok_json,
        lambda path, arch: patch_config_json(path, storage, spec["legacy_rope_scaling"], arch),
    )
    del model
    model, keys, tensor_list = reload_fixture(out_dir, storage)
    if spec["legacy_rope_scaling"]:
        rp = model.config.rope_parameters
        for k, v in spec["legacy_rope_scaling"].items():
            assert rp[k] == v, (k, rp)

    prompts, spreads, min_margin = reference_prompts(model, spec["seed"] + 7)
    ref = {
        "model": name,
        "architecture": arch,
        "weights_dtype": DTYPE_NAMES[spec["storage"]],
        "compute": "transformers CPU float32 (eager attention), log_softmax in float64, rounded to 6 decimals",
        "notes": "logprobs[i] is the full log_softmax row (vocab entries) at prompt position positions[i]; "
        "greedy = 16 argmax tokens continuing the prompt with the KV cache, no EOS stop; "
        "greedy_margin = top1 - top2 logprob at each greedy step.",
        "tensors": tensor_list,
        "prompts": prompts,
    }
    dump_json(out_dir / "reference.json", ref)
    for p in out_dir.iterdir():
        p.chmod(0o644)
    log(
        f"{name}: {arch}, mean logprob spread {np.mean(spreads):.3f}, "
        f"min greedy margin {min_margin:.4f}, distinct greedy tokens {[len(set(p['greedy'])) for p in prompts]}"
    )
    return ref


def build_tiny_all() -> None:
    tk = train_tiny_tokenizer()
    tok_json = tk.to_str(pretty=True)
    log(f"tiny tokenizer: vocab {tk.get_vocab_size()}, sha256 {hashlib.sha256(tok_json.encode()).hexdigest()[:16]}")
    for name in TINY_SPECS:
        build_tiny(name, tok_json)
    tiny_tokenizer_cases(FIXTURES / "tiny-llama")
