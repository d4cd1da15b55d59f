//! Encoders of the 5-bit, K-quant and IQ4 blocks (`dcpserve quantize`, tests).
//!
//! Per (sub-)block, a small search over candidate scales around the range's, each
//! with the least-squares scale (and min) of its rounded codes, keeping the smallest
//! squared error (the idea of ggml's reference encoders, without importance weights). K-quant
//! sub-block scales are themselves quantized (4–8 bits) against the super-block's f16
//! `d`/`dmin`; codes are always re-chosen against the stored (rounded) scales.

use super::dequant::k4_scale_min;
use super::IQ4_VALUES;
use crate::dtype::{DType, QK, QK_K};
use half::f16;

/// Encodes `src` (whole blocks of `format`, one of [`DType::EXTRA_QUANTS`]) onto `out`.
///
/// # Panics
/// On a format that is not one of [`DType::EXTRA_QUANTS`].
pub(crate) fn quantize_row(format: DType, src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(format.block_elems()) {
        let start = out.len();
        match format {
            DType::Q5_0 => q5_0(blk, out),
            DType::Q5_1 => q5_1(blk, out),
            DType::IQ4_NL => iq4_nl(blk, out),
            DType::Q2_K => q2_k(blk, out),
            DType::Q3_K => q3_k(blk, out),
            DType::Q4_K => q45_k(blk, out, false),
            DType::Q5_K => q45_k(blk, out, true),
            DType::Q6_K => q6_k(blk, out),
            DType::Q8_K => q8_k(blk, out),
            DType::IQ4_XS => iq4_xs(blk, out),
            other => unreachable!("kquants::quantize_row of {other:?}"),
        }
        debug_assert_eq!(out.len() - start, format.block_bytes());
    }
}

fn push_f16(out: &mut Vec<u8>, v: f32) -> f32 {
    let h = f16::from_f32(v);
    out.extend_from_slice(&h.to_le_bytes());
    h.to_f32()
}

fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Asymmetric fit `x ≈ s·q − m` with `q` in `0..=nmax` and `m ≥ 0` (ggml's K-quant
/// convention keeps the offset non-positive). Like ggml's reference encoders it tries
/// several scales around the range's: for each, codes by rounding, then the weighted
/// least-squares `(s, m)` of those codes; the pair with the smallest weighted squared
/// error wins. Weights `rms + |x|` (ggml's choice for Q4_K) favour the large values,
/// which move the outputs most. Returns `(s, m)`.
fn fit_affine(x: &[f32], nmax: u8) -> (f32, f32) {
    fit_affine_with(x, nmax, false)
}

/// [`fit_affine`], optionally with an offset of either sign (`x ≈ s·q − m`, any `m`:
/// Q5_1's convention).
fn fit_affine_with(x: &[f32], nmax: u8, any_sign: bool) -> (f32, f32) {
    let lo = x
        .iter()
        .copied()
        .fold(if any_sign { f32::INFINITY } else { 0.0 }, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(lo);
    if hi - lo <= 0.0 {
        return (0.0, -lo);
    }
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    let weight = |v: f32| rms + v.abs();
    let (mut tw, mut twx, mut twxx) = (0.0f32, 0.0f32, 0.0f32);
    for &v in x {
        let w = weight(v);
        tw += w;
        twx += w * v;
        twxx += w * v * v;
    }
    let mut best = ((hi - lo) / nmax as f32, -lo);
    let mut best_err = f32::INFINITY;
    for step in -10..=10 {
        let s0 = (hi - lo) / (nmax as f32 + 0.1 * step as f32);
        let (mut twq, mut twqq, mut twqx) = (0.0f32, 0.0f32, 0.0f32);
        for &v in x {
            let q = ((v - lo) / s0).round().clamp(0.0, nmax as f32);
            let w = weight(v);
            twq += w * q;
            twqq += w * q * q;
            twqx += w * q * v;
        }
        // Weighted least squares of x = s·q + b; with b clamped to ≤ 0, s alone.
        let det = tw * twqq - twq * twq;
        let (mut s, mut b) = if det > 0.0 {
            let s = (tw * twqx - twq * twx) / det;
            (s, (twx - s * twq) / tw)
        } else {
            (s0, lo)
        };
        if b > 0.0 && !any_sign {
            b = 0.0;
            s = if twqq > 0.0 { twqx / twqq } else { s0 };
        }
        if s <= 0.0 {
            continue;
        }
        // Σ w·(x − s·q − b)² expanded over the sums above.
        let err =
            twxx + s * s * twqq + tw * b * b - 2.0 * s * twqx - 2.0 * b * twx + 2.0 * s * b * twq;
        if err < best_err {
            best_err = err;
            best = (s, -b);
        }
    }
    best
}

/// Symmetric fit `x ≈ s·q` for `q` in `qmin..=qmax` (`s` of either sign): scales that
/// map the largest magnitude near either end of the code range are tried, each with
/// the weighted least-squares scale of its codes; the smallest weighted error wins.
/// Weights `x²` (ggml's choice for Q6_K and Q3_K) favour the large values.
fn fit_symmetric(x: &[f32], qmin: i32, qmax: i32) -> f32 {
    let amax = x
        .iter()
        .copied()
        .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if amax == 0.0 {
        return 0.0;
    }
    let (mut best, mut best_gain) = (amax / qmin as f32, f32::NEG_INFINITY);
    for end in [qmin as f32, qmax as f32] {
        for step in -6..=6 {
            let t = end + 0.1 * step as f32 * end.signum();
            if t == 0.0 {
                continue;
            }
            let s0 = amax / t;
            let (mut swqx, mut swqq) = (0.0f32, 0.0f32);
            for &v in x {
                let q = (v / s0).round().clamp(qmin as f32, qmax as f32);
                let w = v * v;
                swqx += w * q * v;
                swqq += w * q * q;
            }
            // The weighted error with the least-squares scale is
            // Σwx² − (Σwqx)²/Σwq²: maximize the gain.
            if swqq > 0.0 && swqx * swqx / swqq > best_gain {
                best_gain = swqx * swqx / swqq;
                best = swqx / swqq;
            }
        }
    }
    best
}

/// Nearest code of `v` for scale `s`, offset `m` (`v ≈ s·q − m`).
fn code(v: f32, s: f32, m: f32, nmax: u8) -> u8 {
    if s == 0.0 {
        return 0;
    }
    ((v + m) / s).round().clamp(0.0, nmax as f32) as u8
}

fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    let d = round_f16(fit_symmetric(x, -16, 15));
    push_f16(out, d);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| {
            if d == 0.0 {
                16
            } else {
                ((v / d).round() + 16.0).clamp(0.0, 31.0) as u8
            }
        })
        .collect();
    push_five_bit(&q, out);
}

fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (s, neg_m) = fit_affine_with(x, 31, true);
    let d = push_f16(out, s);
    let mn = push_f16(out, -neg_m);
    let q: Vec<u8> = x.iter().map(|&v| code(v, d, -mn, 31)).collect();
    push_five_bit(&q, out);
}

/// `qh` (fifth bits of the 32 codes) then the nibbles, element `j` / `j + 16` per byte.
fn push_five_bit(q: &[u8], out: &mut Vec<u8>) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &c)| h | (((c >> 4) as u32 & 1) << j));
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend((0..16).map(|j| (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)));
}

/// The codebook index nearest to `v / s`.
fn iq4_code(v: f32, s: f32) -> u8 {
    if s == 0.0 {
        return 8; // the codebook's value closest to zero
    }
    let t = v / s;
    let mut best = 0;
    for (i, &k) in IQ4_VALUES.iter().enumerate() {
        if (k as f32 - t).abs() < (IQ4_VALUES[best] as f32 - t).abs() {
            best = i;
        }
    }
    best as u8
}

/// Scale of an IQ4 group: the largest magnitude maps to the codebook end of its sign,
/// then two least-squares refits with re-chosen codes.
fn iq4_scale(x: &[f32]) -> f32 {
    let amax = x
        .iter()
        .copied()
        .fold(0.0f32, |a, v| if v.abs() > a.abs() { v } else { a });
    if amax == 0.0 {
        return 0.0;
    }
    let mut s = amax / IQ4_VALUES[0] as f32;
    for _ in 0..2 {
        let (mut num, mut den) = (0.0f32, 0.0f32);
        for &v in x {
            let k = IQ4_VALUES[iq4_code(v, s) as usize] as f32;
            num += k * v;
            den += k * k;
        }
        if den > 0.0 && num != 0.0 {
            s = num / den;
        }
    }
    s
}

fn iq4_nl(x: &[f32], out: &mut Vec<u8>) {
    let d = push_f16(out, iq4_scale(x));
    let q: Vec<u8> = x.iter().map(|&v| iq4_code(v, d)).collect();
    out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
}

fn iq4_xs(x: &[f32], out: &mut Vec<u8>) {
    let scales: Vec<f32> = x.chunks_exact(QK).map(iq4_scale).collect();
    let smax = scales.iter().copied().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = push_f16(out, smax / 31.0);
    let ls: Vec<u8> = scales
        .iter()
        .map(|&s| {
            if d == 0.0 {
                32
            } else {
                ((s / d).round().clamp(-32.0, 31.0) + 32.0) as u8
            }
        })
        .collect();
    let scales_h = ls
        .iter()
        .enumerate()
        .fold(0u16, |h, (ib, &l)| h | (((l >> 4) as u16) << (2 * ib)));
    out.extend_from_slice(&scales_h.to_le_bytes());
    out.extend((0..4).map(|i| (ls[2 * i] & 0xF) | ((ls[2 * i + 1] & 0xF) << 4)));
    for (ib, g) in x.chunks_exact(QK).enumerate() {
        let dl = d * (ls[ib] as i32 - 32) as f32;
        let q: Vec<u8> = g.iter().map(|&v| iq4_code(v, dl)).collect();
        out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
    }
}

/// Quantizes non-negative sub-block values to `bits`-bit integers against the f16
/// super-block scale `max / (2^bits − 1)`; returns (stored scale, integers).
fn quantize_sub_scales(vals: &[f32], bits: u32) -> (f32, Vec<u8>) {
    let top = ((1u32 << bits) - 1) as f32;
    let max = vals.iter().copied().fold(0.0f32, f32::max);
    let d = round_f16(max / top);
    let q = vals
        .iter()
        .map(|&v| {
            if d == 0.0 {
                0
            } else {
                (v / d).round().clamp(0.0, top) as u8
            }
        })
        .collect();
    (d, q)
}

fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    let fits: Vec<(f32, f32)> = x.chunks_exact(16).map(|g| fit_affine(g, 3)).collect();
    let (d, sc) = quantize_sub_scales(&fits.iter().map(|f| f.0).collect::<Vec<_>>(), 4);
    let (dmin, mn) = quantize_sub_scales(&fits.iter().map(|f| f.1).collect::<Vec<_>>(), 4);
    out.extend((0..16).map(|j| sc[j] | (mn[j] << 4)));
    let mut qs = [0u8; 64];
    for (i, &v) in x.iter().enumerate() {
        let (s, m) = (d * sc[i / 16] as f32, dmin * mn[i / 16] as f32);
        let q = code(v, s, m, 3);
        let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
        qs[32 * n + l] |= q << (2 * j);
    }
    out.extend_from_slice(&qs);
    push_f16(out, d);
    push_f16(out, dmin);
}

fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    let fits: Vec<f32> = x
        .chunks_exact(16)
        .map(|g| fit_symmetric(g, -4, 3))
        .collect();
    let smax = fits.iter().copied().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = round_f16(smax / 31.0);
    let ls: Vec<i32> = fits
        .iter()
        .map(|&s| {
            if d == 0.0 {
                0
            } else {
                (s / d).round().clamp(-32.0, 31.0) as i32
            }
        })
        .collect();
    let (mut hmask, mut qs) = ([0u8; 32], [0u8; 64]);
    for (i, &v) in x.iter().enumerate() {
        let s = d * ls[i / 16] as f32;
        let q = if s == 0.0 {
            0
        } else {
            (v / s).round().clamp(-4.0, 3.0) as i32
        };
        let u = (q + 4) as u8;
        let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
        qs[32 * n + l] |= (u & 3) << (2 * j);
        if u >= 4 {
            hmask[l] |= 1 << (4 * n + j);
        }
    }
    let mut scales = [0u8; 12];
    for (j, &l) in ls.iter().enumerate() {
        let u = (l + 32) as u8;
        if j < 8 {
            scales[j] |= u & 0xF;
        } else {
            scales[j - 8] |= (u & 0xF) << 4;
        }
        scales[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&qs);
    out.extend_from_slice(&scales);
    push_f16(out, d);
}

/// Packs eight 6-bit (scale, min) pairs as ggml's `get_scale_min_k4` reads them.
fn pack_k4_scales(sc: &[u8], mn: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] |= sc[j];
            s[j + 4] |= mn[j];
        } else {
            s[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (mn[j] >> 4) << 6;
        }
    }
    debug_assert!((0..8).all(|j| k4_scale_min(j, &s) == (sc[j], mn[j])));
    s
}

/// Q4_K (`five == false`) or Q5_K: eight 32-element sub-blocks.
fn q45_k(x: &[f32], out: &mut Vec<u8>, five: bool) {
    let nmax = if five { 31 } else { 15 };
    let fits: Vec<(f32, f32)> = x.chunks_exact(32).map(|g| fit_affine(g, nmax)).collect();
    let (d, sc) = quantize_sub_scales(&fits.iter().map(|f| f.0).collect::<Vec<_>>(), 6);
    let (dmin, mn) = quantize_sub_scales(&fits.iter().map(|f| f.1).collect::<Vec<_>>(), 6);
    push_f16(out, d);
    push_f16(out, dmin);
    out.extend_from_slice(&pack_k4_scales(&sc, &mn));
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| code(v, d * sc[i / 32] as f32, dmin * mn[i / 32] as f32, nmax))
        .collect();
    if five {
        let mut qh = [0u8; 32];
        for (i, &c) in q.iter().enumerate() {
            qh[i % 32] |= (c >> 4) << (i / 32);
        }
        out.extend_from_slice(&qh);
    }
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4)));
    }
}

fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let fits: Vec<f32> = x
        .chunks_exact(16)
        .map(|g| fit_symmetric(g, -32, 31))
        .collect();
    let smax = fits.iter().copied().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = round_f16(smax / 127.0);
    let sc: Vec<i8> = fits
        .iter()
        .map(|&s| {
            if d == 0.0 {
                0
            } else {
                (s / d).round().clamp(-128.0, 127.0) as i8
            }
        })
        .collect();
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = d * sc[i / 16] as f32;
            let q = if s == 0.0 {
                0.0
            } else {
                (v / s).round().clamp(-32.0, 31.0)
            };
            (q as i32 + 32) as u8
        })
        .collect();
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for n in 0..2 {
        for l in 0..32 {
            let [q1, q2, q3, q4] = [0, 1, 2, 3].map(|t| q[128 * n + 32 * t + l]);
            ql[64 * n + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[64 * n + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[32 * n + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    push_f16(out, d);
}

fn q8_k(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    out.extend_from_slice(&d.to_le_bytes());
    let q: Vec<i8> = x
        .iter()
        .map(|&v| {
            if d == 0.0 {
                0
            } else {
                (v / d).round().clamp(-127.0, 127.0) as i8
            }
        })
        .collect();
    out.extend(q.iter().map(|&v| v as u8));
    for g in q.chunks_exact(16) {
        let s: i16 = g.iter().map(|&v| v as i16).sum();
        out.extend_from_slice(&s.to_le_bytes());
    }
    debug_assert_eq!(x.len(), QK_K);
}
