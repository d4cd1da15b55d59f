"""Paths, constants and JSON helpers shared by the reference builders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[2]


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


DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _dist_version(name: str):
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return None
