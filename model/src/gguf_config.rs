//! [`ModelConfig`] from GGUF metadata (llama.cpp's `{arch}.*` keys).

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::ModelError;
use crate::gguf::GgufFile;

mod deepseek2;

/// Typed access to the `{arch}.*` metadata keys, with errors naming the key.
pub(crate) struct Meta<'a> {
    pub file: &'a GgufFile,
    /// `general.architecture`, the prefix of the model's keys.
    pub arch: &'a str,
}

impl Meta<'_> {
    /// The full key name.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An integer key as `usize`; an error for per-layer arrays (only uniform layers run).
    pub fn usize_opt(&self, k: &str) -> Result<Option<usize>, ModelError> {
        let (path, k) = (self.file.path(), self.key(k));
        match self.file.get_u64(&k) {
            Ok(v) => v
                .map(|v| {
                    usize::try_from(v)
                        .map_err(|_| ModelError::config(path, format!("{k} = {v} is too large")))
                })
                .transpose(),
            // Some converters store per-layer arrays (e.g. head_count_kv); say so plainly.
            Err(_) if self.file.get_array(&k).is_ok() => Err(ModelError::unsupported(
                path,
                format!("{k} is a per-layer array; only uniform layers are supported"),
            )),
            Err(e) => Err(e),
        }
    }

    /// A required integer key.
    pub fn usize_req(&self, k: &str) -> Result<usize, ModelError> {
        self.usize_opt(k)?
            .ok_or_else(|| ModelError::config(self.file.path(), format!("missing {}", self.key(k))))
    }

    /// A numeric key as `f64`.
    pub fn f64_opt(&self, k: &str) -> Result<Option<f64>, ModelError> {
        self.file.get_f64(&self.key(k))
    }
}

/// Builds the configuration of a `llama`, `qwen2`, `qwen3` or `deepseek2` GGUF.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let path = file.path();
    let arch_name = file
        .get_str("general.architecture")?
        .ok_or_else(|| ModelError::config(path, "missing general.architecture"))?;
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "deepseek2" => Architecture::DeepseekV3,
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                arch: other.to_string(),
            })
        }
    };
    let meta = Meta {
        file,
        arch: arch_name,
    };
    let key = |k: &str| meta.key(k);
    let usize_opt = |k: &str| meta.usize_opt(k);
    let usize_req = |k: &str| meta.usize_req(k);

    let hidden_size = usize_req("embedding_length")?;
    let num_attention_heads = usize_req("attention.head_count")?;
    if hidden_size == 0 || num_attention_heads == 0 {
        return Err(ModelError::config(
            path,
            "embedding_length and head_count must be positive",
        ));
    }
    let num_key_value_heads = usize_opt("attention.head_count_kv")?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
        return Err(ModelError::config(
            path,
            format!("head_count {num_attention_heads} is not a multiple of head_count_kv {num_key_value_heads}"),
        ));
    }
    let head_dim = usize_opt("attention.key_length")?.unwrap_or(hidden_size / num_attention_heads);
    let vocab_size = match usize_opt("vocab_size")? {
        Some(v) => v,
        None => file
            .get_array("tokenizer.ggml.tokens")?
            .map(<[_]>::len)
            .ok_or_else(|| {
                ModelError::config(
                    path,
                    format!("neither {} nor tokenizer.ggml.tokens", key("vocab_size")),
                )
            })?,
    };

    let deepseek = architecture == Architecture::DeepseekV3;
    let rope_scaling = match file.get_str(&key("rope.scaling.type"))? {
        None | Some("none") => None,
        // DeepSeek's YaRN belongs to its latent attention (`MlaConfig::yarn`).
        Some(_) if deepseek => None,
        Some("linear") => {
            let factor = file.get_f64(&key("rope.scaling.factor"))?.ok_or_else(|| {
                ModelError::config(path, "linear rope scaling without rope.scaling.factor")
            })?;
            Some(RopeScaling::Linear {
                factor: factor as f32,
            })
        }
        Some(other) => {
            return Err(ModelError::unsupported(
                path,
                format!("rope scaling type {other:?} (supported: linear)"),
            ))
        }
    };
    // llama.cpp bakes Llama-3.1 style scaling into a `rope_freqs.weight` tensor of per-frequency
    // divisors instead of metadata; the forward pass does not consume it yet, and ignoring it
    // would silently change the model's outputs.
    if file.tensor_info("rope_freqs.weight").is_some() {
        return Err(ModelError::unsupported(
            path,
            "rope frequency factors (rope_freqs.weight, Llama-3.1 style rope scaling) are not supported yet",
        ));
    }

    let has_tensor = |name: &str| file.tensor_info(name).is_some();
    let eps = file
        .get_f64(&key("attention.layer_norm_rms_epsilon"))?
        .unwrap_or(1e-5);

    let u32_id = |k: &str| -> Result<Option<u32>, ModelError> {
        Ok(file.get_u64(k)?.and_then(|v| u32::try_from(v).ok()))
    };
    let mut eos_token_ids = Vec::new();
    for k in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        eos_token_ids.extend(u32_id(k)?);
    }
    if let Some(ids) = file.get_array("tokenizer.ggml.eos_token_ids")? {
        eos_token_ids.extend(
            ids.iter()
                .filter_map(|v| v.as_u64())
                .filter_map(|v| u32::try_from(v).ok()),
        );
    }
    let mut seen = std::collections::HashSet::new();
    eos_token_ids.retain(|id| seen.insert(*id));

    let mut config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: usize_req("feed_forward_length")?,
        num_hidden_layers: usize_req("block_count")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        rms_norm_eps: eps as f32,
        rope_theta: file.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32,
        rope_scaling,
        // llama.cpp's converter permutes llama q/k rows for adjacent-pair RoPE; qwen2/qwen3 keep
        // the Hugging Face (NEOX) layout.
        rope_interleaved: architecture == Architecture::Llama,
        max_position_embeddings: usize_opt("context_length")?.unwrap_or(2048),
        tie_word_embeddings: !has_tensor("output.weight"),
        attention_bias: architecture == Architecture::Qwen2 || has_tensor("blk.0.attn_q.bias"),
        qk_norm: architecture == Architecture::Qwen3 || has_tensor("blk.0.attn_q_norm.weight"),
        bos_token_id: u32_id("tokenizer.ggml.bos_token_id")?,
        eos_token_ids,
        mla: None,
        moe: None,
    };
    if deepseek {
        deepseek2::apply(&meta, &mut config)?;
    }
    crate::config_check::check_config(path, &config)?;
    Ok(config)
}
