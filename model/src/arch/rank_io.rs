//! What a forward step returns and the communicators it computes with: shared by the
//! dense and MLA forwards and the output head, kept apart from them so none of those
//! modules depends on another for these types.

use std::sync::Arc;

use dcpserve_kernels::dcp::{MergeExchange, PrefillSplit};
use dcpserve_kernels::{Backend, Collectives, CpuBackend, SoloCollectives};

use super::cache_access::TurnPoints;

/// What a forward step returns: the logits of the requested tokens, row-major
/// `[logits_for.len(), vocab]`, in a buffer of the backend (on the CPU a `Vec<f32>`), and
/// the hidden states asked for in [`ForwardOptions`].
pub struct ForwardOutput<B: Backend = CpuBackend> {
    pub logits: B::Buffer,
    pub vocab_size: usize,
    /// `[rows, hidden_size]`, the same on every rank: the final-normed hidden states of
    /// [`ForwardOptions::hidden_for`], or after an MTP step the MTP layer's output of
    /// every row. `None` when neither was asked for.
    pub hidden: Option<B::Buffer>,
}

/// What a forward step computes besides the logits; the default is a plain step of the
/// model ([`RankModel::forward`](super::RankModel::forward)).
///
/// ```
/// use dcpserve_model::arch::ForwardOptions;
/// // A step that also returns the final hidden states of its first two tokens.
/// let opts: ForwardOptions = ForwardOptions { hidden_for: &[0, 1], ..Default::default() };
/// assert!(opts.mtp_prev_hidden.is_none());
/// ```
pub struct ForwardOptions<'a, B: Backend + 'a = CpuBackend> {
    /// Tokens whose final-normed hidden states are returned in [`ForwardOutput::hidden`]
    /// (MLA models: what the MTP layer takes as its previous hidden states).
    pub hidden_for: &'a [usize],
    /// Run the multi-token-prediction layer (MLA models that loaded it) instead of the
    /// model: `input.tokens[j]` is the token after `input.positions[j]`, and this
    /// `[n, hidden]` view that position's previous hidden state.
    pub mtp_prev_hidden: Option<B::View<'a>>,
    /// Where the step may let the rank's other micro-batch thread, which shares the KV
    /// cache, compute (at every cache access).
    pub turns: Option<&'a dyn TurnPoints>,
}

impl<B: Backend> Default for ForwardOptions<'_, B> {
    fn default() -> Self {
        Self {
            hidden_for: &[],
            mtp_prev_hidden: None,
            turns: None,
        }
    }
}

/// The collectives one rank computes with, over its backend's buffers: its
/// tensor-parallel group (all ranks of its copy of the model) and its context-parallel
/// group (a contiguous block of `dcp` TP ranks, in every prefill-context-parallel copy),
/// how that group exchanges attention partials, and which tokens of a step this rank's
/// copy computes. CPU ranks reach a host communicator through
/// [`HostCollectives`](dcpserve_kernels::HostCollectives); a CUDA rank passes its NCCL
/// communicator here.
pub struct RankComms<B: Backend = CpuBackend> {
    pub world: Arc<dyn Collectives<B>>,
    pub dcp: Arc<dyn Collectives<B>>,
    pub dcp_merge: MergeExchange,
    pub split: PrefillSplit,
}

impl<B: Backend> Clone for RankComms<B> {
    fn clone(&self) -> Self {
        Self {
            world: self.world.clone(),
            dcp: self.dcp.clone(),
            dcp_merge: self.dcp_merge,
            split: self.split,
        }
    }
}

impl<B: Backend> RankComms<B> {
    /// The collectives of a model served by one rank (every collective is a copy or
    /// nothing).
    pub fn single() -> Self {
        let solo: Arc<dyn Collectives<B>> = Arc::new(SoloCollectives);
        Self {
            dcp: solo.clone(),
            world: solo,
            dcp_merge: MergeExchange::default(),
            split: PrefillSplit::single(),
        }
    }
}

/// `x += all_reduce(proj)` over the first `nh` values: a row-parallel layer's partial
/// output (attention's `o_proj`, the MLP's `down_proj`, the MoE sum) summed over the
/// tensor-parallel group into the residual stream.
pub(crate) fn add_reduced<B: Backend>(
    dev: &B,
    comms: &RankComms<B>,
    nh: usize,
    proj: &mut B::Buffer,
    x: &mut B::Buffer,
) -> Result<(), crate::error::ModelError> {
    comms
        .world
        .all_reduce_sum(dev, dev.view_mut(proj, 0..nh)?)?;
    dev.add(dev.view_mut(x, 0..nh)?, dev.view(proj, 0..nh)?)?;
    Ok(())
}
