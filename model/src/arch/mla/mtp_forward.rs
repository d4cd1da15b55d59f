//! [`MlaModel`]'s multi-token-prediction methods: loading the [`MtpLayer`] and running it
//! as a draft model (see [`super::mtp`] for what the layer computes).
//!
//! Kept apart from `mtp` so that the layer's data does not depend on the model that holds
//! it: `model` names `MtpLayer`, and this file names both.

use dcpserve_kernels::dcp::DcpAttention;
use dcpserve_kernels::{matmul, rms_norm, ThreadPool};

use super::cache::LatentCache;
use super::model::MlaModel;
use super::mtp::MtpLayer;
use crate::arch::cache_access::CacheAccess;
use crate::arch::forward::BatchInput;
use crate::arch::rank_io::{ForwardOutput, RankComms};
use crate::arch::weights::WeightPrecision;
use crate::error::ModelError;
use crate::tensors::TensorSource;

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
