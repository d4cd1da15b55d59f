//! AVX-512 micro-kernels of the f32-activation matmul: `MR × NR` tiles of dot
//! products with the weights decoded on the fly one 32-element block (two zmm vectors)
//! at a time, and the `Precision::Fast` bf16 panel path.
use crate::quant::simd::{load16_bf16, load16_f16, q4_0_block, q4_1_block, q5_block, q8_0_block};
use crate::quant::WeightFormat;
use std::arch::x86_64::*;

use super::avx2::sub_scales;
use super::codes::{
    blk_off, prefetch_off, subs, BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
};
use super::PREFETCH_ROWS;
use crate::cpu::kquants::simd_avx2::SubScales;
use crate::cpu::kquants::simd_avx512::{q4_k_sub, q5_k_sub, q6_k_sub};

/// Decodes 32 elements of a row: block `s`, or for the K-quants sub-block `j` of
/// super-block `s`, whose scales are `sc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn load_blk<const F: u8>(
    row: *const u8,
    s: usize,
    j: usize,
    sc: &SubScales,
) -> (__m512, __m512) {
    let p = row.add(blk_off(F, s));
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
        Q4_K => q4_k_sub(p, j, sc),
        Q5_K => q5_k_sub(p, j, sc),
        Q6_K => q6_k_sub(p, j, sc),
        _ => q4_1_block(p),
    }
}

/// Decodes the last `rem` (< 32) elements, from block `b`, of a float-format row,
/// zero-padded.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn load_tail<const F: u8>(
    row: *const u8,
    b: usize,
    m0: __mmask16,
    m1: __mmask16,
) -> (__m512, __m512) {
    let p = row.add(blk_off(F, b));
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
    for s in 0..nb / subs(F) {
        // The K-quants' scales, once per super-block and row.
        let mut sc = [[0.0f32; 16]; NR];
        for (r, sc) in sc.iter_mut().enumerate() {
            *sc = sub_scales::<F>(w.add(r * ws + blk_off(F, s)));
        }
        for j in 0..subs(F) {
            let mut wv = [(_mm512_setzero_ps(), _mm512_setzero_ps()); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = load_blk::<F>(w.add(r * ws), s, j, &sc[r]);
            }
            // A one-row (decode) tile is bound by the weights' stream: prefetch the
            // same block of the rows a tile or two ahead.
            if MR == 1 {
                for r in 0..NR {
                    let p = w.wrapping_add((r + PREFETCH_ROWS) * ws + prefetch_off(F, s, j));
                    _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                }
            }
            let b = s * subs(F) + j;
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
        WeightFormat::Q4_K => small_m_f::<Q4_K>(x, m, w, ws, k, out, n, n0, n1),
        WeightFormat::Q5_K => small_m_f::<Q5_K>(x, m, w, ws, k, out, n, n0, n1),
        WeightFormat::Q6_K => small_m_f::<Q6_K>(x, m, w, ws, k, out, n, n0, n1),
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
                w.add(r * kp + b) as *const __m512i
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
