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
///
/// # Safety
/// AVX2 kernels supported; `x` holds rows `m0..m1` of length `k`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_x_t(
    x: &[f32],
    m0: usize,
    m1: usize,
    k: usize,
    xt: &mut Vec<f32>,
) -> usize {
    let rows = m1 - m0;
    let mp = rows.next_multiple_of(TM);
    xt.clear();
    xt.resize(k * mp, 0.0);
    let (src, dst) = (x.as_ptr().add(m0 * k), xt.as_mut_ptr());
    // 8×8 blocks transposed in registers; the ragged edges one value at a time.
    let (r8, k8) = (rows / 8 * 8, k / 8 * 8);
    for i in (0..r8).step_by(8) {
        for kk in (0..k8).step_by(8) {
            let mut v = [_mm256_setzero_ps(); 8];
            for (r, vr) in v.iter_mut().enumerate() {
                *vr = _mm256_loadu_ps(src.add((i + r) * k + kk));
            }
            let t = transpose8(v);
            for (c, tc) in t.iter().enumerate() {
                _mm256_storeu_ps(dst.add((kk + c) * mp + i), *tc);
            }
        }
        for kk in k8..k {
            for r in 0..8 {
                *dst.add(kk * mp + i + r) = *src.add((i + r) * k + kk);
            }
        }
    }
    for i in r8..rows {
        for kk in 0..k {
            *dst.add(kk * mp + i) = *src.add(i * k + kk);
        }
    }
    mp
}

/// Transposes an 8×8 block held as eight row vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
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
