//! Random-weight Llama-family models written as Hugging Face folders, for benchmarks
//! that need shapes no committed fixture has (e.g. a long-context MQA model).

use std::path::Path;

use anyhow::{Context, Result};
use dcpserve_kernels::Rng;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// The shape of a synthetic model.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub max_position_embeddings: usize,
    pub seed: u64,
}

/// Vocabulary of the tokenizer the synthetic models share (fixtures/tiny-llama's).
pub const SYNTHETIC_VOCAB: usize = 384;

fn random(rng: &mut Rng, n: usize, std: f32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        // Sum of uniforms: cheap, roughly normal.
        let u: f32 = (0..4).map(|_| rng.next_f32()).sum::<f32>() - 2.0;
        out.extend_from_slice(&(u * std * 1.7).to_le_bytes());
    }
    out
}

fn ones(n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect()
}

/// Writes config.json, model.safetensors (f32) and the tiny tokenizer into `dir`.
pub fn write_synthetic_llama(dir: &Path, spec: &SyntheticSpec) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let fixtures = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/tiny-llama"
    ));
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures.join(f), dir.join(f)).with_context(|| format!("copy {f}"))?;
    }
    let s = spec;
    let config = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {}, "head_dim": {}, "vocab_size": {}, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": {}, "tie_word_embeddings": true, "bos_token_id": 0, "eos_token_id": 2}}"#,
        s.hidden,
        s.intermediate,
        s.layers,
        s.heads,
        s.kv_heads,
        s.head_dim,
        SYNTHETIC_VOCAB,
        s.max_position_embeddings
    );
    std::fs::write(dir.join("config.json"), config)?;
    let mut rng = Rng::new(s.seed);
    let q = s.heads * s.head_dim;
    let kv = s.kv_heads * s.head_dim;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![(
        "model.embed_tokens.weight".into(),
        vec![SYNTHETIC_VOCAB, s.hidden],
        random(&mut rng, SYNTHETIC_VOCAB * s.hidden, 0.5),
    )];
    tensors.push(("model.norm.weight".into(), vec![s.hidden], ones(s.hidden)));
    let std = 1.0 / (s.hidden as f32).sqrt();
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        let mut add = |name: &str, shape: Vec<usize>, std: f32| {
            let n = shape.iter().product();
            tensors.push((format!("{p}.{name}"), shape, random(&mut rng, n, std)));
        };
        add("self_attn.q_proj.weight", vec![q, s.hidden], std);
        add("self_attn.k_proj.weight", vec![kv, s.hidden], std);
        add("self_attn.v_proj.weight", vec![kv, s.hidden], std);
        add("self_attn.o_proj.weight", vec![s.hidden, q], std);
        add("mlp.gate_proj.weight", vec![s.intermediate, s.hidden], std);
        add("mlp.up_proj.weight", vec![s.intermediate, s.hidden], std);
        add(
            "mlp.down_proj.weight",
            vec![s.hidden, s.intermediate],
            1.0 / (s.intermediate as f32).sqrt(),
        );
        tensors.push((
            format!("{p}.input_layernorm.weight"),
            vec![s.hidden],
            ones(s.hidden),
        ));
        tensors.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![s.hidden],
            ones(s.hidden),
        ));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            Ok((
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), data)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))?;
    Ok(())
}
