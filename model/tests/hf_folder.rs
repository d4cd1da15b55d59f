//! Hugging Face folders: config.json + safetensors (single and sharded) + tokenizer.json.

mod common;

use std::collections::HashMap;
use std::path::Path;

use dcpserve_model::{ChatMessage, DType, ModelError, ModelFiles};
use safetensors::{serialize_to_file, Dtype, View};
use serde_json::json;

struct T {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &T {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn t(dtype: Dtype, shape: &[usize]) -> T {
    let n: usize = shape.iter().product();
    let size = match dtype {
        Dtype::F32 | Dtype::I32 => 4,
        Dtype::I64 => 8,
        _ => 2,
    };
    T {
        dtype,
        shape: shape.to_vec(),
        data: (0..n * size).map(|i| (i % 7) as u8).collect(),
    }
}

/// Tensors of a 2-layer Qwen2-shaped model: hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocab 6.
fn tensors() -> Vec<(String, T)> {
    let mut v = vec![
        (
            "model.embed_tokens.weight".to_string(),
            t(Dtype::BF16, &[6, 8]),
        ),
        ("model.norm.weight".to_string(), t(Dtype::F32, &[8])),
        ("lm_head.weight".to_string(), t(Dtype::F16, &[6, 8])),
    ];
    for i in 0..2 {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        v.push((p("input_layernorm.weight"), t(Dtype::F32, &[8])));
        v.push((p("post_attention_layernorm.weight"), t(Dtype::F32, &[8])));
        v.push((p("self_attn.q_proj.weight"), t(Dtype::F16, &[8, 8])));
        v.push((p("self_attn.k_proj.weight"), t(Dtype::F16, &[4, 8])));
        v.push((p("self_attn.v_proj.weight"), t(Dtype::F16, &[4, 8])));
        v.push((p("self_attn.q_proj.bias"), t(Dtype::F16, &[8])));
        v.push((p("self_attn.k_proj.bias"), t(Dtype::F16, &[4])));
        v.push((p("self_attn.v_proj.bias"), t(Dtype::F16, &[4])));
        v.push((p("self_attn.o_proj.weight"), t(Dtype::F16, &[8, 8])));
        v.push((p("mlp.gate_proj.weight"), t(Dtype::F16, &[16, 8])));
        v.push((p("mlp.up_proj.weight"), t(Dtype::F16, &[16, 8])));
        v.push((p("mlp.down_proj.weight"), t(Dtype::F16, &[8, 16])));
    }
    v
}

fn write_common(dir: &Path) {
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 6,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "eos_token_id": 5
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": [4, 5], "bos_token_id": 3}).to_string(),
    )
    .unwrap();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 4, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 5, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"hello": 0, "world": 1, "!": 2, "[UNK]": 3, "<|im_end|>": 4, "<|endoftext|>": 5}, "unk_token": "[UNK]"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let tok_config = json!({
        "eos_token": {"content": "<|im_end|>", "special": true},
        "bos_token": null,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}
        ]
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
}

fn write_single(dir: &Path, tensors: &[(String, T)]) {
    let views: Vec<(&str, &T)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn single_file_folder() {
    let dir = common::temp_dir("hf-single");
    write_common(&dir);
    write_single(&dir, &tensors());
    let files = ModelFiles::open(&dir).unwrap();
    let c = &files.config;
    assert!(c.attention_bias && !c.qk_norm && !c.tie_word_embeddings && !c.rope_interleaved);
    assert_eq!(
        (c.head_dim, c.rope_theta, c.max_position_embeddings),
        (4, 1e6, 512)
    );
    assert_eq!(
        c.eos_token_ids,
        vec![4, 5],
        "generation_config.json overrides config.json"
    );
    assert_eq!(c.bos_token_id, Some(3));
    assert_eq!(files.tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(files.tokenizer.eos_token_ids(), &[4, 5]);
    assert_eq!(
        files
            .tokenizer
            .encode("hello world !<|im_end|>", true)
            .unwrap(),
        vec![0, 1, 2, 4]
    );
    let emb = files.tensors.get("model.embed_tokens.weight").unwrap();
    assert_eq!(
        (emb.dtype, emb.shape.clone(), emb.bytes().len()),
        (DType::BF16, vec![6, 8], 96)
    );
    assert_eq!(emb.bytes()[..3], [0, 1, 2]);
    let tmpl = files.chat_template.as_ref().unwrap();
    let out = tmpl
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(out, "user: hi<|im_end|>\nassistant:");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sharded_folder_and_jinja_file() {
    let dir = common::temp_dir("hf-sharded");
    write_common(&dir);
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ messages[0].content | upper }}",
    )
    .unwrap();
    let all = tensors();
    let (a, b) = all.split_at(10);
    let mut weight_map = HashMap::new();
    for (shard, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        let views: Vec<(&str, &T)> = part.iter().map(|(n, t)| (n.as_str(), t)).collect();
        serialize_to_file(views, None, &dir.join(shard)).unwrap();
        for (n, _) in part {
            weight_map.insert(n.clone(), shard.to_string());
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let files = ModelFiles::open(&dir).unwrap();
    assert_eq!(files.tensors.names().len(), all.len());
    assert!(files
        .tensors
        .contains("model.layers.1.mlp.down_proj.weight"));
    let out = files
        .chat_template
        .unwrap()
        .render(&[ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(out, "HI");

    // An index naming a tensor its shard lacks is an error naming both.
    weight_map.insert(
        "model.extra.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.extra.weight") && e.contains("model-00001-of-00002"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shape_and_type_errors_name_the_tensor() {
    let dir = common::temp_dir("hf-bad");
    write_common(&dir);
    let mut bad = tensors();
    bad[5].1 = t(Dtype::F16, &[8, 4]); // model.layers.0.self_attn.q_proj.weight
    write_single(&dir, &bad);
    let e = ModelFiles::open(&dir).unwrap_err();
    assert!(
        matches!(&e, ModelError::ShapeMismatch { tensor, expected, found, .. }
            if tensor == "model.layers.0.self_attn.q_proj.weight" && expected == &vec![8, 8] && found == &vec![8, 4]),
        "{e}"
    );

    let mut bad = tensors();
    bad[1].1 = t(Dtype::I64, &[8]); // model.norm.weight
    write_single(&dir, &bad);
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.norm.weight") && e.contains("I64") && e.contains("model.safetensors"),
        "{e}"
    );

    let mut missing = tensors();
    missing.retain(|(n, _)| n != "lm_head.weight");
    write_single(&dir, &missing);
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("lm_head.weight") && e.contains("not found"),
        "{e}"
    );

    // Truncated safetensors.
    write_single(&dir, &tensors());
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for len in [0, 5, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let e = ModelFiles::open(&dir).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_and_unsupported_configs() {
    let dir = common::temp_dir("hf-config");
    write_common(&dir);
    write_single(&dir, &tensors());
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = ModelFiles::open(&dir).unwrap_err();
    assert!(
        matches!(&e, ModelError::MissingFile { path, .. } if path.ends_with("tokenizer.json")),
        "{e}"
    );
    std::fs::write(
        dir.join("config.json"),
        json!({"architectures": ["GPTNeoXForCausalLM"]}).to_string(),
    )
    .unwrap();
    let e = ModelFiles::open(&dir).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { .. }),
        "{e}"
    );
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("invalid JSON"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
