//! The AVX2 + FMA kernel of the blocked (prefill) matmul path: outer products instead
//! of dot products.
//!
//! The dot-product tiles of `avx2.rs` reload `x` for every weight row and end in
//! horizontal sums; with 16 ymm registers that caps them near 60% of the FMA ports. Here
//! a task's rows of `x` are packed once, transposed (`xt[kk·mp + i]`, `mp` = rows rounded
//! up to 16), and reused for every panel of weight rows the task multiplies. A tile is
//! 16 rows of `x` by 4 weight rows: per step along K it loads two vectors of `x`,
//! broadcasts four weights and runs eight independent FMA chains, which keeps the FMA
//! ports busy; outputs need no horizontal sums.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use std::arch::x86_64::*;

/// Rows of `x` per tile (two ymm vectors).
const TM: usize = 16;
/// Weight rows per tile.
const TN: usize = 4;

/// Packs rows `m0..m1` of `x` (`[m, k]`) transposed into `xt` (`[k, mp]`, rows past
/// `m1 − m0` zero), returning `mp`.
pub(super) fn pack_x_t(x: &[f32], m0: usize, m1: usize, k: usize, xt: &mut Vec<f32>) -> usize {
    let rows = m1 - m0;
    let mp = rows.next_multiple_of(TM);
    xt.clear();
    xt.resize(k * mp, 0.0);
    // Blocks of 16 K-columns keep both sides in L1 while transposing.
    for kb in (0..k).step_by(16) {
        let ke = (kb + 16).min(k);
        for i in 0..rows {
            let row = &x[(m0 + i) * k..(m0 + i + 1) * k];
            for kk in kb..ke {
                xt[kk * mp + i] = row[kk];
            }
        }
    }
    mp
}

/// `out[m0 + i, pn0 + j] = Σ_kk x[m0 + i, kk] · w[j, kk]` for `i < rows`, `j < pn`:
/// `xt`/`mp` from [`pack_x_t`], `wp` the panel's first f32 weight row (row stride `ws`
/// bytes), `out` pointing at `(m0, pn0)` with row stride `n`.
///
/// # Safety
/// AVX2 kernels supported; the buffers hold what the arguments say, and no other
/// thread writes these outputs.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel_t(
    xt: &[f32],
    mp: usize,
    rows: usize,
    k: usize,
    wp: *const u8,
    ws: usize,
    pn: usize,
    out: *mut f32,
    n: usize,
) {
    debug_assert!(xt.len() >= k * mp && rows <= mp);
    let mut i0 = 0;
    while i0 < rows {
        let mut j0 = 0;
        while j0 < pn {
            let nr = TN.min(pn - j0);
            let w = |r: usize| wp.add((j0 + r.min(nr - 1)) * ws) as *const f32;
            // A narrow last tile repeats its last row (read, never stored).
            let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3));
            let mut acc = [[_mm256_setzero_ps(); 2]; TN];
            let mut xp = xt.as_ptr().add(i0);
            for kk in 0..k {
                let x0 = _mm256_loadu_ps(xp);
                let x1 = _mm256_loadu_ps(xp.add(8));
                let b = [
                    _mm256_broadcast_ss(&*w0.add(kk)),
                    _mm256_broadcast_ss(&*w1.add(kk)),
                    _mm256_broadcast_ss(&*w2.add(kk)),
                    _mm256_broadcast_ss(&*w3.add(kk)),
                ];
                for r in 0..TN {
                    acc[r][0] = _mm256_fmadd_ps(x0, b[r], acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(x1, b[r], acc[r][1]);
                }
                xp = xp.add(mp);
            }
            // acc[r][h] lane l is out[i0 + 8h + l, j0 + r].
            let valid = (rows - i0).min(TM);
            let mut lanes = [0.0f32; TM];
            for (r, a) in acc.iter().enumerate().take(nr) {
                _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
                for (l, v) in lanes.iter().enumerate().take(valid) {
                    *out.add((i0 + l) * n + j0 + r) = *v;
                }
            }
            j0 += nr;
        }
        i0 += TM;
    }
}
