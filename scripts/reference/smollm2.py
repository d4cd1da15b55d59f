"""References for the default GGUF model (SmolLM2-135M-Instruct Q4_1)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from reference.common import FIXTURES, GGUF_NAME, _dist_version, dump_json, log, r6, rows6


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
