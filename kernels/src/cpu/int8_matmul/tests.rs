//! Accuracy of the int8-activation kernels.
//!
//! Three references, from strict to loose:
//! 1. **The same integers in f64** (`int8_reference`): the activations quantized by the
//!    same code, the integer dot products exact, scales applied in f64. Every ISA must
//!    agree with it to f32 rounding (relative 1e-5 of `Σ|dw·dx·qw·qx|`), since the only
//!    difference is the f32 accumulation order.
//! 2. **The exact product** of the dequantized weights and the f32 activations in f64
//!    (`exact_reference`). The int8 path differs by the activation rounding only:
//!    each `x` moves by at most `dx/2 = amax_block/254`, so
//!    `|err| ≤ Σ_blocks amax_block/254 · Σ_block |w|` — the hard bound tested
//!    (plus f32 slack). Its typical size is far smaller (random signs):
//!    ≈ `sqrt(k/12) · rms(w) · amax/127`; the tests also check the RMS error over
//!    all outputs against 1% of the RMS output.
//! 3. **The f32 path** (`matmul_impl`): within the same bound of the int8 path.

use super::*;
use crate::backend::Precision;
use crate::matmul::matmul_impl;

struct Lcg(u64);
impl Lcg {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

const FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
];

/// `(m, n, k)`: decode and prefill sizes, k not a multiple of 64 or 256 (odd block
/// counts take the kernels' one-block tail), n not a multiple of 4, m past one tile
/// and past one 64-row task chunk; the last one quantizes its activations in parallel.
const SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 32),
    (1, 7, 96),
    (1, 33, 576),
    (2, 13, 160),
    (3, 18, 1536),
    (4, 4, 544),
    (5, 9, 224),
    (17, 21, 288),
    (70, 10, 608),
    (64, 5, 1536),
];

/// The activations quantized by the portable quantizer (bit-identical to the AVX-512
/// one, checked in `quantizers_agree`).
fn quantize_scalar(x: &[f32], m: usize, k: usize) -> QuantizedActs {
    let mut a = QuantizedActs::default();
    a.resize(m, k);
    let nb = k / QK;
    for i in 0..m {
        // SAFETY: `resize` made room for m rows.
        unsafe {
            quantize_row_scalar(
                &x[i * k..(i + 1) * k],
                a.q.as_mut_ptr().add(i * k),
                a.dx8.as_mut_ptr().add(i * nb * 8),
                a.sx.as_mut_ptr().add(i * padded_blocks(nb)),
            )
        };
    }
    a
}

/// Weight blocks decoded to (scale, offset-per-unit, integer values) in f64.
fn weight_blocks(w: &WeightMatrix, r: usize) -> Vec<(f64, f64, [i32; 32])> {
    let bytes = w.row_bytes(r).unwrap();
    let h = |i: usize| half::f16::from_bits(u16::from_le_bytes([bytes[i], bytes[i + 1]])).to_f64();
    let bb = w.format().block_bytes();
    (0..w.cols() / QK)
        .map(|b| {
            let o = b * bb;
            let mut q = [0i32; 32];
            match w.format() {
                WeightFormat::Q8_0 => {
                    for (j, v) in q.iter_mut().enumerate() {
                        *v = bytes[o + 2 + j] as i8 as i32;
                    }
                    (h(o), 0.0, q)
                }
                f => {
                    // ggml layouts: d, [m], [qh: u32, bit e → bit 4 of element e], nibbles.
                    let (off, five) = match f {
                        WeightFormat::Q4_0 => (2, false),
                        WeightFormat::Q4_1 => (4, false),
                        WeightFormat::Q5_0 => (6, true),
                        _ => (8, true),
                    };
                    let qh = if five {
                        u32::from_le_bytes(bytes[o + off - 4..o + off].try_into().unwrap())
                    } else {
                        0
                    };
                    for j in 0..16 {
                        q[j] = (bytes[o + off + j] & 0xF) as i32;
                        q[j + 16] = (bytes[o + off + j] >> 4) as i32;
                    }
                    for (e, v) in q.iter_mut().enumerate() {
                        *v += (((qh >> e) & 1) as i32) << 4;
                    }
                    let min = match f {
                        WeightFormat::Q4_0 => -8.0 * h(o),
                        WeightFormat::Q5_0 => -16.0 * h(o),
                        _ => h(o + 2),
                    };
                    (h(o), min, q)
                }
            }
        })
        .collect()
}

/// Reference 1: exact integer dots of the quantized activations, scaled in f64.
/// Returns the outputs and, per output, `Σ |dw·dx·qw·qx| + |min·sx|` (the scale of
/// the f32 rounding error).
fn int8_reference(x: &[f32], m: usize, w: &WeightMatrix) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.rows(), w.cols());
    let nb = k / QK;
    let a = quantize_scalar(x, m, k);
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for r in 0..n {
        let blocks = weight_blocks(w, r);
        for i in 0..m {
            let (mut s, mut g) = (0.0f64, 0.0f64);
            for (b, (dw, min, qw)) in blocks.iter().enumerate() {
                let dx = a.dx8[(i * nb + b) * 8] as f64;
                let qx = &a.q[i * k + b * QK..i * k + (b + 1) * QK];
                let dot: i64 = qw.iter().zip(qx).map(|(&p, &q)| p as i64 * q as i64).sum();
                let abs: i64 = qw
                    .iter()
                    .zip(qx)
                    .map(|(&p, &q)| (p as i64 * q as i64).abs())
                    .sum();
                let qsum: i64 = qx.iter().map(|&q| q as i64).sum();
                s += dw * dx * dot as f64 + min * dx * qsum as f64;
                g += (dw * dx).abs() * abs as f64 + (min * dx * qsum as f64).abs();
            }
            out[i * n + r] = s;
            mag[i * n + r] = g;
        }
    }
    (out, mag)
}

/// Reference 2: the dequantized weights times the exact activations, in f64, and the
/// hard bound of the activation rounding, `Σ_blocks amax/254 · Σ|w|`.
fn exact_reference(x: &[f32], m: usize, w: &WeightMatrix) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.rows(), w.cols());
    let wd = w.to_f32_vec();
    let mut out = vec![0.0; m * n];
    let mut bound = vec![0.0; m * n];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for r in 0..n {
            let wr = &wd[r * k..(r + 1) * k];
            out[i * n + r] = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
            bound[i * n + r] = xr
                .chunks_exact(QK)
                .zip(wr.chunks_exact(QK))
                .map(|(xb, wb)| {
                    let amax = xb.iter().fold(0.0f64, |a, v| a.max(v.abs() as f64));
                    amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                })
                .sum();
        }
    }
    (out, bound)
}

fn data(m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut g = Lcg(seed + m as u64 * 1000 + n as u64 * 7 + k as u64);
    // Activations with a few outliers per row, as hidden states have.
    let x = (0..m * k)
        .map(|i| if i % 97 == 5 { 6.0 * g.f() } else { g.f() })
        .collect();
    let w = (0..n * k).map(|_| 0.1 * g.f()).collect();
    (x, w)
}

fn run(isa: Int8Isa, x: &[f32], m: usize, w: &WeightMatrix, pool: &ThreadPool) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.rows()];
    matmul_int8(pool, x, m, w, &mut out, isa).unwrap();
    out
}

/// The ISAs this machine runs; prints the ones it skips.
fn available_isas(test: &str) -> Vec<Int8Isa> {
    Int8Isa::ALL
        .into_iter()
        .filter(|isa| {
            let ok = isa.available();
            if !ok {
                println!("{test}: SKIPPED {isa:?} (this CPU lacks it)");
            }
            ok
        })
        .collect()
}

/// Every available ISA's output, for each format and shape, against `reference` (an
/// exact model of the kernel's integer arithmetic, with each output's magnitude), within
/// the f32 rounding of the final sums.
fn assert_every_isa_matches(
    test: &str,
    formats: &[WeightFormat],
    shapes: &[(usize, usize, usize)],
    seed: u64,
    reference: impl Fn(&[f32], usize, &WeightMatrix) -> (Vec<f64>, Vec<f64>),
) {
    let pool = ThreadPool::new(2);
    for isa in available_isas(test) {
        for &f in formats {
            for &(m, n, k) in shapes {
                let (x, wf) = data(m, n, k, seed);
                let w = WeightMatrix::from_f32(n, k, wf)
                    .unwrap()
                    .to_format(f)
                    .unwrap();
                let (r, mag) = reference(&x, m, &w);
                let out = run(isa, &x, m, &w, &pool);
                for (j, (&o, (&e, &g))) in out.iter().zip(r.iter().zip(&mag)).enumerate() {
                    assert!(
                        (o as f64 - e).abs() <= 1e-5 * g + 1e-30,
                        "{isa:?} {f:?} m={m} n={n} k={k} out {j}: {o} vs {e} (scale {g})"
                    );
                }
            }
        }
    }
}

#[test]
fn every_isa_matches_the_integer_reference() {
    assert_every_isa_matches(
        "every_isa_matches_the_integer_reference",
        &FORMATS,
        &SHAPES,
        1,
        int8_reference,
    );
}

/// For each format: the int8 path within the activation-rounding bound of the exact
/// result and of the f32 path on every output, and its RMS error under 1% of the RMS
/// output (printed next to the f32 path's).
fn assert_within_rounding_bound(
    test: &str,
    formats: &[WeightFormat],
    shapes: &[(usize, usize, usize)],
    seed: u64,
) {
    let pool = ThreadPool::new(2);
    let Some(isa) = Int8Isa::detect() else {
        println!("{test}: SKIPPED (no AVX2)");
        return;
    };
    let level = crate::cpu::features().best_isa();
    for &f in formats {
        let (mut se, mut so, mut se_f32) = (0.0f64, 0.0f64, 0.0f64);
        for &(m, n, k) in shapes {
            let (x, wf) = data(m, n, k, seed);
            let w = WeightMatrix::from_f32(n, k, wf)
                .unwrap()
                .to_format(f)
                .unwrap();
            let (exact, bound) = exact_reference(&x, m, &w);
            let out = run(isa, &x, m, &w, &pool);
            let mut f32_out = vec![0.0; m * n];
            matmul_impl(&pool, &x, m, &w, &mut f32_out, level, Precision::Exact).unwrap();
            for j in 0..m * n {
                let (o, e, b) = (out[j] as f64, exact[j], bound[j]);
                // f32 accumulation slack on top of the rounding bound.
                let slack = 1e-5 * (1.0 + e.abs()) * (k as f64).sqrt();
                assert!(
                    (o - e).abs() <= b + slack,
                    "{isa:?} {f:?} m={m} n={n} k={k} out {j}: int8 {o} vs exact {e}, bound {b}"
                );
                let of = f32_out[j] as f64;
                assert!(
                    (o - of).abs() <= b + 2.0 * slack,
                    "{isa:?} {f:?} m={m} n={n} k={k} out {j}: int8 {o} vs f32 path {of}, bound {b}"
                );
                se += (o - e).powi(2);
                se_f32 += (of - e).powi(2);
                so += e * e;
            }
        }
        let rel = (se / so).sqrt();
        println!(
            "{f:?}: int8 RMS error {rel:.2e} of RMS output (f32 path {:.2e})",
            (se_f32 / so).sqrt()
        );
        assert!(rel < 0.01, "{f:?}: relative RMS error {rel}");
    }
}

#[test]
fn int8_error_is_within_the_activation_rounding_bound() {
    assert_within_rounding_bound(
        "int8_error_is_within_the_activation_rounding_bound",
        &FORMATS,
        &SHAPES,
        2,
    );
}

#[test]
fn quantizers_agree() {
    let (m, k) = (3, 608);
    let (mut x, _) = data(m, 1, k, 3);
    // A zero block, and a block whose other values round to small codes.
    x[32..64].fill(0.0);
    x[70] = 1e6;
    let a = quantize_scalar(&x, m, k);
    // Every SIMD level quantizes exactly like the portable code.
    for level in crate::cpu::CpuIsa::available() {
        let mut b = QuantizedActs::default();
        quantize_acts_at(&ThreadPool::new(1), &x, m, k, &mut b, level);
        assert_eq!(a.q[..m * k], b.q[..m * k], "{level}");
        assert_eq!(a.dx8[..m * k / 4], b.dx8[..m * k / 4], "{level}");
        assert_eq!(a.sx, b.sx, "{level}");
    }
    // Rounding is to nearest: every value within dx/2 of its original.
    let nb = k / QK;
    for i in 0..m {
        for j in 0..k {
            let d = a.dx8[(i * nb + j / QK) * 8];
            let back = a.q[i * k + j] as f32 * d;
            assert!((back - x[i * k + j]).abs() <= d * 0.5001 + 1e-7);
        }
    }
}

#[test]
fn zero_and_nonfinite_rows() {
    let pool = ThreadPool::new(2);
    let Some(isa) = Int8Isa::detect() else {
        println!("zero_and_nonfinite_rows: SKIPPED (no AVX2)");
        return;
    };
    let (n, k) = (5, 96);
    let (_, wf) = data(1, n, k, 4);
    let w = WeightMatrix::from_f32(n, k, wf)
        .unwrap()
        .to_format(WeightFormat::Q4_1)
        .unwrap();
    // An all-zero block (scale 0) is exact, and a NaN row does not leak into its
    // neighbours.
    let mut x = vec![0.0f32; 3 * k];
    x[k..2 * k].fill(f32::NAN);
    x[2 * k + 40] = 1.0;
    let out = run(isa, &x, 3, &w, &pool);
    assert!(out[..n].iter().all(|v| *v == 0.0), "{out:?}");
    assert!(out[n..2 * n].iter().all(|v| v.is_nan()));
    assert!(out[2 * n..].iter().all(|v| v.is_finite()));
}

#[test]
fn errors_and_switch_names() {
    let pool = ThreadPool::new(1);
    let w = WeightMatrix::from_f32(2, 32, vec![0.0; 64]).unwrap();
    let mut out = [0.0; 2];
    if let Some(isa) = Int8Isa::detect() {
        assert!(
            matmul_int8(&pool, &[0.0; 32], 1, &w, &mut out, isa).is_err(),
            "f32 weights"
        );
        let q = w.to_format(WeightFormat::Q8_0).unwrap();
        assert!(
            matmul_int8(&pool, &[0.0; 31], 1, &q, &mut out, isa).is_err(),
            "short x"
        );
    }
    for isa in Int8Isa::ALL.into_iter().filter(|i| !i.available()) {
        let q = w.to_format(WeightFormat::Q8_0).unwrap();
        assert!(matmul_int8(&pool, &[0.0; 32], 1, &q, &mut out, isa).is_err());
    }
    assert_eq!("f32".parse::<CpuMatmul>().unwrap(), CpuMatmul::F32);
    assert_eq!("int8".parse::<CpuMatmul>().unwrap(), CpuMatmul::Int8);
    assert_eq!("auto".parse::<CpuMatmul>().unwrap(), CpuMatmul::Auto);
    assert!("fp8".parse::<CpuMatmul>().is_err());
    assert_eq!(CpuMatmul::F32.resolve(), CpuMatmul::F32);
    assert_ne!(CpuMatmul::Auto.resolve(), CpuMatmul::Auto);
}

mod kquant;
mod kquant_small_m;
