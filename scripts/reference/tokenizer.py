"""The tiny byte-level BPE tokenizer shared by the tiny fixtures, and its test cases."""

from __future__ import annotations

from pathlib import Path


from reference.common import CHATML_TEMPLATE, FIXTURES, SPECIAL_TOKENS, TINY_VOCAB, dump_json


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
