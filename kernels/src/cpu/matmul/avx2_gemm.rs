//! The AVX2 + FMA kernel of the blocked (prefill, batched decode) matmul path: outer
//! products instead of dot products.
//!
//! The dot-product tiles of `avx2.rs` reload `x` for every weight row and end in
//! horizontal sums; with 16 ymm registers that caps them near 60% of the FMA ports. Here
//! a task's rows of `x` are packed once, in 16-row micro-panels (`[tile][k][16]`, each
//! 64-byte aligned), and reused for every panel of weight rows the task multiplies. A
//! tile is 16 rows of `x` by [`TN`] = 6 weight rows: per step along K it loads two
//! vectors of `x`, broadcasts six weights and runs twelve independent FMA chains (8 loads
//! per 12 FMAs; twelve chains hide the FMA latency with room to spare). K is walked in
//! blocks of [`KC`] so that a block's weight rows and `x` micro-panel stay in L1 while
//! every tile of the panel uses them; partial sums wait in a small tile-ordered buffer
//! and reach `out` once per panel.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use std::arch::x86_64::*;

/// Rows of `x` per tile (two ymm vectors).
const TM: usize = 16;
/// Weight rows per tile.
const TN: usize = 6;
/// Weight rows per panel the callers decode at a time (four tiles).
pub(super) const PANEL_ROWS: usize = 4 * TN;
/// K per block: a 24-row weight block (12 KiB) and one `x` micro-panel (8 KiB) fit L1.
const KC: usize = 128;
/// Most rows of `x` one call takes (the blocked path's chunk, `MC`).
pub(super) const MAX_ROWS: usize = 64;
/// f32 values of one tile's accumulators.
const TILE: usize = TM * TN;

/// Packs rows `m0..m1` of `x` (`[m, k]`) into 16-row micro-panels in `xt`, zero past
/// row `m1 − m0`: `xt[off + (t·k + kk)·16 + l] = x[m0 + 16t + l, kk]`. Returns `off`,
/// the index that makes the panels 64-byte aligned.
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
    // Every value below is written, so the buffer is only grown, never cleared.
    if xt.len() < k * mp + 16 {
        xt.resize(k * mp + 16, 0.0);
    }
    let off = (64 - xt.as_ptr() as usize % 64) % 64 / 4;
    let (src, dst) = (x.as_ptr().add(m0 * k), xt.as_mut_ptr().add(off));
    let at = |i: usize, kk: usize| (i / TM * k + kk) * TM + i % TM;
    for i in rows..mp {
        for kk in 0..k {
            *dst.add(at(i, kk)) = 0.0;
        }
    }
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
                _mm256_store_ps(dst.add(at(i, kk + c)), *tc);
            }
        }
        for kk in k8..k {
            for r in 0..8 {
                *dst.add(at(i + r, kk)) = *src.add((i + r) * k + kk);
            }
        }
    }
    for i in r8..rows {
        for kk in 0..k {
            *dst.add(at(i, kk)) = *src.add(i * k + kk);
        }
    }
    off
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
/// `xt` the packed micro-panels from [`pack_x_t`] (from its offset on), `wp` the panel's
/// first f32 weight row (row stride `ws` bytes), `out` pointing at `(m0, pn0)` with row
/// stride `n`.
///
/// # Safety
/// AVX2 kernels supported; `rows ≤ MAX_ROWS`, `pn ≤ PANEL_ROWS`; the buffers hold what
/// the arguments say, `xt` 64-byte aligned; no other thread writes these outputs.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel_t(
    xt: &[f32],
    rows: usize,
    k: usize,
    wp: *const u8,
    ws: usize,
    pn: usize,
    out: *mut f32,
    n: usize,
) {
    assert!(rows <= MAX_ROWS && pn <= PANEL_ROWS && xt.len() >= k * rows.next_multiple_of(TM));
    debug_assert_eq!(xt.as_ptr() as usize % 64, 0);
    let (m_tiles, n_tiles) = (rows.div_ceil(TM), pn.div_ceil(TN));
    // Tile (it, jt) sums at acc[(it·n_tiles + jt)·TILE ..], vector-ordered like the
    // registers: [r][h] lane l is out row 16·it + 8h + l, weight row 6·jt + r.
    let mut acc = [0.0f32; MAX_ROWS / TM * PANEL_ROWS / TN * TILE];
    let mut kc0 = 0;
    while kc0 < k {
        let kc = KC.min(k - kc0);
        for it in 0..m_tiles {
            let xs = xt.as_ptr().add((it * k + kc0) * TM);
            for jt in 0..n_tiles {
                let j0 = jt * TN;
                let nr = TN.min(pn - j0);
                // A narrow last tile repeats its last row (read, never stored).
                let w = |r: usize| (wp.add((j0 + r.min(nr - 1)) * ws) as *const f32).add(kc0);
                let (w0, w1, w2, w3, w4, w5) = (w(0), w(1), w(2), w(3), w(4), w(5));
                let a = acc.as_mut_ptr().add((it * n_tiles + jt) * TILE);
                let mut c = [[_mm256_setzero_ps(); 2]; TN];
                if kc0 > 0 {
                    for (r, cr) in c.iter_mut().enumerate() {
                        cr[0] = _mm256_loadu_ps(a.add(r * TM));
                        cr[1] = _mm256_loadu_ps(a.add(r * TM + 8));
                    }
                }
                let mut xp = xs;
                for kk in 0..kc {
                    let x0 = _mm256_load_ps(xp);
                    let x1 = _mm256_load_ps(xp.add(8));
                    let b = _mm256_broadcast_ss(&*w0.add(kk));
                    c[0][0] = _mm256_fmadd_ps(x0, b, c[0][0]);
                    c[0][1] = _mm256_fmadd_ps(x1, b, c[0][1]);
                    let b = _mm256_broadcast_ss(&*w1.add(kk));
                    c[1][0] = _mm256_fmadd_ps(x0, b, c[1][0]);
                    c[1][1] = _mm256_fmadd_ps(x1, b, c[1][1]);
                    let b = _mm256_broadcast_ss(&*w2.add(kk));
                    c[2][0] = _mm256_fmadd_ps(x0, b, c[2][0]);
                    c[2][1] = _mm256_fmadd_ps(x1, b, c[2][1]);
                    let b = _mm256_broadcast_ss(&*w3.add(kk));
                    c[3][0] = _mm256_fmadd_ps(x0, b, c[3][0]);
                    c[3][1] = _mm256_fmadd_ps(x1, b, c[3][1]);
                    let b = _mm256_broadcast_ss(&*w4.add(kk));
                    c[4][0] = _mm256_fmadd_ps(x0, b, c[4][0]);
                    c[4][1] = _mm256_fmadd_ps(x1, b, c[4][1]);
                    let b = _mm256_broadcast_ss(&*w5.add(kk));
                    c[5][0] = _mm256_fmadd_ps(x0, b, c[5][0]);
                    c[5][1] = _mm256_fmadd_ps(x1, b, c[5][1]);
                    xp = xp.add(TM);
                }
                for (r, cr) in c.iter().enumerate() {
                    _mm256_storeu_ps(a.add(r * TM), cr[0]);
                    _mm256_storeu_ps(a.add(r * TM + 8), cr[1]);
                }
            }
        }
        kc0 += kc;
    }
    for it in 0..m_tiles {
        let valid = (rows - it * TM).min(TM);
        for j in 0..pn {
            let a = &acc[(it * n_tiles + j / TN) * TILE + (j % TN) * TM..][..valid];
            for (l, v) in a.iter().enumerate() {
                *out.add((it * TM + l) * n + j) = *v;
            }
        }
    }
}
