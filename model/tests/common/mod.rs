//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The default model (SmolLM2-135M-Instruct Q4_1 GGUF): `$DCPSERVE_DEFAULT_MODEL`, else
/// `models/` at the workspace root. Panics (fails the test) when it is missing: these tests
/// must not pass silently without it.
pub fn default_model() -> PathBuf {
    let path = std::env::var_os("DCPSERVE_DEFAULT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "default model not found at {}: run scripts/fetch-default-model.sh (or set DCPSERVE_DEFAULT_MODEL)",
        path.display()
    );
    path
}

/// A fresh, empty scratch folder under the system temp dir, unique to this process and `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("dcpserve-model-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Minimal deterministic PRNG (xorshift64*) for garbling bytes reproducibly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

use dcpserve_model::gguf::{encode_gguf, GgufTensorSpec, GgufValue};

fn f32_bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            (((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
                .to_le_bytes()
        })
        .collect()
}

/// A complete tiny `llama` GGUF: 1 layer, hidden 32, 2 heads of 16, 1 KV head, a byte-level
/// vocabulary of the 256 byte symbols, 2 merges and 3 control tokens, a ChatML template.
pub fn tiny_llama_gguf() -> Vec<u8> {
    let s = |x: &str| GgufValue::String(x.to_string());
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3i32, 3, 3];
    // GPT-2 byte symbols, in byte order.
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap();
            next += 1;
            c
        };
        tokens.push(c.to_string());
        types.push(1);
    }
    tokens.push("Ġt".into());
    tokens.push("Ġth".into());
    types.extend([1, 1]);
    let vocab = tokens.len();
    let (h, q, kv, inter) = (32usize, 32usize, 16usize, 32usize);
    let meta: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), s("llama")),
        ("llama.block_count".into(), GgufValue::U32(1)),
        ("llama.context_length".into(), GgufValue::U32(256)),
        ("llama.embedding_length".into(), GgufValue::U32(h as u32)),
        ("llama.feed_forward_length".into(), GgufValue::U32(inter as u32)),
        ("llama.attention.head_count".into(), GgufValue::U32(2)),
        ("llama.attention.head_count_kv".into(), GgufValue::U32(1)),
        ("llama.rope.freq_base".into(), GgufValue::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon".into(), GgufValue::F32(1e-5)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        ("tokenizer.ggml.tokens".into(), GgufValue::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types.into_iter().map(GgufValue::I32).collect())),
        ("tokenizer.ggml.merges".into(), GgufValue::Array(vec![s("Ġ t"), s("Ġt h")])),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(true)),
        (
            "tokenizer.chat_template".into(),
            s("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
        ),
    ];
    let f32_t = |name: &str, shape: Vec<usize>, seed: u32| GgufTensorSpec {
        name: name.into(),
        ggml_type: 0,
        data: f32_bytes(shape.iter().product(), seed),
        shape,
    };
    // Q8_0 embedding: per block an f16 scale of 1/64 then 32 int8 values.
    let mut emb = Vec::new();
    for i in 0..vocab * h / 32 {
        emb.extend([0x00, 0x24]);
        emb.extend((0..32).map(|j| ((i * 7 + j * 3) % 255) as u8));
    }
    let tensors = vec![
        GgufTensorSpec {
            name: "token_embd.weight".into(),
            ggml_type: 8,
            shape: vec![vocab, h],
            data: emb,
        },
        f32_t("output_norm.weight", vec![h], 1),
        f32_t("blk.0.attn_norm.weight", vec![h], 2),
        f32_t("blk.0.ffn_norm.weight", vec![h], 3),
        f32_t("blk.0.attn_q.weight", vec![q, h], 4),
        f32_t("blk.0.attn_k.weight", vec![kv, h], 5),
        f32_t("blk.0.attn_v.weight", vec![kv, h], 6),
        f32_t("blk.0.attn_output.weight", vec![h, q], 7),
        f32_t("blk.0.ffn_gate.weight", vec![inter, h], 8),
        f32_t("blk.0.ffn_up.weight", vec![inter, h], 9),
        f32_t("blk.0.ffn_down.weight", vec![h, inter], 10),
    ];
    encode_gguf(&meta, &tensors)
}
