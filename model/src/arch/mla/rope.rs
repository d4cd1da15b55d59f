//! RoPE for the `qk_rope_head_dim` part of MLA queries and keys: the model's YaRN
//! settings in the kernels' terms (DeepSeek's YaRN, transformers'
//! `_compute_yarn_parameters`, lives in the backend's RoPE table), plus YaRN's
//! softmax-scale correction.

use dcpserve_kernels::{yarn_mscale, RopeScalingKind, YarnParams};

use crate::config::{MlaConfig, YarnScaling};

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

/// The RoPE scaling of the rope dimensions (the table already multiplies by YaRN's
/// attention factor).
pub fn rope_scaling(mla: &MlaConfig) -> RopeScalingKind {
    match &mla.yarn {
        None => RopeScalingKind::None,
        Some(y) => RopeScalingKind::Yarn(yarn_params(y)),
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
