//! DeepSeek-V3's multi-token-prediction (MTP, "nextn") layer, run as a draft model.
//!
//! The checkpoint stores it as decoder layer `N = num_hidden_layers` with extra tensors:
//! `enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, `shared_head.head` and optionally its
//! own `embed_tokens` (otherwise the main model's is shared). As vLLM's `deepseek_mtp.py`
//! and SGLang run it, for a target position `i` with the main model's final-normed hidden
//! state `h_i` and the next token `t_{i+1}`:
//!
//! ```text
//! x_i = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)])   (the embedding is zeroed at position 0)
//! y   = DecoderLayer_N(x)            causal MLA over the layer's own latents, positions as the target's
//! draft logits_i = shared_head.head(shared_head.norm(y_i))            (predict t_{i+2})
//! ```
//!
//! A further draft chains: `y_i` (before `shared_head.norm`) is the previous hidden state
//! of position `i + 1`, whose token is the first draft. The decoder layer is the ordinary
//! [`MlaLayer`] (a mixture of experts when `N >= first_k_dense_replace`), tensor-parallel
//! like every other layer, with its latents in one extra layer of the
//! [`LatentCache`](super::cache::LatentCache).

use dcpserve_kernels::WeightMatrix;

use super::weights::MlaLayer;
use crate::arch::weights::{matrix, vector, TpShard, WeightPrecision};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tensors::TensorSource;

/// One rank's share of the MTP layer.
pub struct MtpLayer {
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// `eh_proj` `[hidden, 2·hidden]` (replicated).
    pub eh_proj: WeightMatrix,
    /// The decoder layer `N`.
    pub layer: MlaLayer,
    /// `shared_head.norm`.
    pub head_norm: Vec<f32>,
    /// This rank's vocabulary slice of `shared_head.head` (`None`: the main output head).
    pub head: Option<WeightMatrix>,
    /// The layer's own embedding (`None`: the main model's).
    pub embed_tokens: Option<WeightMatrix>,
}

impl MtpLayer {
    /// Whether `src` holds an MTP layer for `cfg` (its `eh_proj` at layer `num_hidden_layers`).
    /// Configs often declare `num_nextn_predict_layers` for checkpoints whose MTP weights
    /// were dropped, so the tensors decide.
    pub fn present(cfg: &ModelConfig, src: &dyn TensorSource) -> bool {
        cfg.mla.is_some()
            && src.contains(&format!(
                "model.layers.{}.eh_proj.weight",
                cfg.num_hidden_layers
            ))
    }

    /// Reads rank `shard.rank`'s share of the MTP layer.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        precision: WeightPrecision,
        shard: TpShard,
    ) -> Result<Self, ModelError> {
        let n = cfg.num_hidden_layers;
        if !Self::present(cfg, src) {
            return Err(ModelError::Invalid(format!(
                "the model has no multi-token-prediction layer (no model.layers.{n}.eh_proj.weight)"
            )));
        }
        let (h, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let p = format!("model.layers.{n}");
        let head_name = format!("{p}.shared_head.head.weight");
        let head = if src.contains(&head_name) {
            Some(matrix(
                src,
                &head_name,
                (vocab, h),
                shard.split(vocab),
                0..h,
                precision,
            )?)
        } else {
            None
        };
        let embed_name = format!("{p}.embed_tokens.weight");
        let embed_tokens = if src.contains(&embed_name) {
            Some(matrix(
                src,
                &embed_name,
                (vocab, h),
                0..vocab,
                0..h,
                precision,
            )?)
        } else {
            None
        };
        Ok(Self {
            enorm: vector(src, &format!("{p}.enorm.weight"), h)?,
            hnorm: vector(src, &format!("{p}.hnorm.weight"), h)?,
            eh_proj: matrix(
                src,
                &format!("{p}.eh_proj.weight"),
                (h, 2 * h),
                0..h,
                0..2 * h,
                precision,
            )?,
            layer: MlaLayer::load(cfg, src, n, precision, shard)?,
            head_norm: vector(src, &format!("{p}.shared_head.norm.weight"), h)?,
            head,
            embed_tokens,
        })
    }
}
