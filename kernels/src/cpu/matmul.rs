//! `out = x · wᵀ` for f32 activations and weights in any [`WeightFormat`].
//!
//! Two strategies (AVX-512 and AVX2 + FMA, in `avx2.rs`, NEON on aarch64 in `neon.rs`,
//! with a scalar fallback of the same structure; the level from [`crate::cpu::isa`]):
//! * small `m` (decode): each 4-row group of `w` is decoded on the fly inside the
//!   dot-product micro-kernel, so weights stream from memory exactly once;
//! * larger `m`: each thread decodes a panel of 16 weight rows into a thread-local f32
//!   scratch buffer once per 64-row chunk of `x`, then runs a 4×4 register-tiled
//!   dot-product micro-kernel over it (16 zmm accumulators along K).
//!
//! Work is split over output columns (rows of `w`) and, for large `m`, over `m` too.

use crate::cpu::CpuIsa;
use crate::error::{check_len, KernelError};
use crate::pool::ThreadPool;
use crate::quant::{dequantize_scalar, WeightFormat};
use crate::weights::WeightMatrix;
use std::cell::RefCell;

/// Largest `m` that uses the fused decode-while-multiplying path.
const SMALL_M: usize = 4;
/// Weight rows decoded per panel in the blocked path.
const NB: usize = 16;
/// Rows of `x` per task chunk in the blocked path (keeps the chunk in L2).
const MC: usize = 64;

/// Accumulation precision of [`matmul_with_precision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 products and f32 accumulation (the default, test-exact path).
    #[default]
    Exact,
    /// Allows `vdpbf16ps` for BF16 weights: activations are rounded to bf16.
    Fast,
}

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// bf16 copies of the activation chunk and weight panel for [`Precision::Fast`].
    static BF16_BUFS: RefCell<(Vec<u16>, Vec<u16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// A task's rows of x, transposed, for the AVX2 blocked kernel (`avx2_gemm`).
    static X_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: tasks write disjoint regions of the output.
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

/// Computes `out[m, w.rows()] = x[m, w.cols()] · wᵀ` on `pool`.
///
/// ```
/// use dcpserve_kernels::{matmul, ThreadPool, WeightMatrix};
/// let pool = ThreadPool::new(2);
/// let w = WeightMatrix::from_f32(2, 3, vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
/// let mut out = [0.0; 2];
/// matmul(&pool, &[1.0, 2.0, 3.0], 1, &w, &mut out).unwrap();
/// assert_eq!(out, [1.0, 6.0]);
/// ```
pub fn matmul(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_impl(pool, x, m, w, out, crate::cpu::isa(), Precision::Exact)
}

/// [`matmul`] that may trade precision for speed (see [`Precision::Fast`]).
pub fn matmul_with_precision(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matmul_impl(pool, x, m, w, out, crate::cpu::isa(), precision)
}

/// Shorthand for [`matmul_with_precision`] with [`Precision::Fast`].
pub fn matmul_fast(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_with_precision(pool, x, m, w, out, Precision::Fast)
}

pub(crate) fn matmul_impl(
    pool: &ThreadPool,
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: &mut [f32],
    isa: CpuIsa,
    precision: Precision,
) -> Result<(), KernelError> {
    debug_assert!(isa <= crate::cpu::features().best_isa());
    let (n, k) = (w.rows(), w.cols());
    check_len("matmul x", m * k, x.len())?;
    check_len("matmul out", m * n, out.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let threads = pool.n_threads();
    let outp = SyncPtr(out.as_mut_ptr());
    let fast_bf16 =
        precision == Precision::Fast && isa == CpuIsa::Avx512 && crate::cpu::features().avx512bf16;
    // Small m is memory-bound: the exact fused path is as fast as any other.
    if m <= SMALL_M {
        // Enough tasks for load balance, few enough to keep dispatch cheap.
        let rows_per = n.div_ceil(threads * 8).max(16).next_multiple_of(4);
        let n_tasks = n.div_ceil(rows_per);
        pool.run(n_tasks, |t| {
            let n0 = t * rows_per;
            let n1 = (n0 + rows_per).min(n);
            // SAFETY: each task writes only columns n0..n1 of `out`.
            unsafe { small_m_task(x, m, w, outp, n0, n1, isa) };
        });
        return Ok(());
    }
    // (Larger chunks for the AVX2 kernel, which packs x per task, measured slower.)
    let mc = MC;
    let m_chunks = m.div_ceil(mc);
    let n_panels = n.div_ceil(NB);
    let n_chunks = (threads * 4).div_ceil(m_chunks).clamp(1, n_panels);
    let panels_per = n_panels.div_ceil(n_chunks);
    let n_chunks = n_panels.div_ceil(panels_per);
    pool.run(m_chunks * n_chunks, |t| {
        let (mc_i, nc) = (t % m_chunks, t / m_chunks);
        let (m0, m1) = (mc_i * mc, ((mc_i + 1) * mc).min(m));
        let (n0, n1) = (nc * panels_per * NB, ((nc + 1) * panels_per * NB).min(n));
        // SAFETY: each task writes only rows m0..m1, columns n0..n1 of `out`.
        unsafe { blocked_task(x, m0, m1, w, outp, n0, n1, isa, fast_bf16) };
    });
    Ok(())
}

/// # Safety
/// `out` points to an `[m, w.rows()]` buffer; no other task writes columns `n0..n1`;
/// the CPU supports `isa`.
unsafe fn small_m_task(
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: SyncPtr,
    n0: usize,
    n1: usize,
    isa: CpuIsa,
) {
    let (n, k) = (w.rows(), w.cols());
    // Q5_0/Q5_1 have fused SIMD decoders; the other extra formats decode panels.
    let simd = isa != CpuIsa::Scalar;
    let fused = !WeightFormat::EXTRA_QUANTS.contains(&w.format())
        || (simd && matches!(w.format(), WeightFormat::Q5_0 | WeightFormat::Q5_1));
    if !fused {
        decoded_small_m_task(x, m, w, out, n0, n1, isa);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == CpuIsa::Avx2 {
        avx2::small_m(
            x.as_ptr(),
            m,
            w.format(),
            w.base_ptr(),
            w.row_stride(),
            k,
            out.0,
            n,
            n0,
            n1,
        );
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == CpuIsa::Neon {
        neon::small_m(
            x.as_ptr(),
            m,
            w.format(),
            w.base_ptr(),
            w.row_stride(),
            k,
            out.0,
            n,
            n0,
            n1,
        );
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == CpuIsa::Avx512 {
        avx::small_m(
            x.as_ptr(),
            m,
            w.format(),
            w.base_ptr(),
            w.row_stride(),
            k,
            out.0,
            n,
            n0,
            n1,
        );
        return;
    }
    PANEL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < k {
            p.resize(k, 0.0);
        }
        for j in n0..n1 {
            let row = &mut p[..k];
            dequantize_scalar(w.format(), w.row_bytes(j).unwrap_or_default(), row);
            for i in 0..m {
                *out.0.add(i * n + j) = dot_scalar(&x[i * k..(i + 1) * k], row);
            }
        }
    });
}

/// [`small_m_task`] for the formats without a fused SIMD decoder (the 5-bit, K-quant
/// and IQ4 types): each panel of [`NB`] weight rows is decoded once to f32, then
/// multiplied by all `m` rows of `x`.
///
/// # Safety
/// As [`small_m_task`].
unsafe fn decoded_small_m_task(
    x: &[f32],
    m: usize,
    w: &WeightMatrix,
    out: SyncPtr,
    n0: usize,
    n1: usize,
    isa: CpuIsa,
) {
    let (n, k) = (w.rows(), w.cols());
    PANEL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < NB * k {
            p.resize(NB * k, 0.0);
        }
        let mut pn0 = n0;
        while pn0 < n1 {
            let pn = NB.min(n1 - pn0);
            for r in 0..pn {
                prefetch_row(w, pn0 + r + PREFETCH_ROWS);
                let row = &mut p[r * k..(r + 1) * k];
                dequantize_scalar(w.format(), w.row_bytes(pn0 + r).unwrap_or_default(), row);
            }
            #[cfg(target_arch = "aarch64")]
            if isa == CpuIsa::Neon {
                let pp = p.as_ptr() as *const u8;
                neon::panel_f32(x.as_ptr(), 0, m, k, pp, k * 4, pn, out.0.add(pn0), n);
                pn0 += pn;
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if isa >= CpuIsa::Avx2 {
                let pp = p.as_ptr() as *const u8;
                if isa == CpuIsa::Avx512 {
                    avx::panel_f32(x.as_ptr(), 0, m, k, pp, k * 4, pn, out.0.add(pn0), n);
                } else {
                    avx2::panel_f32(x.as_ptr(), 0, m, k, pp, k * 4, pn, out.0.add(pn0), n);
                }
                pn0 += pn;
                continue;
            }
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for r in 0..pn {
                    *out.0.add(i * n + pn0 + r) = dot_scalar(xr, &p[r * k..(r + 1) * k]);
                }
            }
            pn0 += pn;
        }
    });
}

/// # Safety
/// As [`small_m_task`], for rows `m0..m1` and columns `n0..n1`.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked_task(
    x: &[f32],
    m0: usize,
    m1: usize,
    w: &WeightMatrix,
    out: SyncPtr,
    n0: usize,
    n1: usize,
    isa: CpuIsa,
    fast_bf16: bool,
) {
    let (n, k) = (w.rows(), w.cols());
    PANEL.with(|p| {
        let mut p = p.borrow_mut();
        let need = NB * k;
        if p.len() < need {
            p.resize(need, 0.0);
        }
        let mut pn0 = n0;
        while pn0 < n1 {
            let pn = NB.min(n1 - pn0);
            #[cfg(target_arch = "aarch64")]
            if isa == CpuIsa::Neon {
                neon::blocked_panel(x.as_ptr(), m0, m1, w, pn0, pn, out.0.add(pn0), n, &mut p);
                pn0 += pn;
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if isa >= CpuIsa::Avx2 {
                if fast_bf16 {
                    BF16_BUFS.with(|b| {
                        let (xb, wb) = &mut *b.borrow_mut();
                        avx::bf16_panel(
                            x.as_ptr(),
                            m0,
                            m1,
                            k,
                            w,
                            pn0,
                            pn,
                            out.0,
                            n,
                            &mut p,
                            xb,
                            wb,
                            pn0 == n0,
                        );
                    });
                } else {
                    let (wp, ws) = if w.format() == WeightFormat::F32 {
                        (w.base_ptr().add(pn0 * w.row_stride()), w.row_stride())
                    } else {
                        for r in 0..pn {
                            let (src, dst) = (
                                w.base_ptr().add((pn0 + r) * w.row_stride()),
                                p.as_mut_ptr().add(r * k),
                            );
                            if isa == CpuIsa::Avx512 {
                                crate::quant::simd::dequant_row(w.format(), src, k, dst);
                            } else {
                                crate::quant::avx2::dequant_row(w.format(), src, k, dst);
                            }
                        }
                        (p.as_ptr() as *const u8, k * 4)
                    };
                    if isa == CpuIsa::Avx512 {
                        avx::panel_f32(x.as_ptr(), m0, m1, k, wp, ws, pn, out.0.add(pn0), n);
                    } else {
                        X_T.with(|xt| {
                            let mut xt = xt.borrow_mut();
                            // x's rows are packed once per task, for all its panels.
                            if pn0 == n0 {
                                avx2_gemm::pack_x_t(x, m0, m1, k, &mut xt);
                            }
                            let mp = (m1 - m0).next_multiple_of(16);
                            let o = out.0.add(m0 * n + pn0);
                            avx2_gemm::panel_t(&xt, mp, m1 - m0, k, wp, ws, pn, o, n);
                        });
                    }
                }
                pn0 += pn;
                continue;
            }
            let _ = fast_bf16;
            for r in 0..pn {
                dequantize_scalar(
                    w.format(),
                    w.row_bytes(pn0 + r).unwrap_or_default(),
                    &mut p[r * k..(r + 1) * k],
                );
            }
            for i in m0..m1 {
                let xr = &x[i * k..(i + 1) * k];
                for r in 0..pn {
                    *out.0.add(i * n + pn0 + r) = dot_scalar(xr, &p[r * k..(r + 1) * k]);
                }
            }
            pn0 += pn;
        }
    });
}

/// Dot product with 8 independent accumulators (vectorizes, bounded rounding error).
fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    acc.iter().sum::<f32>() + s
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx {
    //! AVX-512 micro-kernels.
    use crate::quant::simd::{
        load16_bf16, load16_f16, q4_0_block, q4_1_block, q5_block, q8_0_block,
    };
    use crate::quant::WeightFormat;
    use std::arch::x86_64::*;

    use super::PREFETCH_ROWS;
    const F32: u8 = 0;
    const F16: u8 = 1;
    const BF16: u8 = 2;
    const Q8_0: u8 = 3;
    const Q4_0: u8 = 4;
    const Q4_1: u8 = 5;
    const Q5_0: u8 = 6;
    const Q5_1: u8 = 7;

    /// Bytes per 32-element block of format `F`.
    const fn blk_bytes(f: u8) -> usize {
        match f {
            F32 => 128,
            F16 | BF16 => 64,
            Q8_0 => 34,
            Q4_0 => 18,
            Q5_0 => 22,
            Q5_1 => 24,
            _ => 20,
        }
    }

    /// Decodes 32 elements (block `b`) of a row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn load_blk<const F: u8>(row: *const u8, b: usize) -> (__m512, __m512) {
        let p = row.add(b * blk_bytes(F));
        match F {
            F32 => (
                _mm512_loadu_ps(p as *const f32),
                _mm512_loadu_ps((p as *const f32).add(16)),
            ),
            F16 => (load16_f16(p), load16_f16(p.add(32))),
            BF16 => (load16_bf16(p), load16_bf16(p.add(32))),
            Q8_0 => q8_0_block(p),
            Q4_0 => q4_0_block(p),
            Q5_0 => q5_block::<false>(p),
            Q5_1 => q5_block::<true>(p),
            _ => q4_1_block(p),
        }
    }

    /// Decodes the last `rem` (< 32) elements of a float-format row, zero-padded.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn load_tail<const F: u8>(
        row: *const u8,
        b: usize,
        m0: __mmask16,
        m1: __mmask16,
    ) -> (__m512, __m512) {
        let p = row.add(b * blk_bytes(F));
        match F {
            F32 => (
                _mm512_maskz_loadu_ps(m0, p as *const f32),
                _mm512_maskz_loadu_ps(m1, (p as *const f32).add(16)),
            ),
            F16 => (
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, p as *const i16)),
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, p.add(32) as *const i16)),
            ),
            _ => {
                let c = |m, q: *const u8| {
                    let v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, q as *const i16));
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
                };
                (c(m0, p), c(m1, p.add(32)))
            }
        }
    }

    /// `MR × NR` tile of dot products over the full K, weights decoded on the fly.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const F: u8, const MR: usize, const NR: usize>(
        x: *const f32,
        xs: usize,
        w: *const u8,
        ws: usize,
        k: usize,
        out: *mut f32,
        os: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let nb = k / 32;
        for b in 0..nb {
            let mut wv = [(_mm512_setzero_ps(), _mm512_setzero_ps()); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = load_blk::<F>(w.add(r * ws), b);
            }
            // A one-row (decode) tile is bound by the weights' stream: prefetch the
            // same block of the rows a tile or two ahead.
            if MR == 1 {
                for r in 0..NR {
                    let p = w.wrapping_add((r + PREFETCH_ROWS) * ws + b * blk_bytes(F));
                    _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                }
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xp = x.add(i * xs + b * 32);
                let x0 = _mm512_loadu_ps(xp);
                let x1 = _mm512_loadu_ps(xp.add(16));
                for r in 0..NR {
                    a[r] = _mm512_fmadd_ps(wv[r].0, x0, a[r]);
                    a[r] = _mm512_fmadd_ps(wv[r].1, x1, a[r]);
                }
            }
        }
        let rem = k % 32;
        if rem != 0 {
            let m0: __mmask16 = ((1u32 << rem.min(16)) - 1) as u16;
            let m1: __mmask16 = ((1u32 << rem.saturating_sub(16)) - 1) as u16;
            let mut wv = [(_mm512_setzero_ps(), _mm512_setzero_ps()); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = load_tail::<F>(w.add(r * ws), nb, m0, m1);
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xp = x.add(i * xs + nb * 32);
                let x0 = _mm512_maskz_loadu_ps(m0, xp);
                let x1 = _mm512_maskz_loadu_ps(m1, xp.add(16));
                for r in 0..NR {
                    a[r] = _mm512_fmadd_ps(wv[r].0, x0, a[r]);
                    a[r] = _mm512_fmadd_ps(wv[r].1, x1, a[r]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            if NR == 4 {
                _mm_storeu_ps(out.add(i * os), hsum4(a[0], a[1], a[2], a[3]));
            } else {
                for (r, v) in a.iter().enumerate() {
                    *out.add(i * os + r) = _mm512_reduce_add_ps(*v);
                }
            }
        }
    }

    /// Horizontal sums of four vectors at once (shared shuffles, ~40% fewer ops
    /// than four separate reductions).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    pub(crate) unsafe fn hsum4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m128 {
        let half = |v: __m512| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            _mm256_add_ps(_mm512_castps512_ps256(v), hi)
        };
        let ab = _mm256_hadd_ps(half(a), half(b));
        let cd = _mm256_hadd_ps(half(c), half(d));
        let abcd = _mm256_hadd_ps(ab, cd);
        _mm_add_ps(
            _mm256_castps256_ps128(abcd),
            _mm256_extractf128_ps::<1>(abcd),
        )
    }

    /// Dispatches a tile with runtime `mr`, `nr` in 1..=4.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_dyn<const F: u8>(
        mr: usize,
        nr: usize,
        x: *const f32,
        xs: usize,
        w: *const u8,
        ws: usize,
        k: usize,
        out: *mut f32,
        os: usize,
    ) {
        macro_rules! go {
            ($($m:literal $n:literal),*) => {
                match (mr, nr) {
                    $(($m, $n) => tile::<F, $m, $n>(x, xs, w, ws, k, out, os),)*
                    _ => unreachable!("tile {mr}x{nr}"),
                }
            };
        }
        go!(1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 3 3, 3 4, 4 1, 4 2, 4 3, 4 4)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn small_m_f<const F: u8>(
        x: *const f32,
        m: usize,
        w: *const u8,
        ws: usize,
        k: usize,
        out: *mut f32,
        n: usize,
        n0: usize,
        n1: usize,
    ) {
        let mut j = n0;
        while j < n1 {
            let nr = 4.min(n1 - j);
            tile_dyn::<F>(m, nr, x, k, w.add(j * ws), ws, k, out.add(j), n);
            j += nr;
        }
    }

    /// Fused decode path for `m <= 4`, output columns `n0..n1`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn small_m(
        x: *const f32,
        m: usize,
        f: WeightFormat,
        w: *const u8,
        ws: usize,
        k: usize,
        out: *mut f32,
        n: usize,
        n0: usize,
        n1: usize,
    ) {
        match f {
            WeightFormat::F32 => small_m_f::<F32>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::F16 => small_m_f::<F16>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::BF16 => small_m_f::<BF16>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::Q8_0 => small_m_f::<Q8_0>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::Q4_0 => small_m_f::<Q4_0>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::Q4_1 => small_m_f::<Q4_1>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::Q5_0 => small_m_f::<Q5_0>(x, m, w, ws, k, out, n, n0, n1),
            WeightFormat::Q5_1 => small_m_f::<Q5_1>(x, m, w, ws, k, out, n, n0, n1),
            other => unreachable!("fused small-m matmul of {other:?}"),
        }
    }

    /// Rows `m0..m1` of `x` against a panel of `pn` f32 weight rows (`wp`, stride `ws`
    /// bytes); `out` points at column 0 of the panel, row stride `n`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panel_f32(
        x: *const f32,
        m0: usize,
        m1: usize,
        k: usize,
        wp: *const u8,
        ws: usize,
        pn: usize,
        out: *mut f32,
        n: usize,
    ) {
        let mut i = m0;
        while i < m1 {
            let mr = 4.min(m1 - i);
            let mut j = 0;
            while j < pn {
                let nr = 4.min(pn - j);
                tile_dyn::<F32>(
                    mr,
                    nr,
                    x.add(i * k),
                    k,
                    wp.add(j * ws),
                    ws,
                    k,
                    out.add(i * n + j),
                    n,
                );
                j += nr;
            }
            i += mr;
        }
    }

    /// Converts `k` floats to bf16 (round to nearest even), zero-padding to `kp`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c,avx512bf16")]
    unsafe fn to_bf16_row(src: *const f32, k: usize, dst: *mut u16, kp: usize) {
        let mut i = 0;
        while i < kp {
            let rem = k.saturating_sub(i);
            let m0: __mmask16 = ((1u32 << rem.min(16)) - 1) as u16;
            let m1: __mmask16 = ((1u32 << rem.saturating_sub(16).min(16)) - 1) as u16;
            let a = _mm512_maskz_loadu_ps(m0, src.add(i));
            let b = _mm512_maskz_loadu_ps(m1, src.add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            _mm512_storeu_si512(dst.add(i) as *mut __m512i, v);
            i += 32;
        }
    }

    /// `MR × NR` tile of bf16 dot products (`vdpbf16ps`, f32 accumulation) over `kp`
    /// (a multiple of 32, zero-padded) elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c,avx512bf16")]
    unsafe fn tile_bf16<const MR: usize, const NR: usize>(
        x: *const u16,
        w: *const u16,
        kp: usize,
        out: *mut f32,
        os: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let mut b = 0;
        while b < kp {
            let mut wv: [__m512bh; NR] =
                [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    w.add(r * kp + b) as *const __m512i,
                ));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    x.add(i * kp + b) as *const __m512i,
                ));
                for r in 0..NR {
                    a[r] = _mm512_dpbf16_ps(a[r], xv, wv[r]);
                }
            }
            b += 32;
        }
        for (i, a) in acc.iter().enumerate() {
            if NR == 4 {
                _mm_storeu_ps(out.add(i * os), hsum4(a[0], a[1], a[2], a[3]));
            } else {
                for (r, v) in a.iter().enumerate() {
                    *out.add(i * os + r) = _mm512_reduce_add_ps(*v);
                }
            }
        }
    }

    /// Fast path for one panel: activations (converted once per task, when `first`)
    /// and weights rounded to bf16, `vdpbf16ps` with f32 accumulation.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn bf16_panel(
        x: *const f32,
        m0: usize,
        m1: usize,
        k: usize,
        w: &crate::weights::WeightMatrix,
        pn0: usize,
        pn: usize,
        out: *mut f32,
        n: usize,
        panel: &mut [f32],
        xb: &mut Vec<u16>,
        wb: &mut Vec<u16>,
        first: bool,
    ) {
        let kp = k.next_multiple_of(32);
        let mm = m1 - m0;
        if xb.len() < mm * kp {
            xb.resize(mm * kp, 0);
        }
        if wb.len() < super::NB * kp {
            wb.resize(super::NB * kp, 0);
        }
        if first {
            for i in 0..mm {
                to_bf16_row(x.add((m0 + i) * k), k, xb.as_mut_ptr().add(i * kp), kp);
            }
        }
        for r in 0..pn {
            let src = w.base_ptr().add((pn0 + r) * w.row_stride());
            let dst = wb.as_mut_ptr().add(r * kp);
            if w.format() == WeightFormat::BF16 {
                std::ptr::copy_nonoverlapping(src as *const u16, dst, k);
                std::ptr::write_bytes(dst.add(k), 0, kp - k);
            } else {
                crate::quant::simd::dequant_row(w.format(), src, k, panel.as_mut_ptr());
                to_bf16_row(panel.as_ptr(), k, dst, kp);
            }
        }
        let mut i = 0;
        while i < mm {
            let mr = 4.min(mm - i);
            let mut j = 0;
            while j < pn {
                let nr = 4.min(pn - j);
                let (xp, wp) = (xb.as_ptr().add(i * kp), wb.as_ptr().add(j * kp));
                let op = out.add((m0 + i) * n + pn0 + j);
                macro_rules! go {
                    ($($m:literal $n:literal),*) => {
                        match (mr, nr) {
                            $(($m, $n) => tile_bf16::<$m, $n>(xp, wp, kp, op, n),)*
                            _ => unreachable!("tile {mr}x{nr}"),
                        }
                    };
                }
                go!(1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 3 3, 3 4, 4 1, 4 2, 4 3, 4 4);
                j += nr;
            }
            i += mr;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_gemm;
mod each;
#[cfg(target_arch = "aarch64")]
mod neon;
mod prefetch;
pub(crate) use each::matmul_each_small;
use prefetch::prefetch_row;
pub(crate) use prefetch::{prefetch_bytes, PREFETCH_ROWS};

#[cfg(test)]
mod tests;
