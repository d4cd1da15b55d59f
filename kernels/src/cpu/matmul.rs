//! `out = x · wᵀ` for f32 activations and weights in any [`WeightFormat`].
//!
//! Two strategies (AVX-512 in `avx512.rs`, AVX2 + FMA in `avx2.rs` and `avx2_gemm.rs`,
//! NEON on aarch64 in `neon.rs`, with a scalar fallback of the same structure; the level
//! from [`crate::cpu::isa`]):
//! * small `m` (decode): each 4-row group of `w` is decoded on the fly inside the
//!   dot-product micro-kernel, so weights stream from memory exactly once;
//! * larger `m`: each thread decodes a panel of weight rows into a thread-local f32
//!   scratch buffer once per 64-row chunk of `x`, then multiplies the chunk by it: on
//!   AVX-512 and NEON a 4×4 register-tiled dot-product micro-kernel over 16-row panels
//!   (16 accumulators along K); on AVX2 a 16×6 outer-product tile over 24-row panels,
//!   with `x` packed once per task and K walked in L1-sized blocks (`avx2_gemm.rs`).
//!
//! Work is split over output columns (rows of `w`) and, for large `m`, over `m` too.

use crate::backend::Precision;
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
#[cfg(target_arch = "x86_64")]
const _: () = assert!(MC <= avx2_gemm::MAX_ROWS);

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// bf16 copies of the activation chunk and weight panel for [`Precision::Fast`].
    static BF16_BUFS: RefCell<(Vec<u16>, Vec<u16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// A task's rows of x packed for the AVX2 blocked kernel (`avx2_gemm`), and the
    /// index where its aligned micro-panels start.
    static X_T: RefCell<(Vec<f32>, usize)> = const { RefCell::new((Vec::new(), 0)) };
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
    let nb = blocked_panel_rows(isa, fast_bf16);
    let n_panels = n.div_ceil(nb);
    let n_chunks = (threads * 4).div_ceil(m_chunks).clamp(1, n_panels);
    let panels_per = n_panels.div_ceil(n_chunks);
    let n_chunks = n_panels.div_ceil(panels_per);
    pool.run(m_chunks * n_chunks, |t| {
        let (mc_i, nc) = (t % m_chunks, t / m_chunks);
        let (m0, m1) = (mc_i * mc, ((mc_i + 1) * mc).min(m));
        let (n0, n1) = (nc * panels_per * nb, ((nc + 1) * panels_per * nb).min(n));
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
    if !fused_small_m(w.format(), isa) {
        decoded_small_m_task(x, m, w, out, n0, n1, isa);
        return;
    }
    if let Some(kernel) = fused_small_m_kernel(isa) {
        kernel(
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

/// The fused one-row / small-batch kernel of a SIMD level: `(x, m, format, weights,
/// row stride, k, out, n, n0, n1)`, the same signature at every level.
type FusedSmallM = unsafe fn(
    *const f32,
    usize,
    WeightFormat,
    *const u8,
    usize,
    usize,
    *mut f32,
    usize,
    usize,
    usize,
);

/// The fused small-m kernel of `isa`, chosen once here rather than at each call site;
/// `None` for the scalar level.
fn fused_small_m_kernel(isa: CpuIsa) -> Option<FusedSmallM> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => Some(avx2::small_m),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 => Some(avx512::small_m),
        #[cfg(target_arch = "aarch64")]
        CpuIsa::Neon => Some(neon::small_m),
        _ => None,
    }
}

/// [`small_m_task`] for the formats without a fused SIMD decoder (Q2_K, Q3_K, Q8_K,
/// the IQ4 types, and every extra format at the scalar level): each panel of [`NB`]
/// weight rows is decoded once to f32, then multiplied by all `m` rows of `x`.
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
                    avx512::panel_f32(x.as_ptr(), 0, m, k, pp, k * 4, pn, out.0.add(pn0), n);
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

/// Weight rows per panel of the blocked path: the AVX2 outer-product kernel's own panel
/// (four of its 6-row tiles), [`NB`] for the others.
fn blocked_panel_rows(isa: CpuIsa, fast_bf16: bool) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa == CpuIsa::Avx2 && !fast_bf16 {
        return avx2_gemm::PANEL_ROWS;
    }
    let _ = (isa, fast_bf16);
    NB
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
    let nb = blocked_panel_rows(isa, fast_bf16);
    PANEL.with(|p| {
        let mut p = p.borrow_mut();
        let need = nb * k;
        if p.len() < need {
            p.resize(need, 0.0);
        }
        let mut pn0 = n0;
        while pn0 < n1 {
            let pn = nb.min(n1 - pn0);
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
                        avx512::bf16_panel(
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
                            // The one dispatcher, so every format gets its SIMD decoder
                            // at this level (the K-quants' live in `kquants`).
                            crate::quant::dequantize_unchecked(
                                w.format(),
                                std::slice::from_raw_parts(src, w.format().bytes_for(k)),
                                std::slice::from_raw_parts_mut(dst, k),
                                isa,
                            );
                        }
                        (p.as_ptr() as *const u8, k * 4)
                    };
                    if isa == CpuIsa::Avx512 {
                        avx512::panel_f32(x.as_ptr(), m0, m1, k, wp, ws, pn, out.0.add(pn0), n);
                    } else {
                        X_T.with(|xt| {
                            let (xt, off) = &mut *xt.borrow_mut();
                            // x's rows are packed once per task, for all its panels.
                            if pn0 == n0 {
                                *off = avx2_gemm::pack_x_t(x, m0, m1, k, xt);
                            }
                            let o = out.0.add(m0 * n + pn0);
                            avx2_gemm::panel_t(&xt[*off..], m1 - m0, k, wp, ws, pn, o, n);
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

/// Format codes of the fused SIMD kernels' const generic (`avx2.rs`, `avx512.rs`) and
/// the byte layout of their blocks.
#[cfg(target_arch = "x86_64")]
mod codes {
    pub(super) const F32: u8 = 0;
    pub(super) const F16: u8 = 1;
    pub(super) const BF16: u8 = 2;
    pub(super) const Q8_0: u8 = 3;
    pub(super) const Q4_0: u8 = 4;
    pub(super) const Q4_1: u8 = 5;
    pub(super) const Q5_0: u8 = 6;
    pub(super) const Q5_1: u8 = 7;
    pub(super) const Q4_K: u8 = 8;
    pub(super) const Q5_K: u8 = 9;
    pub(super) const Q6_K: u8 = 10;

    /// Bytes per block of format `F`: 32 elements, or for the K-quants one 256-element
    /// super-block, which the kernels decode as eight 32-element sub-blocks.
    pub(super) const fn blk_bytes(f: u8) -> usize {
        match f {
            F32 => 128,
            F16 | BF16 => 64,
            Q8_0 => 34,
            Q4_0 => 18,
            Q5_0 => 22,
            Q5_1 => 24,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            _ => 20,
        }
    }

    /// 32-element (sub-)blocks per block of format `F`.
    pub(super) const fn subs(f: u8) -> usize {
        match f {
            Q4_K | Q5_K | Q6_K => 8,
            _ => 1,
        }
    }

    /// Byte offset in a row of block `s` (of [`subs`] 32-element sub-blocks).
    pub(super) const fn blk_off(f: u8, s: usize) -> usize {
        s * blk_bytes(f)
    }

    /// Byte offset in a row to prefetch while sub-block `j` of block `s` is decoded: a
    /// K-quant sub-block's bytes are spread over its whole super-block, so the prefetch
    /// walks each super-block in eight even steps (each under a cache line: none skipped).
    pub(super) const fn prefetch_off(f: u8, s: usize, j: usize) -> usize {
        s * blk_bytes(f) + j * blk_bytes(f) / subs(f)
    }
}

/// Whether [`small_m_task`] multiplies `format` with the fused decode-while-multiplying
/// kernels at `isa` (the others decode panels of rows first).
fn fused_small_m(format: WeightFormat, isa: CpuIsa) -> bool {
    use WeightFormat as W;
    // NEON has fused 5-bit decoders but no K-quant ones yet.
    let simd = isa != CpuIsa::Scalar;
    let x86 = isa >= CpuIsa::Avx2;
    !WeightFormat::EXTRA_QUANTS.contains(&format)
        || (simd && matches!(format, W::Q5_0 | W::Q5_1))
        || (x86 && matches!(format, W::Q4_K | W::Q5_K | W::Q6_K))
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
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod each;
#[cfg(target_arch = "aarch64")]
mod neon;
mod prefetch;
pub(crate) use each::matmul_each_small;
use prefetch::prefetch_row;
pub(crate) use prefetch::{prefetch_bytes, PREFETCH_ROWS};

#[cfg(test)]
mod tests;
