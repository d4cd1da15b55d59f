//! The per-rank scratch of the MLA forward: every activation buffer of a step (attention,
//! dense MLP or mixture of experts, MTP input), allocated once through the backend for
//! the largest step seen so far and reused across layers and steps.

use dcpserve_kernels::Backend;

use crate::arch::workspace::{grow, TokenBuffers, Workspace};
use crate::error::ModelError;

/// Widths per token of an MLA model's activations on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaWidths {
    /// Hidden size.
    pub hidden: usize,
    /// `q_lora_rank` (0 without low-rank queries).
    pub q_lora: usize,
    /// This rank's heads × (nope + rope) query values.
    pub q: usize,
    /// One latent row (`kv_lora_rank + qk_rope_head_dim`).
    pub latent: usize,
    /// This rank's heads × latent row: the absorbed queries.
    pub q_abs: usize,
    /// This rank's heads × `kv_lora_rank`: the attended latents.
    pub lat_out: usize,
    /// One head's slice in the absorption matmuls (input side).
    pub head_in: usize,
    /// One head's slice in the absorption matmuls (output side).
    pub head_out: usize,
    /// This rank's heads × `v_head_dim`.
    pub attn: usize,
    /// The widest MLP intermediate slice on this rank (dense, routed or shared expert).
    pub inter: usize,
    /// Routed experts (the router's logits).
    pub experts: usize,
}

/// The MoE's buffers: router logits, the rows routed to one expert and its output, and
/// the host-side lists of which tokens an expert serves.
pub struct MoeBuffers<B: Backend> {
    pub logits: B::Buffer,
    pub rows: B::Buffer,
    pub out: B::Buffer,
    /// Tokens routed to the current expert.
    pub picked: Vec<usize>,
    /// Their routing weights.
    pub weights: Vec<f32>,
}

/// One SiLU-gated MLP's intermediate buffers.
pub struct MlpBuffers<B: Backend> {
    pub gate: B::Buffer,
    pub up: B::Buffer,
    pub act: B::Buffer,
}

/// The MTP layer's input buffers, grown on the first MTP step (only ranks running one
/// need them).
pub struct MtpBuffers<B: Backend> {
    pub embedded: B::Buffer,
    pub enormed: B::Buffer,
    pub hnormed: B::Buffer,
    pub cat: B::Buffer,
}

impl<B: Backend> MtpBuffers<B> {
    fn new(dev: &B) -> Result<Self, ModelError> {
        Ok(Self {
            embedded: dev.alloc(0)?,
            enormed: dev.alloc(0)?,
            hnormed: dev.alloc(0)?,
            cat: dev.alloc(0)?,
        })
    }

    /// Makes room for `n` tokens of `h` values.
    pub fn prepare(&mut self, dev: &B, n: usize, h: usize) -> Result<(), ModelError> {
        grow(dev, &mut self.embedded, n * h)?;
        grow(dev, &mut self.enormed, n * h)?;
        grow(dev, &mut self.hnormed, n * h)?;
        grow(dev, &mut self.cat, 2 * n * h)
    }
}

/// An MLA step's per-token buffers.
pub struct MlaBuffers<B: Backend> {
    /// The residual stream `[n, hidden]`.
    pub(crate) x: B::Buffer,
    pub(crate) normed: B::Buffer,
    pub(crate) qa: B::Buffer,
    pub(crate) q: B::Buffer,
    pub(crate) kv: B::Buffer,
    pub(crate) q_abs: B::Buffer,
    pub(crate) lat_out: B::Buffer,
    pub(crate) head_in: B::Buffer,
    pub(crate) head_out: B::Buffer,
    pub(crate) attn: B::Buffer,
    /// A layer's partial output (attention's `o_proj`, the MLP), before the all-reduce.
    pub(crate) proj: B::Buffer,
    pub(crate) mlp: MlpBuffers<B>,
    pub(crate) moe: MoeBuffers<B>,
    pub(crate) mtp: MtpBuffers<B>,
}

impl<B: Backend> TokenBuffers<B> for MlaBuffers<B> {
    type Widths = MlaWidths;

    fn alloc(dev: &B, w: MlaWidths, n: usize) -> Result<Self, ModelError> {
        Ok(Self {
            x: dev.alloc(n * w.hidden)?,
            normed: dev.alloc(n * w.hidden)?,
            qa: dev.alloc(n * w.q_lora)?,
            q: dev.alloc(n * w.q)?,
            kv: dev.alloc(n * w.latent)?,
            q_abs: dev.alloc(n * w.q_abs)?,
            lat_out: dev.alloc(n * w.lat_out)?,
            head_in: dev.alloc(n * w.head_in)?,
            head_out: dev.alloc(n * w.head_out)?,
            attn: dev.alloc(n * w.attn)?,
            proj: dev.alloc(n * w.hidden)?,
            mlp: MlpBuffers {
                gate: dev.alloc(n * w.inter)?,
                up: dev.alloc(n * w.inter)?,
                act: dev.alloc(n * w.inter)?,
            },
            // A token picks an expert at most once, so an expert serves at most `n` rows.
            moe: MoeBuffers {
                logits: dev.alloc(n * w.experts)?,
                rows: dev.alloc(n * w.hidden)?,
                out: dev.alloc(n * w.hidden)?,
                picked: Vec::with_capacity(n),
                weights: Vec::with_capacity(n),
            },
            // Grown by the first MTP step (only ranks running one need them).
            mtp: MtpBuffers::new(dev)?,
        })
    }
}

/// An MLA model's workspace.
pub type MlaWorkspace<B> = Workspace<B, MlaBuffers<B>>;
