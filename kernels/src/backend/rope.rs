//! How RoPE frequencies are scaled ([`RopeScalingKind`], Hugging Face `rope_scaling`):
//! what a backend's [`rope_table`](super::WeightStorage::rope_table) is asked for, and
//! YaRN's blended frequencies, which every backend's table starts from.

/// RoPE frequency scaling, mirroring Hugging Face `rope_scaling`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScalingKind {
    /// Plain RoPE.
    #[default]
    None,
    /// Linear position interpolation: frequencies divided by `factor`.
    Linear {
        /// Scaling factor.
        factor: f32,
    },
    /// Llama 3 frequency-dependent scaling.
    Llama3 {
        /// Scaling factor.
        factor: f32,
        /// Low-frequency factor.
        low_freq_factor: f32,
        /// High-frequency factor.
        high_freq_factor: f32,
        /// Context length of the original model.
        original_max_position_embeddings: usize,
    },
    /// YaRN (transformers' `_compute_yarn_parameters`), as DeepSeek's latent attention
    /// uses it: blended frequencies and cos/sin scaled by the attention factor.
    Yarn(YarnParams),
}

/// YaRN parameters as Hugging Face `rope_scaling` names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnParams {
    /// Context extension factor.
    pub factor: f32,
    /// Context length of the original model.
    pub original_max_position_embeddings: usize,
    /// High-frequency boundary, in rotations.
    pub beta_fast: f32,
    /// Low-frequency boundary, in rotations.
    pub beta_slow: f32,
    /// `mscale`.
    pub mscale: Option<f32>,
    /// `mscale_all_dim`.
    pub mscale_all_dim: Option<f32>,
    /// Explicit cos/sin scale; derived from the mscales when absent.
    pub attention_factor: Option<f32>,
    /// Round the correction range to whole dimensions (transformers' default).
    pub truncate: bool,
}

/// transformers' `yarn_get_mscale`: `0.1 · mscale · ln(scale) + 1` for `scale > 1`.
pub fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl YarnParams {
    /// The blended inverse frequencies (from `pos_freqs = theta^(2i/dim)`) and the
    /// cos/sin attention factor.
    pub(crate) fn inv_freq(&self, pos_freqs: &[f32], dim: usize, theta: f32) -> (Vec<f32>, f32) {
        let factor = self.factor;
        let attention_factor =
            self.attention_factor
                .unwrap_or_else(|| match (self.mscale, self.mscale_all_dim) {
                    (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, ma)
                    }
                    _ => yarn_mscale(factor, 1.0),
                });
        let (base, d) = (theta as f64, dim as f64);
        let original = self.original_max_position_embeddings as f64;
        let correction_dim = |rotations: f64| {
            d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (mut low, mut high) = (
            correction_dim(self.beta_fast as f64),
            correction_dim(self.beta_slow as f64),
        );
        if self.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let mut high = high.min(d - 1.0);
        if low == high {
            high += 0.001; // transformers: prevent a singular ramp
        }
        let inv = pos_freqs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                let interpolation = 1.0 / (factor * p);
                let extrapolation = 1.0 / p;
                interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
            })
            .collect();
        (inv, attention_factor)
    }
}
