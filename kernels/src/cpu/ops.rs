//! Element-wise and row-wise operations: RMSNorm, SwiGLU, residual adds, softmax, RoPE.

use crate::backend::RopeScalingKind;
use crate::error::{check_len, KernelError};

/// RMSNorm over rows of length `weight.len()`: `out = x / sqrt(mean(x²) + eps) · weight`.
/// `x` may hold many rows; `out.len() == x.len()`.
///
/// ```
/// use dcpserve_kernels::rms_norm;
/// let mut out = [0.0; 2];
/// rms_norm(&[3.0, 4.0], &[1.0, 1.0], 0.0, &mut out).unwrap();
/// assert!((out[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6);
/// ```
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), KernelError> {
    let d = weight.len();
    check_len("rms_norm out", x.len(), out.len())?;
    check_rows("rms_norm x", x.len(), d)?;
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let s = inv_rms(xr, eps);
        for ((o, v), w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * s * w;
        }
    }
    Ok(())
}

/// In-place [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) -> Result<(), KernelError> {
    let d = weight.len();
    check_rows("rms_norm x", x.len(), d)?;
    for xr in x.chunks_exact_mut(d) {
        let s = inv_rms(xr, eps);
        for (v, w) in xr.iter_mut().zip(weight) {
            *v = *v * s * w;
        }
    }
    Ok(())
}

fn check_rows(what: &'static str, len: usize, d: usize) -> Result<(), KernelError> {
    if d == 0 || !len.is_multiple_of(d) {
        return Err(KernelError::Shape(format!(
            "{what}: length {len} is not a multiple of {d}"
        )));
    }
    Ok(())
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    // f64 accumulation: cheap at these sizes and avoids drift for long rows.
    let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// SwiGLU activation: `out = silu(gate) · up`, with `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("silu_mul up", gate.len(), up.len())?;
    check_len("silu_mul out", gate.len(), out.len())?;
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
}

/// `a += b` element-wise (residual connections).
pub fn add_inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
    check_len("add_inplace b", a.len(), b.len())?;
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
    Ok(())
}

/// Adds `bias` to every row of `x` (rows of length `bias.len()`).
pub fn add_bias(x: &mut [f32], bias: &[f32]) -> Result<(), KernelError> {
    check_rows("add_bias x", x.len(), bias.len())?;
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
    Ok(())
}

/// Numerically stable in-place softmax of one vector (empty input is a no-op;
/// all `-inf` input becomes all zeros).
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Numerically stable log-softmax: `logits − max − ln Σ exp(logits − max)`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![f32::NEG_INFINITY; logits.len()];
    }
    let sum: f64 = logits.iter().map(|v| ((v - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    logits.iter().map(|v| v - lse).collect()
}

/// Precomputed RoPE cos/sin tables.
///
/// ```
/// use dcpserve_kernels::{RopeScalingKind, RopeTable};
/// let rope = RopeTable::new(4, 10000.0, RopeScalingKind::None, 16);
/// let mut q = [1.0, 0.0, 0.0, 0.0];
/// rope.apply(&mut q, 1, 0, false).unwrap(); // position 0 is the identity
/// assert_eq!(q, [1.0, 0.0, 0.0, 0.0]);
/// ```
#[derive(Debug, Clone)]
pub struct RopeTable {
    head_dim: usize,
    inv_freq: Vec<f32>,
    /// Scale of cos/sin (YaRN's attention factor; 1 otherwise).
    attention_factor: f32,
    cos: Vec<f32>,
    sin: Vec<f32>,
    max_positions: usize,
}

impl RopeTable {
    /// Builds the table for positions `0..max_positions`; later positions are computed
    /// on the fly. `head_dim` should be even (an odd last element is left unrotated).
    pub fn new(
        head_dim: usize,
        theta: f32,
        scaling: RopeScalingKind,
        max_positions: usize,
    ) -> Self {
        let half = head_dim / 2;
        // Like torch: base ** (arange(0, d, 2).float() / d), all in f32.
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut inv_freq: Vec<f32> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        let mut attention_factor = 1.0;
        match scaling {
            RopeScalingKind::None => {}
            RopeScalingKind::Yarn(yarn) => {
                (inv_freq, attention_factor) = yarn.inv_freq(&pos_freqs, head_dim, theta);
            }
            RopeScalingKind::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScalingKind::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                // transformers `_compute_llama3_parameters`.
                let old = original_max_position_embeddings as f32;
                let low_freq_wavelen = old / low_freq_factor;
                let high_freq_wavelen = old / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let llama = if wavelen > low_freq_wavelen {
                        *f / factor
                    } else {
                        *f
                    };
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
                    let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    *f = if is_medium { smoothed } else { llama };
                }
            }
        }
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in &inv_freq {
                let (s, c) = angle(p, f);
                cos.push(c * attention_factor);
                sin.push(s * attention_factor);
            }
        }
        RopeTable {
            head_dim,
            inv_freq,
            attention_factor,
            cos,
            sin,
            max_positions,
        }
    }

    /// Head dimension the table was built for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The (scaled) inverse frequencies, one per rotated pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Positions the cos/sin tables cover (later ones are computed on the fly).
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The factor cos and sin are scaled by (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        self.attention_factor
    }

    /// The precomputed `(cos, sin)` tables, `[max_positions, head_dim / 2]` each, scaled
    /// by the attention factor (a device backend uploads them).
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// Rotates `x` = `[n_heads, head_dim]` (one token) in place for position `pos`.
    /// `interleaved` rotates pairs `(2i, 2i+1)` (GGUF llama layout); otherwise pairs
    /// `(i, i + d/2)` (Hugging Face `rotate_half`).
    pub fn apply(
        &self,
        x: &mut [f32],
        n_heads: usize,
        pos: usize,
        interleaved: bool,
    ) -> Result<(), KernelError> {
        let d = self.head_dim;
        check_len("rope x", n_heads * d, x.len())?;
        self.with_cos_sin(pos, |cos, sin| {
            for head in x.chunks_exact_mut(d) {
                rotate(head, cos, sin, interleaved);
            }
        });
        Ok(())
    }

    /// Rotates the `head_dim`-wide vector at `offset` of every `stride`-wide row of `x`
    /// for position `pos` (MLA: the rope part of each head's query, or of the latent key).
    ///
    /// transformers' interleaved variant for DeepSeek rotates pairs (2i, 2i+1) and then
    /// de-interleaves the result; queries and keys get the same permutation, so their
    /// dot products (all attention ever uses) equal those of this in-place rotation.
    ///
    /// ```
    /// use dcpserve_kernels::{RopeScalingKind, RopeTable};
    /// let rope = RopeTable::new(2, 10000.0, RopeScalingKind::None, 4);
    /// let mut rows = [9.0, 1.0, 0.0, 9.0, 1.0, 0.0]; // two rows of 3, rope part at 1..3
    /// rope.apply_strided(&mut rows, 3, 1, 0, false).unwrap();
    /// assert_eq!(rows, [9.0, 1.0, 0.0, 9.0, 1.0, 0.0]);
    /// ```
    pub fn apply_strided(
        &self,
        x: &mut [f32],
        stride: usize,
        offset: usize,
        pos: usize,
        interleaved: bool,
    ) -> Result<(), KernelError> {
        let d = self.head_dim;
        if stride < offset + d || stride == 0 || !x.len().is_multiple_of(stride) {
            return Err(KernelError::Shape(format!(
                "rope: vectors of {d} at offset {offset} do not fit rows of {stride} (len {})",
                x.len()
            )));
        }
        self.with_cos_sin(pos, |cos, sin| {
            for row in x.chunks_exact_mut(stride) {
                rotate(&mut row[offset..offset + d], cos, sin, interleaved);
            }
        });
        Ok(())
    }

    /// Calls `f(cos, sin)` with the (scaled) tables of position `pos`, computed on the
    /// fly beyond the precomputed range.
    #[inline]
    fn with_cos_sin<R>(&self, pos: usize, f: impl FnOnce(&[f32], &[f32]) -> R) -> R {
        let half = self.head_dim / 2;
        if pos < self.max_positions {
            return f(
                &self.cos[pos * half..(pos + 1) * half],
                &self.sin[pos * half..(pos + 1) * half],
            );
        }
        let af = self.attention_factor;
        let (mut cbuf, mut sbuf) = ([0.0f32; 256], [0.0f32; 256]);
        if half <= cbuf.len() {
            // Beyond the table: compute on the fly, on the stack.
            for (i, &fr) in self.inv_freq.iter().enumerate() {
                let (s, c) = angle(pos, fr);
                (sbuf[i], cbuf[i]) = (s * af, c * af);
            }
            return f(&cbuf[..half], &sbuf[..half]);
        }
        let (cos, sin): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|&fr| angle(pos, fr))
            .map(|(s, c)| (c * af, s * af))
            .unzip();
        f(&cos, &sin)
    }
}

/// Rotates one vector: pairs `(2i, 2i+1)` when `interleaved`, else `(i, i + d/2)`.
#[inline(always)]
fn rotate(v: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = v.len() / 2;
    for i in 0..half {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0 * cos[i] - x1 * sin[i];
        v[b] = x1 * cos[i] + x0 * sin[i];
    }
}

/// `(sin, cos)` of `pos · inv_freq`, the product rounded to f32 like torch.
fn angle(pos: usize, inv_freq: f32) -> (f32, f32) {
    let a = (pos as f32 * inv_freq) as f64;
    (a.sin() as f32, a.cos() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_and_elementwise() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, 0.5];
        let w = [1.0, 2.0, 0.5];
        let mut out = [0.0; 6];
        rms_norm(&x, &w, 1e-5, &mut out).unwrap();
        let r = 1.0 / ((1.0f32 + 4.0 + 9.0) / 3.0 + 1e-5).sqrt();
        assert!((out[1] - 2.0 * r * 2.0).abs() < 1e-6);
        let mut y = x;
        rms_norm_inplace(&mut y, &w, 1e-5).unwrap();
        assert_eq!(y, out);
        assert!(rms_norm(&x[..5], &w, 1e-5, &mut out[..5]).is_err());

        let mut o = [0.0; 2];
        silu_mul(&[0.0, 1.0], &[3.0, 2.0], &mut o).unwrap();
        assert_eq!(o[0], 0.0);
        assert!((o[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        let mut a = [1.0, 2.0, 3.0, 4.0];
        add_bias(&mut a, &[1.0, -1.0]).unwrap();
        assert_eq!(a, [2.0, 1.0, 4.0, 3.0]);
        add_inplace(&mut a, &[1.0; 4]).unwrap();
        assert_eq!(a, [3.0, 2.0, 5.0, 4.0]);
    }

    #[test]
    fn softmaxes_are_stable() {
        let mut s = [1000.0, 1000.0, f32::NEG_INFINITY];
        softmax_inplace(&mut s);
        assert_eq!(s, [0.5, 0.5, 0.0]);
        let l = log_softmax(&[1000.0, 1000.0]);
        assert!((l[0] + std::f32::consts::LN_2).abs() < 1e-4);
        let mut e = [f32::NEG_INFINITY; 2];
        softmax_inplace(&mut e);
        assert_eq!(e, [0.0, 0.0]);
    }

    #[test]
    fn rope_matches_rotation_and_handles_far_positions() {
        let d = 8;
        let t = RopeTable::new(d, 10000.0, RopeScalingKind::None, 4);
        let x: Vec<f32> = (0..2 * d).map(|i| i as f32 * 0.1 - 0.3).collect();
        for interleaved in [false, true] {
            let mut a = x.clone();
            t.apply(&mut a, 2, 3, interleaved).unwrap();
            let mut b = x.clone();
            t.apply(&mut b, 2, 1000, interleaved).unwrap(); // beyond the table
            for (h, chunk) in a.chunks(d).enumerate() {
                for i in 0..d / 2 {
                    let f = 1.0 / 10000f64.powf(2.0 * i as f64 / d as f64);
                    let (ia, ib) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + d / 2)
                    };
                    let (x0, x1) = (x[h * d + ia] as f64, x[h * d + ib] as f64);
                    let th = 3.0 * f;
                    assert!((chunk[ia] as f64 - (x0 * th.cos() - x1 * th.sin())).abs() < 1e-5);
                    assert!((chunk[ib] as f64 - (x1 * th.cos() + x0 * th.sin())).abs() < 1e-5);
                    let th = 1000.0 * f;
                    assert!((b[h * d + ia] as f64 - (x0 * th.cos() - x1 * th.sin())).abs() < 1e-3);
                }
            }
        }
    }

    #[test]
    fn llama3_scaling_matches_transformers() {
        // Values from transformers' _compute_llama3_parameters for Llama 3.1 settings
        // (head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192):
        // the highest frequency is unchanged, the lowest is divided by 8.
        let s = RopeScalingKind::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = RopeTable::new(128, 500000.0, RopeScalingKind::None, 1);
        let t = RopeTable::new(128, 500000.0, s, 1);
        assert_eq!(t.inv_freq()[0], plain.inv_freq()[0]);
        assert_eq!(t.inv_freq()[63], plain.inv_freq()[63] / 8.0);
        // A medium frequency is interpolated strictly between the two.
        let i = (0..64)
            .find(|&i| {
                let w = 2.0 * std::f32::consts::PI / plain.inv_freq()[i];
                w > 8192.0 / 4.0 && w < 8192.0
            })
            .unwrap();
        assert!(
            t.inv_freq()[i] < plain.inv_freq()[i] && t.inv_freq()[i] > plain.inv_freq()[i] / 8.0
        );
        let lin = RopeTable::new(128, 500000.0, RopeScalingKind::Linear { factor: 2.0 }, 1);
        assert_eq!(lin.inv_freq()[5], plain.inv_freq()[5] / 2.0);
    }
}
