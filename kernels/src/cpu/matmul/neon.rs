//! NEON micro-kernels of the f32-activation matmul (aarch64): the 128-bit twins of the
//! AVX2 ones in `avx2.rs`.
//!
//! Same structure: a tile of `MR` rows of `x` by `NR` weight rows, weights decoded on
//! the fly one 32-element block at a time (eight 4-float vectors) and used by every row
//! of the tile. AArch64 has 32 vector registers, so every tile up to 4×4 (16
//! accumulators) fits, as on AVX-512; a one-row (decode) tile splits each accumulator
//! in two to halve the FMA dependency chains. The blocked (prefill) path runs the same
//! 4×4 dot-product tiles over a panel of decoded f32 weight rows.
//!
//! NEON is part of the aarch64 baseline: no run-time check is needed.

use crate::cpu::quant::dequantize_scalar;
use crate::cpu::quant::neon::{
    dequant_row, load8_bf16, load8_f16, q4_0_block, q4_1_block, q5_block, q8_0_block, Block4,
};
use crate::quant::WeightFormat;
use crate::weights::WeightMatrix;
use std::arch::aarch64::*;

use super::{prefetch_bytes, PREFETCH_ROWS};

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

/// Decodes the 32 elements of block `b` of a quantized row.
#[inline(always)]
unsafe fn load_blk<const F: u8>(row: *const u8, b: usize) -> Block4 {
    let p = row.add(b * blk_bytes(F));
    match F {
        Q8_0 => q8_0_block(p),
        Q4_0 => q4_0_block(p),
        Q5_0 => q5_block::<false>(p),
        Q5_1 => q5_block::<true>(p),
        _ => q4_1_block(p),
    }
}

/// Elements `8·q..8·q + 8` of block `b` of a float-format row (two vectors).
#[inline(always)]
unsafe fn load_sub<const F: u8>(row: *const u8, b: usize, q: usize) -> [float32x4_t; 2] {
    let p = row.add(b * blk_bytes(F));
    match F {
        F32 => {
            let p = (p as *const f32).add(8 * q);
            [vld1q_f32(p), vld1q_f32(p.add(4))]
        }
        F16 => load8_f16(p.add(16 * q)),
        _ => load8_bf16(p.add(16 * q)),
    }
}

/// `[Σa, Σb, Σc, Σd]`: pairwise adds shared by the four reductions.
#[inline(always)]
unsafe fn hsum4(a: float32x4_t, b: float32x4_t, c: float32x4_t, d: float32x4_t) -> float32x4_t {
    vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d))
}

/// `MR × NR` tile of dot products over the full K, weights decoded on the fly. The
/// last `k % 32` elements (float formats only) are added by the portable code.
#[inline]
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
    // Two chains per accumulator for one-row tiles (latency); multi-row tiles have
    // MR·NR independent chains already (and only chain 0 is used: no registers).
    let mut acc = [[[vdupq_n_f32(0.0); 2]; NR]; MR];
    let nb = k / 32;
    for b in 0..nb {
        if MR == 1 {
            // Decode is bound by the weights' stream: prefetch the same block of the
            // rows a tile or two ahead (a hint: it never faults, even past the end).
            for r in 0..NR {
                prefetch_bytes(
                    w.wrapping_add((r + PREFETCH_ROWS) * ws + b * blk_bytes(F)),
                    1,
                );
            }
        }
        if matches!(F, F32 | F16 | BF16) {
            // Float rows load eight at a time: each x vector is loaded once for all
            // NR rows.
            for q in 0..4 {
                let mut wv = [[vdupq_n_f32(0.0); 2]; NR];
                for (r, v) in wv.iter_mut().enumerate() {
                    *v = load_sub::<F>(w.add(r * ws), b, q);
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    let xp = x.add(i * xs + b * 32 + 8 * q);
                    let (x0, x1) = (vld1q_f32(xp), vld1q_f32(xp.add(4)));
                    for r in 0..NR {
                        if MR == 1 {
                            a[r][0] = vfmaq_f32(a[r][0], wv[r][0], x0);
                            a[r][1] = vfmaq_f32(a[r][1], wv[r][1], x1);
                        } else {
                            a[r][0] = vfmaq_f32(a[r][0], wv[r][0], x0);
                            a[r][0] = vfmaq_f32(a[r][0], wv[r][1], x1);
                        }
                    }
                }
            }
            continue;
        }
        for r in 0..NR {
            let wv = load_blk::<F>(w.add(r * ws), b);
            for (i, a) in acc.iter_mut().enumerate() {
                let xp = x.add(i * xs + b * 32);
                let a = &mut a[r];
                for (v, wq) in wv.iter().enumerate() {
                    let c = if MR == 1 { v & 1 } else { 0 };
                    a[c] = vfmaq_f32(a[c], *wq, vld1q_f32(xp.add(4 * v)));
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
            let src = std::slice::from_raw_parts(w.add(r * ws + nb * blk_bytes(F)), rem * eb);
            dequantize_scalar(format_of(F), src, &mut wt[..rem]);
            for (i, t) in tail.iter_mut().enumerate() {
                let xp = std::slice::from_raw_parts(x.add(i * xs + nb * 32), rem);
                t[r] = xp.iter().zip(&wt[..rem]).map(|(a, b)| a * b).sum();
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let mut s = [vdupq_n_f32(0.0); NR];
        for r in 0..NR {
            s[r] = vaddq_f32(a[r][0], a[r][1]);
        }
        if NR == 4 {
            let v = vaddq_f32(hsum4(s[0], s[1], s[2], s[3]), vld1q_f32(tail[i].as_ptr()));
            vst1q_f32(out.add(i * os), v);
        } else {
            for (r, v) in s.iter().enumerate() {
                *out.add(i * os + r) = vaddvq_f32(*v) + tail[i][r];
            }
        }
    }
}

/// Dispatches a tile with runtime `mr` and `nr` in 1..=4.
#[inline]
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
///
/// # Safety
/// `x` is `[m, k]`, `w` holds rows `n0..n1` of stride `ws`, `out` is `[m, n]` and
/// columns `n0..n1` are this call's alone.
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
///
/// # Safety
/// The buffers hold what the arguments say, and no other thread writes these outputs.
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

/// One panel of the blocked path: weight rows `pn0..pn0 + pn` of `w` (decoded into
/// `panel`, unless already f32) against rows `m0..m1` of `x`; `out` points at column
/// `pn0`, row stride `n`.
///
/// # Safety
/// As [`panel_f32`]; `panel` holds at least `pn · w.cols()` floats.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn blocked_panel(
    x: *const f32,
    m0: usize,
    m1: usize,
    w: &WeightMatrix,
    pn0: usize,
    pn: usize,
    out: *mut f32,
    n: usize,
    panel: &mut [f32],
) {
    let (k, rs) = (w.cols(), w.row_stride());
    debug_assert!(panel.len() >= pn * k);
    let (wp, ws) = if w.format() == WeightFormat::F32 {
        (w.base_ptr().add(pn0 * rs), rs)
    } else {
        for r in 0..pn {
            let src = w.base_ptr().add((pn0 + r) * rs);
            dequant_row(w.format(), src, k, panel.as_mut_ptr().add(r * k));
        }
        (panel.as_ptr() as *const u8, k * 4)
    };
    panel_f32(x, m0, m1, k, wp, ws, pn, out, n);
}
