//! AVX2 tile kernel for prefill: the `r` query heads of one KV head for a few
//! consecutive tokens of one sequence against a KV range (the AVX-512 tile's scheme at
//! 8 lanes).
//!
//! Per chunk of 8 keys: the chunk's K and V rows are decoded to f32 once for the whole
//! tile, the K rows transposed into `kt[d][key]` so each query row gets its 8 scores in
//! one ymm from `head_dim` broadcast FMAs (no horizontal sum per key), the online
//! softmax runs on that ymm, then every V row is loaded once per pair of query rows.
//! The per-token path (`attend_body`) instead reads and decodes each K/V row once per
//! token and reduces every dot product horizontally; in a 512-token prefill it took a
//! fifth of the time.

// Register-array loops index several arrays in lockstep; iterators would obscure them.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2::{exp8, hsum};
use crate::cpu::kv_store::KvRef;

/// Keys per chunk (one ymm of scores per query row).
const KC: usize = 8;

/// One work item for [`attend_tile`].
pub(super) struct Tile<'a> {
    /// Query head `h` (`0..r`) of token `tt` of the tile is at `q + tt * q_tok_stride +
    /// h * hd`.
    pub q: *const f32,
    pub q_tok_stride: usize,
    /// Query heads of the KV head.
    pub r: usize,
    /// Tokens in the tile; their kv lengths.
    pub kv_len: &'a [u32],
    /// Head size, a multiple of 8.
    pub hd: usize,
    pub scale: f32,
    pub kc: KvRef<'a>,
    pub vc: KvRef<'a>,
    /// Offset of the KV head within a slot row, and elements per slot row.
    pub head_off: usize,
    pub slot_stride: usize,
    pub bt: &'a [u32],
    pub bs: usize,
    /// Key range of this item (clamped to each row's kv length).
    pub start: usize,
    pub end: usize,
    /// Output of query head `h` of token `tt` is `out + (tt * out_tok_stride + h) * hd`,
    /// its LSE `lse + tt * out_tok_stride + h`.
    pub out: *mut f32,
    pub lse: *mut f32,
    pub out_tok_stride: usize,
}

/// Transposes 8 rows of 8 floats into `dst[col * 8 + row]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8(x: &[__m256; 8], dst: *mut f32) {
    let t0 = _mm256_unpacklo_ps(x[0], x[1]);
    let t1 = _mm256_unpackhi_ps(x[0], x[1]);
    let t2 = _mm256_unpacklo_ps(x[2], x[3]);
    let t3 = _mm256_unpackhi_ps(x[2], x[3]);
    let t4 = _mm256_unpacklo_ps(x[4], x[5]);
    let t5 = _mm256_unpackhi_ps(x[4], x[5]);
    let t6 = _mm256_unpacklo_ps(x[6], x[7]);
    let t7 = _mm256_unpackhi_ps(x[6], x[7]);
    // Per 128-bit half, u[c] holds column c (and c + 4 in the upper half) of rows 0..4
    // (u0..u3) or 4..8 (u4..u7).
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let cols = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (c, v) in cols.iter().enumerate() {
        _mm256_storeu_ps(dst.add(c * 8), *v);
    }
}

/// Scores of `G` query rows (`q + g * hd`) against the transposed chunk:
/// `s[g * 8 + key] = scale · Σ_d q[g][d] · kt[d][key]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk<const G: usize>(q: *const f32, hd: usize, kt: *const f32, s: *mut f32, scale: f32) {
    let mut a0 = [_mm256_setzero_ps(); G];
    let mut a1 = [_mm256_setzero_ps(); G];
    let mut d = 0;
    while d < hd {
        // hd is a multiple of 8: pairs of dimensions, two chains per row.
        let k0 = _mm256_loadu_ps(kt.add(d * KC));
        let k1 = _mm256_loadu_ps(kt.add((d + 1) * KC));
        for g in 0..G {
            let qg = q.add(g * hd + d);
            a0[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*qg), k0, a0[g]);
            a1[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*qg.add(1)), k1, a1[g]);
        }
        d += 2;
    }
    let sc = _mm256_set1_ps(scale);
    for g in 0..G {
        _mm256_storeu_ps(
            s.add(g * KC),
            _mm256_mul_ps(_mm256_add_ps(a0[g], a1[g]), sc),
        );
    }
}

/// `acc[g][col..col + 8·CB] = alpha[g] · acc[g][..] + Σ_key p[g][key] · v[key][..]` for
/// `G` rows (`hd` apart); V rows are `hd` apart in the decoded chunk.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv<const G: usize, const CB: usize>(
    v: *const f32,
    c: usize,
    p: *const f32,
    alpha: *const f32,
    acc: *mut f32,
    hd: usize,
    col: usize,
) {
    let mut a = [[_mm256_setzero_ps(); CB]; G];
    for g in 0..G {
        let al = _mm256_set1_ps(*alpha.add(g));
        for b in 0..CB {
            a[g][b] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(g * hd + col + b * 8)), al);
        }
    }
    for key in 0..c {
        let vp = v.add(key * hd + col);
        let mut x = [_mm256_setzero_ps(); CB];
        for b in 0..CB {
            x[b] = _mm256_loadu_ps(vp.add(b * 8));
        }
        for g in 0..G {
            let pg = _mm256_broadcast_ss(&*p.add(g * KC + key));
            for b in 0..CB {
                a[g][b] = _mm256_fmadd_ps(pg, x[b], a[g][b]);
            }
        }
    }
    for g in 0..G {
        for b in 0..CB {
            _mm256_storeu_ps(acc.add(g * hd + col + b * 8), a[g][b]);
        }
    }
}

/// [`pv`] over all `rows`, for one column block of `CB` vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_rows<const CB: usize>(
    v: *const f32,
    c: usize,
    p: *const f32,
    alpha: *const f32,
    acc: *mut f32,
    rows: usize,
    hd: usize,
    col: usize,
) {
    let mut i = 0;
    while rows - i >= 2 {
        pv::<2, CB>(v, c, p.add(i * KC), alpha.add(i), acc.add(i * hd), hd, col);
        i += 2;
    }
    if i < rows {
        pv::<1, CB>(v, c, p.add(i * KC), alpha.add(i), acc.add(i * hd), hd, col);
    }
}

/// Maximum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// Attends the tile's query rows to keys `start..end` (each row clamped to its own kv
/// length) and writes normalized outputs and LSEs.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `hd % 8 == 0`; all pointers valid for the
/// described rows, `bt` must cover every key below the tile's largest kv length, the
/// cache rows it names must be in bounds, and no other thread may write the output
/// rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_tile(t: &Tile, scratch: &mut Vec<f32>) {
    let (hd, r) = (t.hd, t.r);
    debug_assert!(hd % 8 == 0 && hd > 0);
    let nt = t.kv_len.len();
    let rows = nt * r;
    let need = 2 * rows * hd + 3 * KC * hd + rows * KC + 3 * rows;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let base = scratch.as_mut_ptr();
    // Row i = tt·r + h: query rows, accumulators, scores; the chunk's K (decoded and
    // transposed) and V rows; per row max, sum and rescale factor.
    let qs = base;
    let acc = qs.add(rows * hd);
    let kd = acc.add(rows * hd);
    let kt = kd.add(KC * hd);
    let vd = kt.add(KC * hd);
    let p = vd.add(KC * hd);
    let m = p.add(rows * KC);
    let l = m.add(rows);
    let alpha = l.add(rows);

    for i in 0..rows {
        let (tt, h) = (i / r, i % r);
        let src = t.q.add(tt * t.q_tok_stride + h * hd);
        std::ptr::copy_nonoverlapping(src, qs.add(i * hd), hd);
        std::ptr::write_bytes(acc.add(i * hd), 0, hd);
        *m.add(i) = f32::NEG_INFINITY;
        *l.add(i) = 0.0;
    }
    let tile_end = t
        .kv_len
        .iter()
        .map(|&n| n as usize)
        .max()
        .unwrap_or(0)
        .min(t.end);
    let nv = hd / 8;
    let mut j0 = t.start;
    while j0 < tile_end {
        let c = KC.min(tile_end - j0);
        // Decode the chunk's K and V rows of this KV head once for every query row.
        for key in 0..c {
            let j = j0 + key;
            let slot = t.bt[j / t.bs] as usize * t.bs + j % t.bs;
            let o = slot * t.slot_stride + t.head_off;
            t.kc.decode(o, std::slice::from_raw_parts_mut(kd.add(key * hd), hd));
            t.vc.decode(o, std::slice::from_raw_parts_mut(vd.add(key * hd), hd));
        }
        // K chunk → kt[d][key] (keys past c are zero).
        for b in 0..nv {
            let mut x = [_mm256_setzero_ps(); KC];
            for key in 0..c {
                x[key] = _mm256_loadu_ps(kd.add(key * hd + b * 8));
            }
            transpose8(&x, kt.add(b * 8 * KC));
        }
        let mut i = 0;
        while rows - i >= 4 {
            qk::<4>(qs.add(i * hd), hd, kt, p.add(i * KC), t.scale);
            i += 4;
        }
        if rows - i >= 2 {
            qk::<2>(qs.add(i * hd), hd, kt, p.add(i * KC), t.scale);
            i += 2;
        }
        if rows - i >= 1 {
            qk::<1>(qs.add(i * hd), hd, kt, p.add(i * KC), t.scale);
        }
        // Online softmax: p = exp(s − m_new) on valid keys, rescale factors alpha.
        for i in 0..rows {
            let lim = (t.kv_len[i / r] as usize).min(t.end);
            let n_valid = lim.saturating_sub(j0).min(c);
            let pi = p.add(i * KC);
            *alpha.add(i) = 1.0;
            if n_valid == 0 {
                _mm256_storeu_ps(pi, _mm256_setzero_ps());
                continue;
            }
            let valid = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(n_valid as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            let s = _mm256_blendv_ps(
                _mm256_set1_ps(f32::NEG_INFINITY),
                _mm256_loadu_ps(pi),
                _mm256_castsi256_ps(valid),
            );
            let mo = *m.add(i);
            let mn = mo.max(hmax(s));
            if mn == f32::NEG_INFINITY {
                _mm256_storeu_ps(pi, _mm256_setzero_ps());
                continue; // all scores -inf so far: nothing to accumulate
            }
            let a = if mn > mo { (mo - mn).exp() } else { 1.0 };
            let e = _mm256_and_ps(
                exp8(_mm256_sub_ps(s, _mm256_set1_ps(mn))),
                _mm256_castsi256_ps(valid),
            );
            *l.add(i) = *l.add(i) * a + hsum(e);
            _mm256_storeu_ps(pi, e);
            *m.add(i) = mn;
            *alpha.add(i) = a;
        }
        // P·V: each V row loaded once per pair of query rows.
        let mut b = 0;
        while b < nv {
            let col = b * 8;
            match nv - b {
                left if left >= 4 => {
                    pv_rows::<4>(vd, c, p, alpha, acc, rows, hd, col);
                    b += 4;
                }
                left if left >= 2 => {
                    pv_rows::<2>(vd, c, p, alpha, acc, rows, hd, col);
                    b += 2;
                }
                _ => {
                    pv_rows::<1>(vd, c, p, alpha, acc, rows, hd, col);
                    b += 1;
                }
            }
        }
        j0 += c;
    }

    // Normalize and write out.
    for i in 0..rows {
        let (tt, h) = (i / r, i % r);
        let o = t.out.add((tt * t.out_tok_stride + h) * hd);
        let li = *l.add(i);
        if li > 0.0 {
            let w = _mm256_set1_ps(1.0 / li);
            for b in 0..nv {
                let x = _mm256_loadu_ps(acc.add(i * hd + b * 8));
                _mm256_storeu_ps(o.add(b * 8), _mm256_mul_ps(x, w));
            }
            *t.lse.add(tt * t.out_tok_stride + h) = *m.add(i) + li.ln();
        } else {
            // An empty row gives exact zeros even if acc were non-finite.
            std::ptr::write_bytes(o, 0, hd);
            *t.lse.add(tt * t.out_tok_stride + h) = f32::NEG_INFINITY;
        }
    }
}
