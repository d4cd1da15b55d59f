//! The fused decode kernels for Q4_K / Q5_K / Q6_K (`kquant_small_m`), `m ≤ 4`:
//! 1. against an integer model written here: the weight codes and scales read from the
//!    GGUF block bytes, the dot products of codes and quantized activations exact in
//!    i64 per sub-block, the float folding in f64 — within f32 rounding;
//! 2. against the exact f64 product of the dequantized weights and the f32 activations,
//!    within the per-256 activation rounding bound `Σ_blocks amax/254 · Σ|w|`.

use super::*;
use crate::cpu::int8_matmul::kquant_small_m::{ActsK, QK_K, SMALL_M};

/// `(m, n, k)`: one to four rows, one to ten super-blocks, `n` spanning one to several
/// tasks and not a multiple of 4.
const SHAPES_K: [(usize, usize, usize); 7] = [
    (1, 1, 256),
    (1, 7, 256),
    (1, 33, 1536),
    (2, 13, 512),
    (3, 18, 768),
    (4, 5, 1024),
    (4, 37, 2560),
];

const FUSED: [WeightFormat; 3] = [WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K];

fn f16_at(b: &[u8], i: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f64()
}

/// One super-block as integers: `w[e] = scale[e/sub]·(code[e] − bias) − offset[e/sub]`
/// with f64 `scale`, `offset` per sub-block of `sub` elements.
struct SuperBlock {
    sub: usize,
    scale: Vec<f64>,
    offset: Vec<f64>,
    codes: [i64; 256],
    bias: i64,
}

/// Reads super-block `b` (its bytes) of `format` straight from the GGUF layout.
fn super_block(format: WeightFormat, b: &[u8]) -> SuperBlock {
    let mut codes = [0i64; 256];
    match format {
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let s = &b[4..16];
            let five = format == WeightFormat::Q5_K;
            let qs = if five { &b[48..176] } else { &b[16..144] };
            let (mut scale, mut offset) = (vec![0.0; 8], vec![0.0; 8]);
            for j in 0..8 {
                // The 6-bit packing of llama.cpp's get_scale_min_k4.
                let (sc, mn) = if j < 4 {
                    (s[j] & 63, s[j + 4] & 63)
                } else {
                    (
                        (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                        (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                    )
                };
                scale[j] = d * sc as f64;
                offset[j] = dmin * mn as f64;
                for l in 0..32 {
                    let byte = qs[32 * (j / 2) + l];
                    let mut q = if j % 2 == 0 { byte & 0xF } else { byte >> 4 } as i64;
                    if five {
                        q += (((b[16 + l] >> j) & 1) as i64) << 4;
                    }
                    codes[32 * j + l] = q;
                }
            }
            SuperBlock {
                sub: 32,
                scale,
                offset,
                codes,
                bias: 0,
            }
        }
        WeightFormat::Q6_K => {
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            for (e, c) in codes.iter_mut().enumerate() {
                // llama.cpp's dequantize_row_q6_K: 128-element halves, 32-element quarters.
                let (half, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
                let byte = ql[64 * half + 32 * (quarter % 2) + l];
                let lo = if quarter < 2 { byte & 0xF } else { byte >> 4 };
                let hi = (qh[32 * half + l] >> (2 * quarter)) & 3;
                *c = (lo | (hi << 4)) as i64;
            }
            SuperBlock {
                sub: 16,
                scale: sc.iter().map(|&v| d * v as i8 as f64).collect(),
                offset: vec![0.0; 16],
                codes,
                bias: 32,
            }
        }
        other => unreachable!("{other:?}"),
    }
}

/// Reference 1: exact integer dots of codes and quantized activations, f64 folding;
/// with each output's magnitude `Σ|terms|`.
fn fused_reference(x: &[f32], m: usize, w: &WeightMatrix) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.rows(), w.cols());
    let mut acts = ActsK::default();
    acts.quantize(x, m, k);
    let bb = w.format().block_bytes();
    let (mut out, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for r in 0..n {
        let bytes = w.row_bytes(r).unwrap();
        for sb in 0..k / QK_K {
            let blk = super_block(w.format(), &bytes[sb * bb..(sb + 1) * bb]);
            for i in 0..m {
                let dx = acts.d[i * (k / QK_K) + sb] as f64;
                let qx = &acts.q[i * k + sb * QK_K..i * k + (sb + 1) * QK_K];
                let (mut s, mut g) = (0.0f64, 0.0f64);
                for (j, (codes, xs)) in blk
                    .codes
                    .chunks(blk.sub)
                    .zip(qx.chunks(blk.sub))
                    .enumerate()
                {
                    let dot: i64 = codes
                        .iter()
                        .zip(xs)
                        .map(|(&c, &q)| (c - blk.bias) * q as i64)
                        .sum();
                    let abs: i64 = codes
                        .iter()
                        .zip(xs)
                        .map(|(&c, &q)| ((c - blk.bias) * q as i64).abs())
                        .sum();
                    let sum: i64 = xs.iter().map(|&q| q as i64).sum();
                    s += dx * (blk.scale[j] * dot as f64 - blk.offset[j] * sum as f64);
                    g += dx.abs()
                        * (blk.scale[j].abs() * abs as f64 + (blk.offset[j] * sum as f64).abs());
                }
                out[i * n + r] += s;
                mag[i * n + r] += g;
            }
        }
    }
    (out, mag)
}

#[test]
fn fused_kquants_match_the_integer_reference_on_every_isa() {
    assert_every_isa_matches(
        "fused_kquants_match_the_integer_reference_on_every_isa",
        &FUSED,
        &SHAPES_K,
        21,
        fused_reference,
    );
}

/// Reference 2, with the per-256 rounding bound, and the RMS error under 3% of the RMS
/// output: with one outlier of up to 6 per 97 values (`data`), every 256-block's `amax`
/// is near 6, so the rounding noise per value is `≈ 6/127/√12 ≈ 0.014` against an RMS
/// activation of `≈ 0.7`: a relative output error of about 2% expected (the per-32
/// kernels see most blocks without an outlier, hence their 1% limit).
#[test]
fn fused_kquants_are_within_the_activation_rounding_bound() {
    let pool = ThreadPool::new(2);
    for isa in available_isas("fused_kquants_are_within_the_activation_rounding_bound") {
        for f in FUSED {
            let (mut se, mut so) = (0.0f64, 0.0f64);
            for (m, n, k) in SHAPES_K {
                let (x, wf) = data(m, n, k, 22);
                let w = WeightMatrix::from_f32(n, k, wf)
                    .unwrap()
                    .to_format(f)
                    .unwrap();
                let wd = w.to_f32_vec();
                let out = run(isa, &x, m, &w, &pool);
                for i in 0..m {
                    let xr = &x[i * k..(i + 1) * k];
                    for r in 0..n {
                        let wr = &wd[r * k..(r + 1) * k];
                        let exact: f64 =
                            xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let bound: f64 = xr
                            .chunks_exact(QK_K)
                            .zip(wr.chunks_exact(QK_K))
                            .map(|(xb, wb)| {
                                let amax = xb.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64));
                                amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                            })
                            .sum();
                        let o = out[i * n + r] as f64;
                        let slack = 1e-5 * (1.0 + exact.abs()) * (k as f64).sqrt();
                        assert!(
                            (o - exact).abs() <= bound + slack,
                            "{isa:?} {f:?} m={m} n={n} k={k} ({i},{r}): {o} vs {exact}, bound {bound}"
                        );
                        se += (o - exact).powi(2);
                        so += exact * exact;
                    }
                }
            }
            let rel = (se / so).sqrt();
            println!("{isa:?} {f:?}: fused int8 RMS error {rel:.2e} of RMS output");
            assert!(rel < 0.03, "{isa:?} {f:?}: relative RMS error {rel}");
        }
    }
}

/// The per-256 quantizer: `dx = amax/127`, every value within `dx/2` of its original,
/// the block sums the sums of the codes; a zero block is exact and a NaN poisons its
/// block's scale only.
#[test]
fn per_256_activation_quantizer() {
    let (m, k) = (2, 768);
    let (mut x, _) = data(m, 1, k, 23);
    x[256..512].fill(0.0);
    x[k + 3] = f32::NAN;
    let mut a = ActsK::default();
    a.quantize(&x, m, k);
    for i in 0..m {
        for b in 0..k / QK_K {
            let blk = &x[i * k + b * QK_K..i * k + (b + 1) * QK_K];
            let d = a.d[i * (k / QK_K) + b];
            if i == 1 && b == 0 {
                assert!(d.is_nan());
                continue;
            }
            let amax = blk.iter().fold(0.0f32, |s, v| s.max(v.abs()));
            assert_eq!(d, amax / 127.0);
            for (j, &v) in blk.iter().enumerate() {
                let q = a.q[i * k + b * QK_K + j];
                assert!(q.unsigned_abs() <= 127);
                assert!(
                    (q as f32 * d - v).abs() <= d * 0.5001 + 1e-7,
                    "{v} → {q}·{d}"
                );
            }
        }
        for (g, s) in a.q[i * k..(i + 1) * k]
            .chunks(16)
            .zip(&a.bsums[i * k / 16..(i + 1) * k / 16])
        {
            assert_eq!(g.iter().map(|&v| v as i32).sum::<i32>(), *s as i32);
        }
    }
    assert!(a.q[256..512].iter().all(|&v| v == 0));
}

/// A NaN activation row gives NaN outputs and leaves the other rows finite; a zero row
/// gives exact zeros.
#[test]
fn fused_kquants_zero_and_nonfinite_rows() {
    let pool = ThreadPool::new(2);
    let (n, k) = (6, 512);
    let (_, wf) = data(1, n, k, 24);
    for isa in available_isas("fused_kquants_zero_and_nonfinite_rows") {
        for f in FUSED {
            let w = WeightMatrix::from_f32(n, k, wf.clone())
                .unwrap()
                .to_format(f)
                .unwrap();
            let mut x = vec![0.0f32; 3 * k];
            x[k + 300] = f32::NAN;
            x[2 * k + 40] = 1.0;
            assert!(crate::cpu::int8_matmul::kquant_small_m::applies(f, 3));
            let out = run(isa, &x, 3, &w, &pool);
            assert!(out[..n].iter().all(|v| *v == 0.0), "{f:?} {out:?}");
            assert!(out[n..2 * n].iter().all(|v| v.is_nan()), "{f:?} {out:?}");
            assert!(out[2 * n..].iter().all(|v| v.is_finite()), "{f:?} {out:?}");
        }
    }
    const { assert!(SMALL_M >= 4) };
}
