#!/usr/bin/env python3
"""Build fixtures/tiny-deepseek-mtp/: a tiny DeepSeek-V3 model with one multi-token-prediction
(MTP, "nextn") layer, and reference MTP logprobs computed in torch.

    /root/.cache/dcpserve-ref/bin/python scripts/make_mtp_reference.py

Same pinned venv as make_references.py (scripts/requirements-ref.txt), whose helpers it reuses
(tiny tokenizer, DeepSeek config, init). transformers does not run MTP layers (it ignores the
`model.layers.{num_hidden_layers}.*` tensors), so the MTP forward is written here from the
published DeepSeek-V3 architecture, as vLLM's `deepseek_mtp.py` and SGLang run it:

  layer N = num_hidden_layers holds enorm, hnorm, eh_proj, shared_head.{norm,head}, an optional
  embed_tokens (absent here: the main model's is shared) and one ordinary decoder layer
  (input_layernorm, MLA self_attn, post_attention_layernorm, MoE mlp since N >= first_k_dense_replace).
  For target position i with final-normed main hidden state h_i and the next token t_{i+1}:
      e_i = enorm(embed(t_{i+1}))             (embedding zeroed at position 0, as vLLM/SGLang do)
      x_i = eh_proj(concat(e_i, hnorm(h_i)))
      y   = DecoderLayer_N(x) at positions 0..i, causal
      draft logits_i = shared_head.head(shared_head.norm(y_i))   -> predicts t_{i+2}
  Chaining (a second draft): the previous hidden of position i+1 is y_i (the MTP output before
  shared_head.norm) and its token is the first draft.

The decoder layer is transformers' own DeepseekV3DecoderLayer(config, layer_idx=N) loaded with the
layer-N weights; enorm / hnorm / eh_proj / shared_head are written by hand below.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference.common import FIXTURES, TINY_VOCAB, dump_json, log, r6, rows6  # noqa: E402
from reference.deepseek import make_deepseek_config  # noqa: E402
from reference.dense import init_weights  # noqa: E402
from reference.tokenizer import tiny_tokenizer_config  # noqa: E402

NAME = "tiny-deepseek-mtp"
SEED = 2003
PROMPT_LENS = [("len40", 40), ("long", 300)]
CHAIN_AT = 5  # the chained (second) draft is checked after each prompt's first CHAIN_AT positions


def causal_mask(n: int) -> torch.Tensor:
    m = torch.full((n, n), float("-inf")).triu(1)
    return m[None, None]


@torch.no_grad()
def init_mtp(layer_tensors: dict, mtp: dict, g: torch.Generator, lm_head: torch.Tensor) -> None:
    """Same init scheme as reference.dense.init_weights; shared_head.head is a copy of lm_head
    (DeepSeek-V3 ships the same matrix in both places)."""
    for name, t in layer_tensors.items():
        if "norm" in name:
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
        elif name.endswith("e_score_correction_bias"):
            t.copy_(0.3 * torch.randn(t.shape, generator=g))
        else:
            t.copy_(0.15 * torch.randn(t.shape, generator=g))
    h = lm_head.shape[1]
    mtp["enorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    mtp["hnorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    mtp["eh_proj.weight"] = 0.15 * torch.randn(h, 2 * h, generator=g)
    mtp["shared_head.norm.weight"] = 2.5 * (1.0 + 0.1 * torch.randn(h, generator=g))
    mtp["shared_head.head.weight"] = lm_head.clone()


def checkpoint_names(layer_tensors: dict, config) -> dict:
    """transformers 5 keeps routed experts fused (`experts.gate_up_proj` [E, 2I, h],
    `experts.down_proj` [E, h, I]); checkpoints (and save_pretrained) name them per expert."""
    out, inter = {}, config.moe_intermediate_size
    for k, v in layer_tensors.items():
        if k == "mlp.experts.gate_up_proj":
            for e in range(v.shape[0]):
                out[f"mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                out[f"mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
        elif k == "mlp.experts.down_proj":
            for e in range(v.shape[0]):
                out[f"mlp.experts.{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out


def fused_names(w: dict) -> dict:
    """The inverse of checkpoint_names, for loading the layer back into transformers."""
    out = {k: v for k, v in w.items() if ".experts." not in k}
    n = len([k for k in w if k.startswith("mlp.experts.") and k.endswith(".down_proj.weight")])
    if n:
        out["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([w[f"mlp.experts.{e}.gate_proj.weight"], w[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(n)]
        )
        out["mlp.experts.down_proj"] = torch.stack([w[f"mlp.experts.{e}.down_proj.weight"] for e in range(n)])
    return out


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


@torch.no_grad()
def mtp_forward(model, layer, w: dict, tokens, hidden, positions):
    """MTP over one sequence: tokens[j] is the token after position positions[j], hidden[j]
    the previous hidden state there. Returns (logits, y)."""
    eps = model.config.rms_norm_eps
    emb = model.model.embed_tokens(torch.tensor([tokens]))[0]
    pos = torch.tensor(positions)
    emb = torch.where((pos == 0)[:, None], torch.zeros_like(emb), emb)
    x = torch.cat([rms(emb, w["enorm.weight"], eps), rms(hidden, w["hnorm.weight"], eps)], -1)
    x = x @ w["eh_proj.weight"].T
    pe = model.model.rotary_emb(x[None], pos[None])
    y = layer(x[None], attention_mask=causal_mask(len(tokens)), position_ids=pos[None], position_embeddings=pe)[0]
    logits = rms(y, w["shared_head.norm.weight"], eps) @ w["shared_head.head.weight"].T
    return logits, y


@torch.no_grad()
def main() -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = FIXTURES / NAME
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tok_json = (FIXTURES / "tiny-llama" / "tokenizer.json").read_text()

    config = make_deepseek_config("tiny-deepseek")
    n_layers = config.num_hidden_layers
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    init_weights(model, SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    for bname, b in model.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=g))
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[2, 0], pad_token_id=0, do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    arch = type(model).__name__

    # The MTP layer: a decoder layer of index N plus the MTP-only tensors.
    layer = DeepseekV3DecoderLayer(config, layer_idx=n_layers).eval()
    layer_tensors = dict(layer.state_dict())
    mtp: dict = {}
    init_mtp(layer_tensors, mtp, torch.Generator().manual_seed(SEED + 2), model.lm_head.weight)
    layer.load_state_dict(layer_tensors)
    prefix = f"model.layers.{n_layers}."
    st = out_dir / "model.safetensors"
    with safe_open(st, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in list(checkpoint_names(layer_tensors, config).items()) + list(mtp.items()):
        tensors[prefix + k] = v.contiguous().clone()
    save_file(tensors, st, metadata={"format": "pt"})
    del model

    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    cfg["num_nextn_predict_layers"] = 1
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "tokenizer.json").write_text(tok_json)
    dump_json(out_dir / "tokenizer_config.json", tiny_tokenizer_config(), indent=2)

    # Reload as stored: transformers ignores the layer-N tensors; the MTP weights are read back too.
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with safe_open(st, "pt") as f:
        w = {k[len(prefix) :]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        tensor_list = {k: ["float32", list(f.get_tensor(k).shape)] for k in f.keys()}
    # Load the layer from the stored tensors (not the in-memory init), strictly.
    layer.load_state_dict({k: v for k, v in fused_names(w).items() if k in layer_tensors}, strict=True)

    gen = torch.Generator().manual_seed(SEED + 7)
    prompts = []
    for pname, n in PROMPT_LENS:
        ids = torch.randint(0, TINY_VOCAB, (n,), generator=gen).tolist()
        out = model.model(input_ids=torch.tensor([ids]), use_cache=False)
        hidden = out.last_hidden_state[0]  # after the final norm, as vLLM / SGLang feed it
        main_lp = torch.log_softmax(model.lm_head(hidden).double(), -1)
        positions = list(range(n - 1))
        logits, y = mtp_forward(model, layer, w, ids[1:], hidden[: n - 1], positions)
        lp = torch.log_softmax(logits.double(), -1)
        rows = positions if n <= 64 else positions[-8:]
        # Chained draft: after the first CHAIN_AT positions (tokens ids[1..=CHAIN_AT]), the first
        # draft d1 at position CHAIN_AT-1 is argmax of its MTP logits; the second draft runs at
        # position CHAIN_AT with previous hidden y[CHAIN_AT-1] and token d1.
        c = CHAIN_AT
        d1 = int(lp[c - 1].argmax())
        hid2 = torch.cat([hidden[:c], y[c - 1 : c]], 0)
        logits2, _ = mtp_forward(model, layer, w, ids[1 : c + 1] + [d1], hid2, list(range(c + 1)))
        lp2 = torch.log_softmax(logits2[-1].double(), -1)
        prompts.append(
            {
                "name": pname,
                "ids": ids,
                "main_positions": rows,
                "main_logprobs": rows6(main_lp[rows]),
                "mtp_positions": rows,
                "mtp_logprobs": rows6(lp[rows]),
                "chain": {"after": c, "first_draft": d1, "logprobs": [r6(v) for v in lp2.tolist()]},
            }
        )
    dump_json(
        out_dir / "reference.json",
        {
            "model": NAME,
            "architecture": arch,
            "weights_dtype": "float32",
            "compute": "transformers CPU float32 (eager) for the main model and the MTP decoder layer; "
            "MTP head written in torch (scripts/make_mtp_reference.py); log_softmax in float64, 6 decimals",
            "notes": "mtp_logprobs[j] is the MTP draft distribution at position mtp_positions[j] "
            "(input: final-normed main hidden state there and the prompt token after it; predicts the "
            "token two ahead). chain: the second, chained draft at position `after` (previous hidden = "
            "MTP output at after-1, token = first_draft).",
            "tensors": tensor_list,
            "prompts": prompts,
        },
    )
    for p in out_dir.iterdir():
        p.chmod(0o644)
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    log(f"{NAME}: {len(tensor_list)} tensors; fixtures total {total / 1e6:.2f} MB")
    assert total < 10_000_000, "fixtures exceed 10 MB"


if __name__ == "__main__":
    main()
