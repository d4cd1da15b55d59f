//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) opens with the right configuration,
//! tensors and chat template.

mod common;

use dcpserve_model::gguf::GgufFile;
use dcpserve_model::{Architecture, ChatMessage, DType, ModelFiles};

#[test]
fn config_matches_the_published_model() {
    let files = ModelFiles::open(common::default_model()).unwrap();
    let c = &files.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.num_hidden_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.num_attention_heads, 9);
    assert_eq!(c.num_key_value_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert!(c.tie_word_embeddings);
    assert!(
        c.rope_interleaved,
        "llama GGUF q/k are permuted for interleaved RoPE"
    );
    assert!(!c.attention_bias && !c.qk_norm);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert!(files.chat_template.is_some());
    assert_eq!(files.tokenizer.vocab_size(), 49152);
    assert_eq!(files.tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(files.tokenizer.bos_token(), Some("<|im_start|>"));
    assert_eq!(files.tokenizer.eos_token_ids(), &[2]);
}

#[test]
fn tensors_have_hf_names_shapes_and_types() {
    let files = ModelFiles::open(common::default_model()).unwrap();
    let t = &files.tensors;
    let emb = t.get("model.embed_tokens.weight").unwrap();
    assert_eq!(
        (emb.dtype, emb.shape.clone()),
        (DType::Q8_0, vec![49152, 576])
    );
    assert_eq!(emb.bytes().len(), 49152 * 576 / 32 * 34);
    let q = t.get("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!((q.dtype, q.shape.clone()), (DType::Q4_1, vec![576, 576]));
    let k = t.get("model.layers.29.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, vec![192, 576]);
    let down = t.get("model.layers.3.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![576, 1536]);
    let norm = t.get("model.norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.shape.clone()), (DType::F32, vec![576]));
    let v = norm.to_f32_vec().unwrap();
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0));
    assert!(!t.contains("lm_head.weight"));
    // 1 embedding + 1 final norm + 30 layers x 9 tensors.
    assert_eq!(t.names().len(), 2 + 30 * 9);
    assert!(t.names().iter().all(|n| n.starts_with("model.")));
}

#[test]
fn raw_gguf_metadata() {
    let f = GgufFile::open(common::default_model()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.tensor_infos().len(), 272);
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some("smollm"));
    assert_eq!(
        f.get_array("tokenizer.ggml.merges").unwrap().unwrap().len(),
        48900
    );
    // GGUF lists token_embd as [576, 49152] (innermost first); the shape is row-major.
    assert_eq!(
        f.tensor_info("token_embd.weight").unwrap().shape,
        vec![49152, 576]
    );
}

#[test]
fn chat_template_renders_chatml() {
    let files = ModelFiles::open(common::default_model()).unwrap();
    let t = files.chat_template.as_ref().unwrap();
    let msgs = [
        ChatMessage::new("user", "What is the capital of France?"),
        ChatMessage::new("assistant", "Paris."),
    ];
    // Expected strings are transformers' apply_chat_template output for this GGUF.
    let system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    assert_eq!(
        t.render(&msgs, false).unwrap(),
        format!("{system}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n")
    );
    assert_eq!(
        t.render(&msgs[..1], true).unwrap(),
        format!("{system}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    );
    let with_system = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    assert_eq!(
        t.render(&with_system, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// The reference chat prompt (fixtures/smollm2/chat.json, from scripts/make_references.py):
/// same rendered text and the same prompt ids.
#[test]
fn chat_fixture_prompt_matches() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/smollm2/chat.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; generate it with scripts/make_references.py",
            path.display()
        )
    });
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(fixture["messages"].clone()).unwrap();
    let add_generation_prompt = fixture["add_generation_prompt"].as_bool().unwrap();
    let files = ModelFiles::open(common::default_model()).unwrap();
    let rendered = files
        .chat_template
        .as_ref()
        .unwrap()
        .render(&messages, add_generation_prompt)
        .unwrap();
    assert_eq!(rendered, fixture["prompt_text"].as_str().unwrap());
    let ids: Vec<u32> = serde_json::from_value(fixture["prompt_ids"].clone()).unwrap();
    assert_eq!(files.tokenizer.encode(&rendered, true).unwrap(), ids);
    let eos: Vec<u32> = serde_json::from_value(fixture["eos_token_ids"].clone()).unwrap();
    assert_eq!(files.config.eos_token_ids, eos);
    let generated: Vec<u32> = serde_json::from_value(fixture["generated_ids"].clone()).unwrap();
    assert_eq!(
        files.tokenizer.decode(&generated, true).unwrap(),
        fixture["generated_text"].as_str().unwrap()
    );
}

/// Loaded models are shared across rank threads.
#[test]
fn model_files_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ModelFiles>();
    assert_send_sync::<dcpserve_model::Tokenizer>();
    assert_send_sync::<dcpserve_model::ChatTemplate>();
    assert_send_sync::<dcpserve_model::RawTensor>();
}
