//! RoPE for the `qk_rope_head_dim` part of MLA queries and keys: the model's view of the
//! kernels' [`RopeTable`] (DeepSeek's YaRN, transformers' `_compute_yarn_parameters`,
//! lives there), plus YaRN's softmax-scale correction.

use dcpserve_kernels::{yarn_mscale, RopeScalingKind, RopeTable, YarnParams};

use crate::config::{MlaConfig, YarnScaling};
use crate::error::ModelError;

/// The kernels' YaRN parameters for a model's `rope_scaling`.
fn yarn_params(y: &YarnScaling) -> YarnParams {
    YarnParams {
        factor: y.factor,
        original_max_position_embeddings: y.original_max_position_embeddings,
        beta_fast: y.beta_fast,
        beta_slow: y.beta_slow,
        mscale: y.mscale,
        mscale_all_dim: y.mscale_all_dim,
        attention_factor: y.attention_factor,
        truncate: y.truncate,
    }
}

/// Cos/sin tables of the rope dimensions, already multiplied by YaRN's attention factor.
pub struct MlaRope {
    table: RopeTable,
    interleaved: bool,
}

impl MlaRope {
    /// Tables for positions `0..max_positions` (later positions are computed on the fly).
    pub fn new(mla: &MlaConfig, theta: f32, max_positions: usize) -> Self {
        let scaling = match &mla.yarn {
            None => RopeScalingKind::None,
            Some(y) => RopeScalingKind::Yarn(yarn_params(y)),
        };
        Self {
            table: RopeTable::new(mla.qk_rope_head_dim, theta, scaling, max_positions),
            interleaved: mla.rope_interleave,
        }
    }

    /// Rotates each `dim`-wide vector `x[stride·k + offset ..][..dim]` for position `pos`
    /// (see [`RopeTable::apply_strided`]).
    pub fn apply(
        &self,
        x: &mut [f32],
        stride: usize,
        offset: usize,
        pos: usize,
    ) -> Result<(), ModelError> {
        Ok(self
            .table
            .apply_strided(x, stride, offset, pos, self.interleaved)?)
    }
}

/// The softmax scale: `qk_head_dim^-0.5`, times YaRN's `mscale(factor, mscale_all_dim)²`
/// when configured (transformers' `yarn_apply_mscale`).
pub fn softmax_scale(mla: &MlaConfig) -> f32 {
    let base = ((mla.qk_nope_head_dim + mla.qk_rope_head_dim) as f32).powf(-0.5);
    match &mla.yarn {
        Some(y) => match y.mscale_all_dim {
            Some(ma) if ma != 0.0 => {
                let m = yarn_mscale(y.factor, ma);
                base * m * m
            }
            _ => base,
        },
        None => base,
    }
}
