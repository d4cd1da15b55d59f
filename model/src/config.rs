//! The architecture-level description of a model, independent of the file format it came from.

use serde::{Deserialize, Serialize};

/// Model families this engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Architecture {
    /// Llama / Llama-2 / Llama-3 / SmolLM2 (`LlamaForCausalLM`, GGUF `llama`).
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus q/k/v projection biases.
    Qwen2,
    /// Qwen3: Llama plus per-head RMSNorm on queries and keys, no biases.
    Qwen3,
}

/// RoPE frequency scaling, as in Hugging Face's `rope_scaling`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama-3.1 style smooth frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// Position interpolation: positions divided by `factor`.
    Linear { factor: f32 },
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// True when q/k rotate adjacent pairs (2i, 2i+1) — the layout of llama.cpp's GGUF
    /// `llama` tensors, whose q/k weights were permuted at conversion. False for the
    /// Hugging Face layout, which rotates (i, i + head_dim/2).
    pub rope_interleaved: bool,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}
