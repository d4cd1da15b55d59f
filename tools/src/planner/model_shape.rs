//! A model's shape as the planner needs it: its configuration (from `config.json`, a
//! Hugging Face folder or a GGUF header) and its parameters on one tensor-parallel rank.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use dcpserve_model::arch::{HeadLayout, TpShard};
use dcpserve_model::hf_config::config_from_json;
use dcpserve_model::{ModelConfig, ModelFiles};

/// Reads a model's configuration without its weights: a `config.json` file, a folder
/// holding one, a `.gguf` file (its header) or a folder holding one `.gguf`.
pub fn load_model_config(path: &Path) -> Result<ModelConfig> {
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let json = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        return config_from_json(path, &json).map_err(|e| anyhow!("{e}"));
    }
    ModelFiles::read_config(path).map_err(|e| anyhow!("{e}"))
}

/// Parameters one tensor-parallel rank holds, by kind (the largest rank when a width
/// does not split evenly).
///
/// Split as vLLM splits them: query/output projections and MLP widths by rank; K/V
/// heads split while tp ≤ KV heads, else one replicated head per rank; MLA's down
/// projections (`q_a_proj`, `kv_a_proj_with_mqa`) replicated; every expert's width split
/// by rank (tensor-parallel MoE, no expert parallelism); embedding and output head split
/// by vocabulary; norms and the router replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankParams {
    /// Attention projections (linear layers).
    pub attention: u64,
    /// Dense MLPs (every layer of a dense model; the first layers of a MoE model).
    pub dense_mlp: u64,
    /// Routed experts, all of them (each rank holds a slice of every expert).
    pub routed_experts: u64,
    /// Shared (always-on) experts.
    pub shared_experts: u64,
    /// Embedding, output head, norms, router: kept in 16-bit by quantized checkpoints.
    pub unquantized: u64,
}

impl RankParams {
    /// All parameters of the rank.
    pub fn total(&self) -> u64 {
        self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.unquantized
    }
}

fn split(width: usize, tp: usize) -> u64 {
    width.div_ceil(tp.max(1)) as u64
}

/// Parameters of tensor-parallel rank 0 of `tp` ranks (see [`RankParams`]).
pub fn rank_params(cfg: &ModelConfig, tp: usize) -> RankParams {
    let tp = tp.max(1);
    let h = cfg.hidden_size as u64;
    let layers = cfg.num_hidden_layers as u64;
    let mut p = RankParams::default();
    let heads = split(cfg.num_attention_heads, tp);
    match &cfg.mla {
        Some(mla) => {
            let qk = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) as u64;
            let q = match mla.q_lora_rank {
                Some(r) => r as u64 * h + heads * qk * r as u64,
                None => heads * qk * h,
            };
            let kv_a = mla.latent_dim() as u64 * h;
            let kv_b =
                heads * (mla.qk_nope_head_dim + mla.v_head_dim) as u64 * mla.kv_lora_rank as u64;
            let o = h * heads * mla.v_head_dim as u64;
            p.attention = layers * (q + kv_a + kv_b + o);
            let norms = 2 * h + mla.kv_lora_rank as u64 + mla.q_lora_rank.unwrap_or(0) as u64;
            p.unquantized += layers * norms;
        }
        None => {
            let d = cfg.head_dim as u64;
            let kv_heads = HeadLayout::new(cfg, TpShard { rank: 0, size: tp }).kv_heads as u64;
            let (q, kv) = (heads * d, kv_heads * d);
            let bias = if cfg.attention_bias { q + 2 * kv } else { 0 };
            p.attention = layers * (q * h + 2 * kv * h + h * q + bias);
            let qk_norm = if cfg.qk_norm { 2 * d } else { 0 };
            p.unquantized += layers * (2 * h + qk_norm);
        }
    }
    let mlp = |width: usize| 3 * h * split(width, tp);
    match &cfg.moe {
        Some(moe) => {
            let dense_layers = moe.first_k_dense_replace.min(cfg.num_hidden_layers) as u64;
            let moe_layers = layers - dense_layers;
            p.dense_mlp = dense_layers * mlp(cfg.intermediate_size);
            p.routed_experts =
                moe_layers * moe.n_routed_experts as u64 * mlp(moe.moe_intermediate_size);
            p.shared_experts = moe_layers * mlp(moe.moe_intermediate_size * moe.n_shared_experts);
            let bias = if moe.correction_bias {
                moe.n_routed_experts as u64
            } else {
                0
            };
            p.unquantized += moe_layers * (moe.n_routed_experts as u64 * h + bias);
        }
        None => p.dense_mlp = layers * mlp(cfg.intermediate_size),
    }
    let vocab = split(cfg.vocab_size, tp) * h;
    let heads_out = if cfg.tie_word_embeddings { 1 } else { 2 };
    p.unquantized += heads_out * vocab + h;
    p
}

/// Fraction of the routed experts one token activates (`num_experts_per_tok / n_routed`);
/// 1 for dense models.
pub fn routed_fraction_per_token(cfg: &ModelConfig) -> f64 {
    cfg.moe.as_ref().map_or(1.0, |m| {
        m.num_experts_per_tok as f64 / m.n_routed_experts.max(1) as f64
    })
}

/// Expected fraction of the routed experts a batch of `batch` tokens touches, if each
/// token picks its experts uniformly at random: `1 − (1 − k/n)^batch`. Their weights are
/// what one decode step reads.
pub fn routed_fraction_touched(cfg: &ModelConfig, batch: usize) -> f64 {
    match &cfg.moe {
        Some(_) => 1.0 - (1.0 - routed_fraction_per_token(cfg)).powi(batch as i32),
        None => 1.0,
    }
}

/// One line describing the model.
pub fn describe(cfg: &ModelConfig) -> String {
    let attn = match &cfg.mla {
        Some(m) => format!(
            "MLA ({} heads, latent {} + rope {})",
            cfg.num_attention_heads, m.kv_lora_rank, m.qk_rope_head_dim
        ),
        None => format!(
            "GQA ({} query heads, {} KV heads of {})",
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        ),
    };
    let mlp = match &cfg.moe {
        Some(m) => format!(
            "MoE {} experts ({} per token, {} shared) of width {}",
            m.n_routed_experts, m.num_experts_per_tok, m.n_shared_experts, m.moe_intermediate_size
        ),
        None => format!("dense MLP of width {}", cfg.intermediate_size),
    };
    let total = rank_params(cfg, 1).total() as f64;
    format!(
        "{:?}, {} layers, hidden {}, {attn}, {mlp}, vocab {}; {:.3} B parameters",
        cfg.architecture,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        total / 1e9
    )
}
