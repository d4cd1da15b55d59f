//! RoPE for the `qk_rope_head_dim` part of MLA queries and keys, with DeepSeek's YaRN
//! (transformers' `_compute_yarn_parameters`) and its softmax-scale correction.

use crate::config::{MlaConfig, YarnScaling};
use crate::error::ModelError;

/// transformers' `yarn_get_mscale`.
fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Cos/sin tables of the rope dimensions, already multiplied by YaRN's attention factor.
pub struct MlaRope {
    dim: usize,
    interleaved: bool,
    inv_freq: Vec<f32>,
    attention_factor: f32,
    cos: Vec<f32>,
    sin: Vec<f32>,
    max_positions: usize,
}

impl MlaRope {
    /// Tables for positions `0..max_positions` (later positions are computed on the fly).
    pub fn new(mla: &MlaConfig, theta: f32, max_positions: usize) -> Self {
        let dim = mla.qk_rope_head_dim;
        // Like torch: base ** (arange(0, d, 2).float() / d) in f32.
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        let (inv_freq, attention_factor) = match &mla.yarn {
            None => (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0),
            Some(y) => yarn_inv_freq(y, &pos_freqs, dim, theta),
        };
        let half = dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in &inv_freq {
                let (s, c) = angle(p, f);
                cos.push(c * attention_factor);
                sin.push(s * attention_factor);
            }
        }
        Self {
            dim,
            interleaved: mla.rope_interleave,
            inv_freq,
            attention_factor,
            cos,
            sin,
            max_positions,
        }
    }

    /// Rotates each `dim`-wide vector `x[stride·k + offset ..][..dim]` for position `pos`.
    ///
    /// transformers' interleaved variant rotates pairs (2i, 2i+1) and then de-interleaves
    /// the result; queries and keys get the same permutation, so their dot products (all
    /// attention ever uses) equal those of this in-place rotation.
    pub fn apply(
        &self,
        x: &mut [f32],
        stride: usize,
        offset: usize,
        pos: usize,
    ) -> Result<(), ModelError> {
        let (d, half) = (self.dim, self.dim / 2);
        if stride < offset + d || !x.len().is_multiple_of(stride) {
            return Err(ModelError::Invalid(format!(
                "rope: vectors of {d} at offset {offset} do not fit rows of {stride} (len {})",
                x.len()
            )));
        }
        let computed: (Vec<f32>, Vec<f32>);
        let (cos, sin): (&[f32], &[f32]) = if pos < self.max_positions {
            (
                &self.cos[pos * half..(pos + 1) * half],
                &self.sin[pos * half..(pos + 1) * half],
            )
        } else {
            computed = self
                .inv_freq
                .iter()
                .map(|&f| {
                    let (s, c) = angle(pos, f);
                    (c * self.attention_factor, s * self.attention_factor)
                })
                .unzip();
            (&computed.0, &computed.1)
        };
        for row in x.chunks_exact_mut(stride) {
            let v = &mut row[offset..offset + d];
            for i in 0..half {
                let (a, b) = if self.interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (x0, x1) = (v[a], v[b]);
                v[a] = x0 * cos[i] - x1 * sin[i];
                v[b] = x1 * cos[i] + x0 * sin[i];
            }
        }
        Ok(())
    }
}

/// `(sin, cos)` of `pos · inv_freq`, the product rounded to f32 like torch.
fn angle(pos: usize, inv_freq: f32) -> (f32, f32) {
    let a = (pos as f32 * inv_freq) as f64;
    (a.sin() as f32, a.cos() as f32)
}

/// YaRN's blended inverse frequencies and cos/sin attention factor.
fn yarn_inv_freq(y: &YarnScaling, pos_freqs: &[f32], dim: usize, theta: f32) -> (Vec<f32>, f32) {
    let factor = y.factor;
    let attention_factor =
        y.attention_factor
            .unwrap_or_else(|| match (y.mscale, y.mscale_all_dim) {
                (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, ma)
                }
                _ => yarn_mscale(factor, 1.0),
            });
    let (base, d) = (theta as f64, dim as f64);
    let original = y.original_max_position_embeddings as f64;
    let correction_dim = |rotations: f64| {
        d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (
        correction_dim(y.beta_fast as f64),
        correction_dim(y.beta_slow as f64),
    );
    if y.truncate {
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
