//! The architecture-level description of a model, independent of the file format it came from.

use dcpserve_kernels::dcp::{AttentionKind, KvShape};
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
    /// DeepSeek-V2 / V3 and Kimi K2 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`):
    /// multi-head latent attention ([`ModelConfig::mla`]) and mixture-of-experts MLPs
    /// ([`ModelConfig::moe`]).
    DeepseekV3,
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
    /// Multi-head latent attention (DeepSeek-V2/V3); `None` for standard attention.
    #[serde(default)]
    pub mla: Option<MlaConfig>,
    /// Mixture-of-experts MLPs (DeepSeek-V2/V3); `None` for dense MLPs.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    /// The attention shape that decides which (tp, dcp) layouts the model allows. MLA's
    /// one latent "head" is shared by all query heads: only tp % dcp matters for it.
    pub fn attention_kind(&self) -> AttentionKind {
        if self.mla.is_some() {
            AttentionKind::Mla {
                num_attention_heads: self.num_attention_heads,
            }
        } else {
            AttentionKind::Gqa {
                num_attention_heads: self.num_attention_heads,
                num_key_value_heads: self.num_key_value_heads,
            }
        }
    }

    /// The shape of the model's KV cache: MLA stores one latent row (`kv_lora_rank +
    /// qk_rope_head_dim`) per layer, standard attention K and V rows of `head_dim`.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            attention: self.attention_kind(),
            num_layers: self.num_hidden_layers,
            row_len: self
                .mla
                .as_ref()
                .map_or(self.head_dim, MlaConfig::latent_dim),
        }
    }
}

/// Multi-head latent attention shapes (DeepSeek-V2/V3, Kimi K2). Keys and values of all
/// heads are rebuilt from one shared latent of `kv_lora_rank` values plus one shared
/// roped key of `qk_rope_head_dim` values per token, which is all the KV cache stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlaConfig {
    /// Rank of the query compression (`q_a_proj` → `q_a_layernorm` → `q_b_proj`);
    /// `None`: a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Width of the compressed KV latent `c_kv`.
    pub kv_lora_rank: usize,
    /// Per-head query/key dimensions without position encoding.
    pub qk_nope_head_dim: usize,
    /// Per-head query/key dimensions with RoPE (the key part is shared by all heads).
    pub qk_rope_head_dim: usize,
    /// Per-head value dimensions.
    pub v_head_dim: usize,
    /// RoPE rotates adjacent pairs (2i, 2i+1) (`rope_interleave`, DeepSeek's layout)
    /// rather than (i, i + d/2).
    pub rope_interleave: bool,
    /// YaRN context extension, if configured.
    pub yarn: Option<YarnScaling>,
}

impl MlaConfig {
    /// Values the latent KV cache stores per token per layer.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// YaRN RoPE scaling as transformers' `_compute_yarn_parameters` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YarnScaling {
    pub factor: f32,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub mscale: Option<f32>,
    pub mscale_all_dim: Option<f32>,
    /// Explicit cos/sin scale; derived from the mscales when absent.
    pub attention_factor: Option<f32>,
    /// Round the correction range to whole dimensions (transformers' default).
    pub truncate: bool,
}

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoeScoring {
    /// DeepSeek-V3: sigmoid, groups ranked by the sum of their top-2 biased scores.
    Sigmoid,
    /// DeepSeek-V2: softmax, groups ranked by their best score.
    Softmax,
}

/// Mixture-of-experts MLP shapes and routing (DeepSeek-V2/V3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    /// Always-on experts, fused into one MLP of `n_shared_experts × moe_intermediate_size`.
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    /// Layers `0..first_k_dense_replace` use a dense MLP of `intermediate_size`.
    pub first_k_dense_replace: usize,
    pub scoring: MoeScoring,
    /// Restrict the top-k to the best `topk_group` groups (V2's `group_limited_greedy`;
    /// always on for V3).
    pub group_limited: bool,
    /// The router has an `e_score_correction_bias` (V3), added for choosing only.
    pub correction_bias: bool,
}
