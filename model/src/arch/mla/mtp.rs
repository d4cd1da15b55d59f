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
//! like every other layer, with its latents in one extra layer of the [`LatentCache`].

use dcpserve_kernels::{matmul, rms_norm, ThreadPool, WeightMatrix};

use super::cache::LatentCache;
use super::model::MlaModel;
use super::weights::MlaLayer;
use crate::arch::cache_access::CacheAccess;
use crate::arch::forward::{BatchInput, ForwardOutput, RankComms};
use crate::arch::weights::{matrix, vector, TpShard, WeightPrecision};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::tensors::TensorSource;
use dcpserve_kernels::dcp::DcpAttention;

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

impl MlaModel {
    /// Loads this rank's share of the MTP layer; from then on the latent cache has one more
    /// layer ([`MlaModel::cache_layers`]).
    pub fn load_mtp(
        &mut self,
        src: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<(), ModelError> {
        self.mtp = Some(MtpLayer::load(&self.config, src, precision, self.shard)?);
        Ok(())
    }

    /// Runs the MTP layer over a batch: `input.tokens[j]` is the token *after* position
    /// `input.positions[j]` and `prev_hidden` (`[n, hidden]`) that position's previous
    /// hidden state (the main model's final-normed one, or the MTP output of the position
    /// before when chaining). Stores the layer's latents at `input.slots`, attends causally
    /// like the target, and returns the draft logits of `input.logits_for` and the MTP
    /// output hidden states of every row (`[n, hidden]`, the same on every rank). Every
    /// rank of the group must call it with the same plan.
    pub fn forward_mtp(
        &self,
        pool: &ThreadPool,
        comms: &RankComms,
        input: &BatchInput,
        prev_hidden: &[f32],
        mut cache: impl CacheAccess<LatentCache>,
    ) -> Result<(ForwardOutput, Vec<f32>), ModelError> {
        let Some(mtp) = &self.mtp else {
            return Err(ModelError::Invalid(
                "the multi-token-prediction layer is not loaded".into(),
            ));
        };
        let cfg = &self.config;
        let (n, h, eps) = (input.checked_len()?, cfg.hidden_size, cfg.rms_norm_eps);
        cache.with(|c| self.check_cache(c))?;
        if prev_hidden.len() != n * h {
            return Err(ModelError::Invalid(format!(
                "MTP step: {} previous-hidden values for {n} tokens of {h}",
                prev_hidden.len()
            )));
        }
        let embed = mtp
            .embed_tokens
            .as_ref()
            .unwrap_or(&self.weights.embed_tokens);
        let mut e = input.embed(embed, cfg.vocab_size, h)?;
        for (t, &pos) in input.positions.iter().enumerate() {
            // vLLM / SGLang mask the token embedding at position 0.
            if pos == 0 {
                e[t * h..(t + 1) * h].fill(0.0);
            }
        }
        let mut en = vec![0.0f32; n * h];
        let mut hn = vec![0.0f32; n * h];
        rms_norm(&e, &mtp.enorm, eps, &mut en)?;
        rms_norm(prev_hidden, &mtp.hnorm, eps, &mut hn)?;
        let mut cat = vec![0.0f32; n * 2 * h];
        for t in 0..n {
            cat[t * 2 * h..t * 2 * h + h].copy_from_slice(&en[t * h..(t + 1) * h]);
            cat[t * 2 * h + h..(t + 1) * 2 * h].copy_from_slice(&hn[t * h..(t + 1) * h]);
        }
        let mut x = vec![0.0f32; n * h];
        matmul(pool, &cat, n, &mtp.eh_proj, &mut x)?;
        let mut b = self.buffers(n);
        let mut dcp = DcpAttention::new(comms.dcp_merge);
        let li = cfg.num_hidden_layers;
        self.layer(
            pool,
            comms,
            input,
            &mut cache,
            (li, &mtp.layer),
            &mut x,
            &mut b,
            &mut dcp,
        )?;
        let head = mtp.head.as_ref().unwrap_or(self.weights.output_head());
        let out = self.logits(comms, &x, input.logits_for, &mtp.head_norm, head)?;
        Ok((out, x))
    }
}
