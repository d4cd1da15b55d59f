//! [`MlaModel`]'s multi-token-prediction methods: loading the [`MtpLayer`] and running it
//! as a draft model (see [`super::mtp`] for what the layer computes).
//!
//! Kept apart from `mtp` so that the layer's data does not depend on the model that holds
//! it: `model` names the layer's device form, and this file names both.

use dcpserve_kernels::{Backend, Precision, Strided};

use super::cache::LatentCache;
use super::device_weights::DeviceMtp;
use super::model::MlaModel;
use super::mtp::MtpLayer;
use crate::arch::batch_input::BatchInput;
use crate::arch::cache_access::CacheAccess;
use crate::arch::head::copy_out;
use crate::arch::rank_io::{ForwardOutput, RankComms};
use crate::arch::split_step::AttendBatch;
use crate::arch::weights::WeightPrecision;
use crate::arch::workspace::whole;
use crate::error::ModelError;
use crate::tensors::TensorSource;

impl<B: Backend> MlaModel<B> {
    /// Loads this rank's share of the MTP layer onto the backend; from then on the latent
    /// cache has one more layer ([`MlaModel::cache_layers`]).
    pub fn load_mtp(
        &mut self,
        src: &dyn TensorSource,
        precision: WeightPrecision,
    ) -> Result<(), ModelError> {
        let host = MtpLayer::load(&self.shell.config, src, precision, self.shell.shard)?;
        let mtp = DeviceMtp::upload(&self.shell.backend, &host)?;
        self.set_mtp(mtp);
        Ok(())
    }
}

impl<B: Backend> MlaModel<B> {
    /// Runs the MTP layer over a batch: `input.tokens[j]` is the token *after* position
    /// `input.positions[j]` and `prev_hidden` (`[n, hidden]`) that position's previous
    /// hidden state (the main model's final-normed one, or the MTP output of the position
    /// before when chaining). Stores the layer's latents at `input.slots`, attends causally
    /// like the target, and returns the draft logits of `input.logits_for` and the MTP
    /// output hidden states of every row (`[n, hidden]`, the same on every rank). Every
    /// rank of the group must call it with the same plan (through [`MlaModel::forward`]).
    pub(super) fn mtp_step(
        &self,
        comms: &RankComms<B>,
        input: &BatchInput,
        prev_hidden: B::View<'_>,
        mut cache: impl CacheAccess<LatentCache<B>>,
    ) -> Result<ForwardOutput<B>, ModelError> {
        let Some(mtp) = &self.mtp else {
            return Err(ModelError::Invalid(
                "the multi-token-prediction layer is not loaded".into(),
            ));
        };
        let dev = &self.shell.backend;
        let cfg = &self.shell.config;
        let (n, h, eps) = (input.checked_len()?, cfg.hidden_size, cfg.rms_norm_eps);
        let nh = n * h;
        cache.with(|c| self.check_cache(c))?;
        if dev.view_len(prev_hidden) != nh {
            return Err(ModelError::Invalid(format!(
                "MTP step: {} previous-hidden values for {n} tokens of {h}",
                dev.view_len(prev_hidden)
            )));
        }
        input.check_vocab(cfg.vocab_size)?;
        let embed = mtp
            .embed_tokens
            .as_ref()
            .unwrap_or(&self.shell.weights.embed_tokens);
        self.in_workspace(|ws| {
            ws.prepare(dev, n, comms.dcp_merge)?;
            let b = &mut ws.t.mtp;
            b.prepare(dev, n, h)?;
            dev.embedding(embed, input.tokens, dev.view_mut(&mut b.embedded, 0..nh)?)?;
            for (t, &pos) in input.positions.iter().enumerate() {
                // vLLM / SGLang mask the token embedding at position 0.
                if pos == 0 {
                    dev.fill(dev.view_mut(&mut b.embedded, t * h..(t + 1) * h)?, 0.0)?;
                }
            }
            let e = dev.view(&b.embedded, 0..nh)?;
            dev.rms_norm(
                e,
                whole(dev, &mtp.enorm)?,
                eps,
                dev.view_mut(&mut b.enormed, 0..nh)?,
            )?;
            let hn = dev.view_mut(&mut b.hnormed, 0..nh)?;
            dev.rms_norm(prev_hidden, whole(dev, &mtp.hnorm)?, eps, hn)?;
            // Row t of the projection's input is [enorm(e_t) ; hnorm(h_t)].
            for (half, part) in [(0, &b.enormed), (h, &b.hnormed)] {
                let src = (dev.view(part, 0..nh)?, Strided::packed(h));
                let cat = dev.view_mut(&mut b.cat, 0..2 * nh)?;
                dev.copy_strided(src, (cat, Strided::new(2 * h, half)), n, h)?;
            }
            let cat = dev.view(&b.cat, 0..2 * nh)?;
            let x = dev.view_mut(&mut ws.t.x, 0..nh)?;
            dev.matmul(cat, n, &mtp.eh_proj, x, Precision::Exact)?;
            let li = cfg.num_hidden_layers;
            let attend = AttendBatch::of(input);
            self.layer(comms, (input, &attend), &mut cache, (li, &mtp.layer), ws)?;
            let head = mtp
                .head
                .as_ref()
                .unwrap_or(self.shell.weights.output_head());
            let mut out = self.logits(comms, ws, n, input.logits_for, (&mtp.head_norm, head))?;
            out.hidden = Some(copy_out(dev, &ws.t.x, nh)?);
            Ok(out)
        })
    }
}
