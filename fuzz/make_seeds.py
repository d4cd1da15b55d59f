#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) from the fixtures.

Deterministic (standard library only); re-running rewrites the same files. Seeds are kept
small (the committed corpora stay well under 1 MB): the fuzzers start from well-formed
inputs of every layout and mutate from there.
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures")
OUT = os.path.join(ROOT, "fuzz", "corpus")

# (name, ggml type id, block elems, block bytes), in the order of dcpserve_model::fuzzing::DTYPES.
TYPES = [
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("BF16", 30, 1, 2), ("Q8_0", 8, 32, 34),
    ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22), ("Q5_1", 7, 32, 24),
    ("Q2_K", 10, 256, 84), ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144),
    ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210), ("Q8_K", 15, 256, 292),
    ("IQ4_NL", 20, 32, 18), ("IQ4_XS", 23, 256, 136),
]


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def one_block(name, elems, nbytes):
    """The first block of the fixture's blocks of this type (deterministic filler for floats)."""
    path = os.path.join(FIX, "gguf_quants", name + ".blocks")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read(nbytes)
    return bytes((i * 37 + 11) % 251 for i in range(nbytes))


# ---- GGUF ---------------------------------------------------------------------------------

def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(v):
    """(type id, encoded value) of a Python value."""
    if isinstance(v, bool):
        return 7, struct.pack("<B", v)
    if isinstance(v, int):
        return 4, struct.pack("<I", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, str):
        return 8, gguf_str(v)
    if isinstance(v, list):
        elem = gguf_value(v[0])[0] if v else 4
        body = b"".join(gguf_value(x)[1] for x in v)
        return 9, struct.pack("<IQ", elem, len(v)) + body
    raise TypeError(v)


def gguf(metadata, tensors, alignment=32):
    """A GGUF v3 image: metadata dict, tensors [(name, shape outermost first, type id, data)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        t, b = gguf_value(v)
        out += gguf_str(k) + struct.pack("<I", t) + b
    offset = 0
    datas = []
    for name, shape, ty, data in tensors:
        dims = list(reversed(shape))
        out += gguf_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, offset)
        datas.append((offset, data))
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    base = len(out)
    for off, data in datas:
        out += b"\0" * (base + off - len(out)) + data
    return out


def tiny_vocab():
    tok = json.load(open(os.path.join(FIX, "tiny-llama", "tokenizer.json")))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return [t for t, _ in vocab], merges


def gguf_seeds():
    tokens, merges = tiny_vocab()
    chatml = json.load(open(os.path.join(FIX, "tiny-llama", "tokenizer_config.json")))["chat_template"]
    llama = {
        "general.architecture": "llama",
        "llama.block_count": 1,
        "llama.context_length": 64,
        "llama.embedding_length": 32,
        "llama.feed_forward_length": 32,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": len(tokens),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges[:64],
        "tokenizer.ggml.token_type": [1] * len(tokens),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": chatml,
    }
    write("gguf", "llama_metadata.gguf", gguf(llama, [("output_norm.weight", [32], 0, b"\0\0\x80\x3f" * 32)]))
    ds = dict(llama)
    for k in [k for k in ds if k.startswith("llama.")]:
        del ds[k]
    ds.update({
        "general.architecture": "deepseek2",
        "deepseek2.block_count": 2, "deepseek2.context_length": 64,
        "deepseek2.embedding_length": 32, "deepseek2.feed_forward_length": 48,
        "deepseek2.attention.head_count": 4, "deepseek2.attention.head_count_kv": 4,
        "deepseek2.attention.q_lora_rank": 16, "deepseek2.attention.kv_lora_rank": 16,
        "deepseek2.attention.key_length": 24, "deepseek2.attention.value_length": 8,
        "deepseek2.rope.dimension_count": 8, "deepseek2.expert_count": 4,
        "deepseek2.expert_used_count": 2, "deepseek2.expert_shared_count": 1,
        "deepseek2.expert_feed_forward_length": 16, "deepseek2.leading_dense_block_count": 1,
        "deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 1,
        "deepseek2.expert_weights_scale": 2.5, "deepseek2.expert_weights_norm": True,
        "deepseek2.expert_gating_func": 2,
        "deepseek2.tokenizer.ggml.merges": merges[:8],
    })
    ds["tokenizer.ggml.merges"] = merges[:8]
    ds["tokenizer.ggml.tokens"] = tokens[:64]
    ds["tokenizer.ggml.token_type"] = [1] * 64
    experts = [
        ("blk.1.ffn_gate_exps.weight", [4, 16, 32], 0, b"\0" * (4 * 16 * 32 * 4)),
        ("blk.1.attn_k_b.weight", [4, 16, 16], 1, b"\0" * (4 * 16 * 16 * 2)),
        ("blk.1.attn_v_b.weight", [4, 8, 16], 1, b"\0" * (4 * 8 * 16 * 2)),
    ]
    write("gguf", "deepseek2_metadata.gguf", gguf(ds, experts))
    for name, ty, elems, nbytes in TYPES:
        block = one_block(name, elems, nbytes)
        meta = {"general.architecture": "llama", "general.alignment": 32}
        write("gguf", "tensor_%s.gguf" % name, gguf(meta, [("blk.0.attn_q.weight", [1, elems], ty, block)]))


def quant_seeds():
    for i, (name, _ty, elems, nbytes) in enumerate(TYPES):
        blocks = one_block(name, elems, nbytes)
        write("quant_blocks", name, bytes([i]) + struct.pack("<QQ", 1, elems) + blocks)
        write("quant_blocks", name + "_2rows", bytes([i]) + struct.pack("<QQ", 2, elems) + blocks + blocks)


# ---- safetensors --------------------------------------------------------------------------

def safetensors(tensors, metadata=None):
    """A safetensors image of [(name, dtype, shape, data)]."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def safetensors_seeds():
    dense = safetensors([
        ("model.embed_tokens.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
        ("model.norm.weight", "BF16", [3], b"\x80\x3f" * 3),
        ("lm_head.weight", "F16", [1, 2], b"\x00\x3c" * 2),
        ("model.layers.0.self_attn.q_proj.bias", "I64", [1], b"\0" * 8),
    ], {"format": "pt"})
    write("safetensors", "dense", b"\0" + dense)
    p = "model.layers.1.mlp.experts"
    fused = safetensors([
        (p + ".gate_up_proj", "BF16", [2, 4, 2], b"\x80\x3f" * 16),
        (p + ".down_proj", "F32", [2, 2, 2], struct.pack("<8f", *range(8))),
    ])
    write("safetensors", "fused_experts", b"\0" + fused)
    index = {"metadata": {"total_size": 16}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00001.safetensors",
        "model.norm.weight": "model-00001-of-00001.safetensors"}}
    write("safetensors", "index", b"\x01" + json.dumps(index).encode() + b"\0" + dense)


# ---- config.json and chat templates -------------------------------------------------------

def config_seeds():
    for d in sorted(os.listdir(FIX)):
        path = os.path.join(FIX, d, "config.json")
        if os.path.exists(path):
            with open(path, "rb") as f:
                write("config_json", d, f.read())


def chat_template_seeds():
    chatml = json.load(open(os.path.join(FIX, "tiny-llama", "tokenizer_config.json")))["chat_template"]
    convo = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "add_generation_prompt": True,
    }
    ctx = json.dumps(convo)
    write("chat_template", "chatml", chatml + "\0" + ctx)
    tool_template = (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}"
        "{{- tool | tojson }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- set ns = namespace(last=-1) %}"
        "{%- for message in messages[::-1] %}{%- if message.role == 'user' and ns.last == -1 %}"
        "{%- set ns.last = messages|length - 1 - loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' and message.tool_calls %}"
        "{%- for tc in message.tool_calls %}<tool_call>{{ tc.function | tojson(indent=2) }}</tool_call>"
        "{%- endfor %}{%- elif message.content is string %}"
        "{{ '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}"
        "{%- else %}{{ raise_exception('bad content') }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\\n<think>\\n{%- endif %}"
        "{% generation %}{{ strftime_now('%d %b %Y') }}{% endgeneration %}"
    )
    write("chat_template", "tools_namespace", tool_template + "\0" + ctx)
    write("chat_template", "macros", "{% macro m(x) %}[{{ x|upper }}]{% endmacro %}"
          "{% for i in range(3) %}{{ m(i) }}{% if loop.last %}{% break %}{% endif %}{% endfor %}"
          "{{ messages|map(attribute='content')|join(', ') }}{{ bos_token ~ eos_token }}"
          "\0" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    write("chat_template", "plain_text_context", "{{ messages[1].content|replace('a', 'b')|center(20) }}\0hello there")


# ---- requests and model outputs -----------------------------------------------------------

def request_seeds():
    chat, comp, tok, detok = 0, 4, 8, 12
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    seeds = {
        "chat_plain": (chat, {"model": "fuzz", "messages": msgs, "max_tokens": 8}),
        "chat_stream_logprobs": (chat | 1, {"messages": msgs, "stream": True, "logprobs": True,
            "top_logprobs": 2, "stream_options": {"include_usage": True}, "n": 2, "stop": ["re"]}),
        "chat_tools_auto": (chat | 1, {"messages": msgs + [{"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "c1",
            "content": [{"type": "text", "text": "21C"}]}], "tools": tools, "tool_choice": "auto"}),
        "chat_tools_required": (chat | 2, {"messages": msgs, "tools": tools, "tool_choice": "required"}),
        "chat_tools_named": (chat | 3, {"messages": msgs, "tools": tools, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        "chat_json_schema": (chat, {"messages": msgs, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0}, "b": {"type": "array", "items": {"enum": ["x", "y"]}}}}}}}),
        "chat_json_object": (chat, {"messages": msgs, "response_format": {"type": "json_object"}}),
        "chat_guided_regex": (chat, {"messages": msgs, "guided_regex": "[a-z]{1,8}(-[0-9]+)?"}),
        "chat_guided_choice": (chat, {"messages": msgs, "guided_choice": ["yes", "no"]}),
        "chat_guided_grammar": (chat, {"messages": msgs, "guided_grammar": "start: \"a\"+"}),
        "chat_structured_outputs": (chat, {"messages": msgs, "structured_outputs": {"json": {"type": "string"}}}),
        "completion_text": (comp, {"prompt": "Once upon", "max_tokens": 5, "temperature": 0.7,
            "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3, "echo": True, "logprobs": 3}),
        "completion_batch": (comp, {"prompt": ["a", "b c"], "n": 2, "stream": True, "stop": "c",
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1}),
        "completion_tokens": (comp, {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3,
            "stop_token_ids": [2], "min_tokens": 1, "ignore_eos": True}),
        "completion_guided_json": (comp, {"prompt": "x", "guided_json": {"type": "object"}}),
        "tokenize_chat": (tok, {"messages": msgs, "add_generation_prompt": True}),
        "tokenize_prompt": (tok, {"prompt": "hello world", "add_special_tokens": False}),
        "detokenize": (detok, {"tokens": [5, 6, 7, 300]}),
    }
    for name, (sel, body) in seeds.items():
        write("request", name, bytes([sel]) + json.dumps(body).encode())


def tool_output_seeds():
    outs = {
        # sel: tool parser (bits 0-1: hermes, llama3_json, deepseek_v3, none), reasoning
        # (bits 2-3: deepseek_r1, qwen3, none), prompt opened <think> (bit 4).
        "hermes_qwen3": (0 | 1 << 2, "<think>plan</think>Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5e3, null, true]}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        "llama3": (1 | 2 << 2, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris \\\"x\\\" \\u00e9\"}}; {\"name\": \"g\", \"parameters\": {}}"),
        "deepseek_r1": (2 | 0 << 2 | 16, "reasoning here</think>ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        "plain_thinking": (3 | 1 << 2 | 16, "still thinking <thi"),
    }
    for name, (sel, text) in outs.items():
        write("tool_output", name, bytes([sel, 3]) + text.encode())


if __name__ == "__main__":
    gguf_seeds()
    quant_seeds()
    safetensors_seeds()
    config_seeds()
    chat_template_seeds()
    request_seeds()
    tool_output_seeds()
