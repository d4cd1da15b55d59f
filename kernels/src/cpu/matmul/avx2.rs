//! AVX2 + FMA micro-kernels of the f32-activation matmul: the 256-bit twins of the
//! AVX-512 ones in `avx512.rs`, for the CPUs without AVX-512 (most laptops, Zen 2/3
//! cloud VMs, pre-Ice-Lake Intel servers).
//!
//! Same structure: a tile of `MR` rows of `x` by `NR` weight rows, weights decoded on
//! the fly one 32-element block at a time (four ymm vectors) and used by every row of
//! the tile. With 16 ymm registers the tile keeps `MR·NR ≤ 8` accumulators; a one-row
//! (decode) tile splits each accumulator in two to halve the FMA dependency chains.
//!
//! Every function needs AVX2, FMA and F16C (`CpuFeatures::has_avx2_kernels`).

use crate::cpu::quant::avx2::{
    load8_bf16, load8_f16, q4_0_block, q4_1_block, q5_block, q8_0_block, Block8,
};
use crate::cpu::quant::dequantize_scalar;
use crate::quant::WeightFormat;
use std::arch::x86_64::*;

use super::codes::{
    blk_bytes, blk_off, prefetch_off, subs, BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K,
    Q6_K, Q8_0,
};
use super::PREFETCH_ROWS;
use crate::cpu::kquants::simd_avx2::{
    k4_scales, q4_k_sub, q5_k_sub, q6_k_sub, q6_scales, SubScales,
};

const fn format_of(f: u8) -> WeightFormat {
    match f {
        F32 => WeightFormat::F32,
        F16 => WeightFormat::F16,
        BF16 => WeightFormat::BF16,
        Q8_0 => WeightFormat::Q8_0,
        Q4_0 => WeightFormat::Q4_0,
        Q5_0 => WeightFormat::Q5_0,
        Q5_1 => WeightFormat::Q5_1,
        _ => WeightFormat::Q4_1,
    }
}

/// The scales of super-block `sb` of a K-quant `F`, shared by its sub-blocks; nothing
/// for the 32-element formats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sub_scales<const F: u8>(sb: *const u8) -> SubScales {
    match F {
        Q4_K | Q5_K => k4_scales(sb),
        Q6_K => q6_scales(sb),
        _ => [0.0; 16],
    }
}

/// Decodes 32 elements of a row: block `s`, or for the K-quants sub-block `j` of
/// super-block `s`, whose scales are `sc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_blk<const F: u8>(row: *const u8, s: usize, j: usize, sc: &SubScales) -> Block8 {
    let p = row.add(blk_off(F, s));
    match F {
        F32 => {
            let p = p as *const f32;
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
        F16 => [
            load8_f16(p),
            load8_f16(p.add(16)),
            load8_f16(p.add(32)),
            load8_f16(p.add(48)),
        ],
        BF16 => [
            load8_bf16(p),
            load8_bf16(p.add(16)),
            load8_bf16(p.add(32)),
            load8_bf16(p.add(48)),
        ],
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

/// Elements `8·q..8·q + 8` of block `b` of a float-format row.
#[inline(always)]
unsafe fn load_sub<const F: u8>(row: *const u8, b: usize, q: usize) -> __m256 {
    let p = row.add(b * blk_bytes(F));
    match F {
        F32 => _mm256_loadu_ps((p as *const f32).add(8 * q)),
        F16 => load8_f16(p.add(16 * q)),
        _ => load8_bf16(p.add(16 * q)),
    }
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Horizontal sums of four vectors at once (shared shuffles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let ab = _mm256_hadd_ps(a, b);
    let cd = _mm256_hadd_ps(c, d);
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(
        _mm256_castps256_ps128(abcd),
        _mm256_extractf128_ps::<1>(abcd),
    )
}

/// `MR × NR` tile of dot products over the full K, weights decoded on the fly. The
/// last `k % 32` elements (float formats only) are added by the portable code.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
    // Two chains per accumulator for one-row tiles (latency), one otherwise (registers).
    let mut acc = [[[_mm256_setzero_ps(); 2]; NR]; MR];
    let nb = k / 32;
    for s in 0..nb / subs(F) {
        // The K-quants' scales, once per super-block and row.
        let mut sc = [[0.0f32; 16]; NR];
        for (r, sc) in sc.iter_mut().enumerate() {
            *sc = sub_scales::<F>(w.add(r * ws + blk_off(F, s)));
        }
        for j in 0..subs(F) {
            if MR == 1 {
                // Decode is bound by the weights' stream: prefetch the same block of
                // the rows a tile or two ahead.
                for r in 0..NR {
                    let p = w.wrapping_add((r + PREFETCH_ROWS) * ws + prefetch_off(F, s, j));
                    _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                }
            }
            let b = s * subs(F) + j;
            if matches!(F, F32 | F16 | BF16) {
                // Float rows load eight at a time: each x vector is loaded once for all
                // NR rows (MR + NR loads per MR·NR FMAs keeps the FMA ports busy).
                for q in 0..4 {
                    let mut wv = [_mm256_setzero_ps(); NR];
                    for (r, v) in wv.iter_mut().enumerate() {
                        *v = load_sub::<F>(w.add(r * ws), b, q);
                    }
                    // Two chains per accumulator only for one-row tiles (registers).
                    let c = if MR == 1 { q & 1 } else { 0 };
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xv = _mm256_loadu_ps(x.add(i * xs + b * 32 + 8 * q));
                        for r in 0..NR {
                            a[r][c] = _mm256_fmadd_ps(wv[r], xv, a[r][c]);
                        }
                    }
                }
                continue;
            }
            for r in 0..NR {
                let wv = load_blk::<F>(w.add(r * ws), s, j, &sc[r]);
                for (i, a) in acc.iter_mut().enumerate() {
                    let xp = x.add(i * xs + b * 32);
                    let a = &mut a[r];
                    if MR == 1 {
                        a[0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xp), a[0]);
                        a[1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xp.add(8)), a[1]);
                        a[0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xp.add(16)), a[0]);
                        a[1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xp.add(24)), a[1]);
                    } else {
                        for (q, v) in wv.iter().enumerate() {
                            a[0] = _mm256_fmadd_ps(*v, _mm256_loadu_ps(xp.add(8 * q)), a[0]);
                        }
                    }
                }
            }
        }
    }
    let rem = k % 32;
    let mut tail = [[0.0f32; NR]; MR];
    if rem != 0 {
        // Float formats only (quantized rows are whole blocks): decode the tail once.
        let mut wt = [0.0f32; 32];
        let eb = blk_bytes(F) / 32;
        for r in 0..NR {
            let src = std::slice::from_raw_parts(w.add(r * ws + blk_off(F, nb)), rem * eb);
            dequantize_scalar(format_of(F), src, &mut wt[..rem]);
            for (i, t) in tail.iter_mut().enumerate() {
                let xp = std::slice::from_raw_parts(x.add(i * xs + nb * 32), rem);
                t[r] = xp.iter().zip(&wt[..rem]).map(|(a, b)| a * b).sum();
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let mut s = [_mm256_setzero_ps(); NR];
        for (s, v) in s.iter_mut().zip(a) {
            *s = _mm256_add_ps(v[0], v[1]);
        }
        if NR == 4 {
            let v = _mm_add_ps(
                hsum4(s[0], s[1], s[2], s[3]),
                _mm_loadu_ps(tail[i].as_ptr()),
            );
            _mm_storeu_ps(out.add(i * os), v);
        } else {
            for (r, v) in s.iter().enumerate() {
                *out.add(i * os + r) = hsum(*v) + tail[i][r];
            }
        }
    }
}

/// Dispatches a tile with runtime `mr` in 1..=4 and `nr` in 1..=4 (`mr·nr ≤ 8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
    go!(1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 4 1, 4 2)
}

/// Weight rows per tile for `mr` rows of `x` (at most 8 accumulators).
#[inline]
fn tile_cols(mr: usize) -> usize {
    if mr <= 2 {
        4
    } else {
        2
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
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
    let cols = tile_cols(m);
    let mut j = n0;
    while j < n1 {
        let nr = cols.min(n1 - j);
        tile_dyn::<F>(m, nr, x, k, w.add(j * ws), ws, k, out.add(j), n);
        j += nr;
    }
}

/// Fused decode path for `m <= 4`, output columns `n0..n1`.
///
/// # Safety
/// AVX2 kernels supported; `x` is `[m, k]`, `w` holds rows `n0..n1` of stride `ws`,
/// `out` is `[m, n]` and columns `n0..n1` are this call's alone.
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
///
/// # Safety
/// AVX2 kernels supported; the buffers hold what the arguments say.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let cols = tile_cols(mr);
        let mut j = 0;
        while j < pn {
            let nr = cols.min(pn - j);
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
