//! Decode and small-batch (`m ≤` [`SMALL_M`]) int8 products with Q4_K, Q5_K and Q6_K
//! weights, fused: no transcoding of weight rows. As llama.cpp does with its Q8_K
//! activations, each activation row is quantized once per product into 256-element
//! blocks (one per weight super-block): an f32 scale `dx = amax/127`, 256 int8 values
//! and the sum of every 16 values as i16 ([`ActsK`]). Then per weight super-block the
//! kernel unpacks the codes in registers and takes integer dot products against the
//! activation block (`vpmaddubsw` on AVX2, `vpdpbusd` with AVX-VNNI or AVX-512 VNNI),
//! each sub-block's product times its integer scale, summed exactly in i32:
//!
//! * Q4_K / Q5_K (`w = d·sc·q − dmin·mn` per 32): `dx·(d·Σ sc·Σq·qx − dmin·Σ mn·Σqx)`,
//!   the `Σqx` per 32 from the block sums;
//! * Q6_K (`w = d·sc·(q − 32)` per 16): `dx·d·(Σ sc·Σq·qx − 32·Σ sc·Σqx)`.
//!
//! The f32 work is two fused multiply-adds per super-block and activation row.
//!
//! Accuracy: the activation rounding is per 256 elements (as llama.cpp's Q8_K), coarser
//! than the per-32 blocks of the other int8 kernels: each value moves by at most
//! `amax_256/254`. Larger batches keep the transcoding kernels (`kquant_avx2.rs`),
//! where the per-row transcode cost is shared by many activation rows.

use std::cell::RefCell;

use super::Int8Isa;
use crate::pool::ThreadPool;
use crate::quant::WeightFormat;
use crate::weights::WeightMatrix;

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod scales;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Largest `m` on the fused kernels (as the f32 path's fused small-m kernels).
pub(crate) const SMALL_M: usize = 4;
/// Elements per activation block and weight super-block.
pub(crate) const QK_K: usize = 256;

/// Whether [`matmul`] handles `format` at batch size `m` (x86 only: the int8 path has no
/// other kernels).
pub(crate) fn applies(format: WeightFormat, m: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && m <= SMALL_M
        && matches!(
            format,
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
        )
}

/// Activation rows quantized per 256 elements, reused across calls.
#[derive(Default)]
pub(crate) struct ActsK {
    /// int8 values, `[m, k]`.
    pub(crate) q: Vec<i8>,
    /// One scale per block, `[m, k/256]`.
    pub(crate) d: Vec<f32>,
    /// Sum of each 16 values, `[m, k/16]`.
    pub(crate) bsums: Vec<i16>,
}

impl ActsK {
    /// Quantizes the `m` rows of `x` (`k` values each, `k` a multiple of 256).
    pub(crate) fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        self.q.resize(m * k, 0);
        self.d.resize(m * k / QK_K, 0.0);
        self.bsums.resize(m * k / 16, 0);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            unsafe { quantize_avx2(x, &mut self.q, &mut self.d, &mut self.bsums) };
            return;
        }
        quantize_blocks(x, &mut self.q, &mut self.d, &mut self.bsums);
    }
}

/// [`quantize_blocks`] compiled for AVX2 (the loops vectorize).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    quantize_blocks(x, q, d, bsums)
}

/// Each 256 values of `x`: `dx = amax/127`, `q = round_half_even(x·127/amax)` (so
/// `|q| ≤ 127`), and the i16 sum of every 16 `q`.
#[inline(always)]
fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    for (b, blk) in x.chunks_exact(QK_K).enumerate() {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        // NaN when the block holds a NaN or an infinity, so that it reaches the output.
        let nonfinite: f32 = blk.iter().map(|v| v * 0.0).sum();
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        d[b] = amax / 127.0 + nonfinite;
        let qb = &mut q[b * QK_K..(b + 1) * QK_K];
        for (o, v) in qb.iter_mut().zip(blk) {
            *o = (v * id).round_ties_even() as i32 as i8;
        }
        for (s, g) in bsums[b * 16..(b + 1) * 16]
            .iter_mut()
            .zip(qb.chunks_exact(16))
        {
            *s = g.iter().map(|&v| v as i16).sum();
        }
    }
}

thread_local! {
    /// The calling thread's quantized activations.
    static ACTS_K: RefCell<ActsK> = RefCell::new(ActsK::default());
}

/// `out[m, n] = x[m, k] · wᵀ` with per-256 int8 activations on `isa`.
///
/// The caller ([`super::matmul_int8`]) checked the lengths, `isa`'s availability, that
/// [`applies`] holds and that `m, n, k > 0`; `k` is a multiple of 256 for these formats.
pub(crate) fn matmul(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
    isa: Int8Isa,
) {
    let (n, k) = (w.rows(), w.cols());
    debug_assert!(applies(w.format(), m) && k % QK_K == 0);
    ACTS_K.with(|a| {
        let mut fresh = ActsK::default();
        let mut guard = a.try_borrow_mut();
        let acts = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut fresh,
        };
        acts.quantize(x, m, k);
        let acts = &*acts;
        let threads = pool.n_threads();
        // Enough tasks for load balance, few enough to keep dispatch cheap.
        let rows_per = n.div_ceil(threads * 8).max(16).next_multiple_of(4);
        let outp = super::SendPtr(out.as_mut_ptr());
        pool.run(n.div_ceil(rows_per), |t| {
            let (n0, n1) = (t * rows_per, ((t + 1) * rows_per).min(n));
            let _ = (n0, n1, outp, acts, isa);
            // SAFETY: `isa` is available (checked by the caller); each task writes only
            // columns n0..n1 of the `[m, n]` output; `acts` holds m rows of k values.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                x86::task(isa, acts, m, w, outp.ptr(), n0, n1)
            };
        });
    });
}
