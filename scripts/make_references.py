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
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from reference.gguf_deepseek import build_deepseek_ggufs

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_VOCAB = 384
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Small embedded corpus (English + code) for training the tiny byte-level BPE.
TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away.",
    "A language model assigns a probability to every token in its vocabulary, given the tokens before it.",
    "Serving engines batch many requests together, reuse the key/value cache, and stream tokens back.",
    "What is the capital of France? The capital of France is Paris. Paris is on the Seine.",
    "In the beginning there was the byte, and the byte was merged into pairs, and the pairs into words.",
    "Hello, world! How are you today? I am fine, thank you. Let us write some code together.",
    "The attention layer computes queries, keys and values; the keys and values are stored in the cache.",
    "Rotary position embeddings rotate pairs of dimensions by an angle that grows with the position.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "fn main() {\n    let mut total = 0;\n    for i in 0..10 {\n        total += i * i;\n    }\n    println!(\"{}\", total);\n}\n",
    "pub struct Config {\n    pub hidden_size: usize,\n    pub num_layers: usize,\n}\n\nimpl Config {\n    pub fn new() -> Self {\n        Self { hidden_size: 64, num_layers: 2 }\n    }\n}\n",
    "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n    s = sum(e)\n    return [v / s for v in e]\n\n\nclass Model:\n    def __init__(self, config):\n        self.config = config\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\nreturn sum;\n",
    "import torch\nimport numpy as np\n\nx = torch.randn(4, 8)\ny = x @ x.T\nprint(y.shape)\n",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\nWaves fold into foam<|im_end|>\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1e-5 0xff",
    "Punctuation: ... !!! ??? --- (a, b) [c; d] {e: f} <g/> 'h' \"i\" `j` ~k @l #m $n %o ^p &q *r",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pretty(obj, level: int = 0) -> str:
    """Indented JSON, but lists of scalars stay on one line (readable and diff-friendly)."""
    pad, pad1 = " " * level, " " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad1}{json.dumps(k, ensure_ascii=False)}: {_pretty(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return "[\n" + ",\n".join(pad1 + _pretty(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def dump_json(path: Path, obj, indent=None) -> None:
    """indent=None: minified (large numeric files); otherwise _pretty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if indent is None:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            f.write(_pretty(obj))
        f.write("\n")
    path.chmod(0o644)


def r6(x: float) -> float:
    v = round(float(x), 6)
    return 0.0 if v == 0 else v  # no "-0.0"


def rows6(t: torch.Tensor) -> list:
    return [[r6(v) for v in row] for row in t.tolist()]


# --------------------------------------------------------------------------------------
# Tiny tokenizer
# --------------------------------------------------------------------------------------


def train_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(TRAIN_TEXT * 4, trainer=trainer)
    assert tk.get_vocab_size() == TINY_VOCAB, tk.get_vocab_size()
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tk.token_to_id(s) == i, (s, tk.token_to_id(s))
    return tk


def tiny_tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "added_tokens_decoder": {
            str(i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, s in enumerate(SPECIAL_TOKENS)
        },
        "chat_template": CHATML_TEMPLATE,
    }


# --------------------------------------------------------------------------------------
# Tiny models
# --------------------------------------------------------------------------------------

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

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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
def build_tiny(name: str, tok_json: str) -> dict:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = TINY_SPECS[name]
    out_dir = FIXTURES / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    torch.manual_seed(spec["seed"])
    config = make_config(name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    init_weights(model, spec["seed"])
    model = model.to(spec["storage"])
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    arch = type(model).__name__
    del model
    patch_config_json(out_dir / "config.json", spec["storage"], spec["legacy_rope_scaling"], arch)
    (out_dir / "tokenizer.json").write_text(tok_json)
    dump_json(out_dir / "tokenizer_config.json", tiny_tokenizer_config(), indent=2)

    # Reload from disk (this also proves the written config.json parses) and compute in float32
    # from the weights exactly as stored.
    model = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with safe_open(out_dir / "model.safetensors", "pt") as f:
        keys = list(f.keys())
        sd = model.state_dict()
        for k in keys:
            t = f.get_tensor(k)
            assert t.dtype == spec["storage"], (k, t.dtype)
            assert torch.equal(sd[k], t.float()), f"reloaded weight {k} differs"
        tensor_list = {k: [DTYPE_NAMES[f.get_tensor(k).dtype], list(f.get_tensor(k).shape)] for k in keys}
    if spec["legacy_rope_scaling"]:
        rp = model.config.rope_parameters
        for k, v in spec["legacy_rope_scaling"].items():
            assert rp[k] == v, (k, rp)

    prompts = []
    spreads, min_margin = [], float("inf")
    for pname, ids, positions in make_prompts(spec["seed"] + 7):
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


def tiny_tokenizer_cases(tok_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    texts = [
        "",
        "Hello, world!",
        "The capital of France is Paris.",
        "fn main() {\n    println!(\"hi\");\n}\n",
        "  two leading spaces and trailing  ",
        "tabs\there\tand\n\nnewlines\r\n",
        "digits 1234567890 and 3.14",
        "café naïve 日本語 🙂",
        "<|im_start|>user\nhi<|im_end|>\n",
    ]
    cases = [{"text": t, "ids": tok(t, add_special_tokens=True).input_ids} for t in texts]
    for c in cases:
        assert tok.decode(c["ids"]) == c["text"], c
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there!"},
    ]
    rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    dump_json(
        FIXTURES / "tiny_tokenizer_cases.json",
        {
            "tokenizer": "fixtures/tiny-llama/tokenizer.json (identical in tiny-qwen2, tiny-qwen3)",
            "cases": cases,
            "chat": {
                "messages": msgs,
                "add_generation_prompt": True,
                "text": rendered,
                "ids": tok(rendered, add_special_tokens=True).input_ids,
            },
        },
        indent=1,
    )


def build_tiny_all() -> None:
    tk = train_tiny_tokenizer()
    tok_json = tk.to_str(pretty=True)
    log(f"tiny tokenizer: vocab {tk.get_vocab_size()}, sha256 {hashlib.sha256(tok_json.encode()).hexdigest()[:16]}")
    for name in TINY_SPECS:
        build_tiny(name, tok_json)
    tiny_tokenizer_cases(FIXTURES / "tiny-llama")


# --------------------------------------------------------------------------------------
# Tiny DeepSeek-V3 (MLA + MoE) models: `--only deepseek`
# --------------------------------------------------------------------------------------

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
    prompts = []
    min_margin = float("inf")
    for pname, ids, positions in make_prompts(spec["seed"] + 7):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        lp = torch.log_softmax(logits.double(), -1)
        g_ids, g_margins = greedy(model, ids, 16)
        min_margin = min(min_margin, min(g_margins))
        prompts.append(
            {
                "name": pname,
                "ids": ids,
                "positions": positions,
                "logprobs": rows6(lp[positions]),
                "greedy": g_ids,
                "greedy_margin": g_margins,
            }
        )
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


# --------------------------------------------------------------------------------------
# SmolLM2 (default model, from its GGUF)
# --------------------------------------------------------------------------------------

SMOL_TOKENIZER_TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll agree: it's what we've done, isn't it?",
    "café, naïve, Ångström, façade, jalapeño, Straße",
    "日本語のテキストと中文字符",
    "한국어 문장입니다.",
    "Emoji: 🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵",
    "fn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", x);\n}\n",
    "def f(x):\n\tif x > 0:\n\t\treturn x * 2\n\treturn -x\n",
    "a  b   c    d     e      f       g        h         i          j",
    "line one\n\nline two\n\n\n\nline three",
    "windows\r\nline\r\nendings\r\n",
    "trailing spaces   ",
    "   leading spaces",
    "Numbers: 1234567890 3.14159 -42 1,000,000 2024-11-30",
    "Unicode numerals: ½ ٣ Ⅻ ²",
    "Punctuation!!! ...??? ---*** (([[{{}}]])) <<>> ;;;:::",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "HTTP/1.1 200 OK\nContent-Type: application/json\n\n{\"key\": [1, 2, 3], \"ok\": true}",
    "URL: https://example.com/path?query=value&x=1#frag",
    "ALL CAPS SHOUTING and MiXeD CaSe",
    "\n",
    " ",
    "Ünïcödé ẞ İstanbul ǅ",
]

SMOL_PARAGRAPH = (
    "The history of computing is a story of abstraction. Early machines were programmed by "
    "rewiring panels, then by punching cards, and later by writing assembly language. Each new "
    "layer let people think less about the machine and more about the problem they wanted to solve. "
    "Today, few programmers ever see the instructions their code becomes."
)
SMOL_CODE = (
    "def fibonacci(n):\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
)


def smollm2_tokenizer(models_dir: Path):
    """The tokenizer transformers builds from the GGUF, with the pre-tokenizer corrected.

    transformers' GGUF converter emits a plain ByteLevel pre-tokenizer, but SmolLM2's original
    tokenizer.json (and llama.cpp's `smollm` pre-tokenizer, `tokenizer.ggml.pre = smollm`)
    first isolates every \\p{N} character (tokenizers' Digits(individual_digits=True)), then
    applies the GPT-2 ByteLevel regex. The two differ only for numerals glued to a preceding
    space/byte, which the vocabulary (no multi-digit tokens) otherwise hides."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(models_dir, gguf_file=GGUF_NAME)
    fixed = AutoTokenizer.from_pretrained(models_dir, gguf_file=GGUF_NAME)
    fixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return fixed, raw


def gguf_tensor_types(path: Path):
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    tensors = [
        {"name": t.name, "type": t.tensor_type.name, "shape": [int(s) for s in t.shape]}
        for t in r.tensors
    ]
    counts = {}
    for t in tensors:
        counts[t["type"]] = counts.get(t["type"], 0) + 1
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k.split(".")[-1] in ("tokens", "merges", "token_type", "scores"):
            kv[k] = f"<array of {len(f.data)}>"
            continue
        try:
            v = f.contents()
        except Exception:  # pragma: no cover - exotic field types
            v = None
        if isinstance(v, (int, float, str, bool)) or v is None:
            kv[k] = v
        elif isinstance(v, list) and len(v) <= 16:
            kv[k] = v
        else:
            kv[k] = str(v)[:200]
    return tensors, counts, kv


@torch.no_grad()
def build_smollm2(models_dir: Path) -> None:
    import gguf
    import tokenizers
    import transformers
    from transformers import AutoModelForCausalLM

    gguf_path = models_dir / GGUF_NAME
    if not gguf_path.exists():
        sys.exit(f"missing {gguf_path}; run scripts/fetch-default-model.sh")
    out = FIXTURES / "smollm2"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    tok, raw_tok = smollm2_tokenizer(models_dir)

    # tokenizer cases
    cases, n_diff = [], 0
    for text in SMOL_TOKENIZER_TEXTS:
        ids = tok(text, add_special_tokens=True).input_ids
        case = {"text": text, "ids": ids}
        raw_ids = raw_tok(text, add_special_tokens=True).input_ids
        if raw_ids != ids:
            n_diff += 1
            case["ids_transformers_gguf_pretokenizer"] = raw_ids
        assert tok.decode(ids) == text, (text, tok.decode(ids))
        cases.append(case)
    dump_json(out / "tokenizer_cases.json", cases, indent=1)
    log(f"smollm2: {len(cases)} tokenizer cases ({n_diff} differ from transformers' GGUF pre-tokenizer)")

    model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=GGUF_NAME, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_text, add_special_tokens=True).input_ids

    # logits
    prompts = [("chat", chat_text), ("paragraph", SMOL_PARAGRAPH), ("code", SMOL_CODE)]
    entries = []
    for name, text in prompts:
        ids = tok(text, add_special_tokens=True).input_ids
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        lp = torch.log_softmax(logits.double(), -1)
        top = torch.topk(lp, 20, dim=-1)
        nxt = [r6(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)] + [None]
        entries.append(
            {
                "name": name,
                "text": text,
                "ids": ids,
                "top_ids": top.indices.tolist(),
                "top_logprobs": rows6(top.values),
                "next_logprob": nxt,
            }
        )
        log(f"smollm2 logits: {name} {len(ids)} tokens, mean next-token logprob {np.mean([v for v in nxt if v is not None]):.3f}")
    dump_json(
        out / "logits.json",
        {
            "model": f"models/{GGUF_NAME} dequantized by transformers to float32",
            "notes": "per prompt position p: top_ids[p]/top_logprobs[p] = 20 best tokens and their "
            "log_softmax values (descending); next_logprob[p] = logprob of ids[p+1] (null at the end).",
            "prompts": entries,
        },
    )

    # chat generation
    gen = model.generate(
        torch.tensor([chat_ids]), max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id
    )
    new_ids = gen[0, len(chat_ids) :].tolist()
    text = tok.decode(new_ids, skip_special_tokens=True)
    text_raw = tok.decode(new_ids, skip_special_tokens=False)
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    finish = "stop" if new_ids and new_ids[-1] in eos else "length"
    dump_json(
        out / "chat.json",
        {
            "messages": messages,
            "add_generation_prompt": True,
            "prompt_text": chat_text,
            "prompt_ids": chat_ids,
            "max_new_tokens": 20,
            "do_sample": False,
            "eos_token_ids": eos,
            "generated_ids": new_ids,
            "generated_text": text,
            "generated_text_with_special": text_raw,
            "finish_reason": finish,
        },
        indent=1,
    )
    log(f"smollm2 chat: {text_raw!r} ({finish})")
    if not text.startswith("The capital of France is Paris."):
        log("  WARNING: chat generation does not start with 'The capital of France is Paris.'")

    tensors, counts, kv = gguf_tensor_types(gguf_path)
    dump_json(
        out / "meta.json",
        {
            "gguf_file": GGUF_NAME,
            "gguf_size_bytes": gguf_path.stat().st_size,
            "versions": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
                "numpy": np.__version__,
            },
            "hf_config": json.loads(model.config.to_json_string()),
            "tokenizer_note": "ids use the pre-tokenizer Sequence[Digits(individual_digits), ByteLevel] "
            "(SmolLM2's original / llama.cpp 'smollm'); transformers' GGUF converter builds a plain "
            "ByteLevel one. Cases where they differ carry 'ids_transformers_gguf_pretokenizer'.",
            "tensor_type_counts": counts,
            "gguf_metadata": kv,
            "tensors": tensors,
        },
        indent=1,
    )
    log(f"smollm2 GGUF tensor types: {counts}")


def _dist_version(name: str):
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return None


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
