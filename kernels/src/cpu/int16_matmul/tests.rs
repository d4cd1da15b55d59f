//! The int16-activation kernels, the dot-product ones (`m ≤ 4`) and the tiled one:
//! 1. against an integer model written here: codes and scales read from the GGUF block
//!    bytes, the activations quantized by the portable [`quantize_row`], each block's
//!    `Σ q·qx` exact in i64 and the float folding in f64 — within f32 rounding;
//! 2. against the exact f64 product of the dequantized weights and the f32 activations,
//!    within the activation rounding bound `Σ_blocks amax/65534 · Σ|dw·code|` (the
//!    codes before the offset: `mt·Σx` is exact);
//! 3. the AVX2 quantizer against the portable one, several products against one by one,
//!    non-finite activations, refused shapes.

use super::*;

const FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
];

/// `(m, n, k)`: one to four rows (the dot-product kernels), then 5 to 130 (the tiled
/// one: partial 8-row tiles, one and several 64-row tasks); one to 48 blocks (whole and
/// partial groups of eight, the tiled kernel's step along K); `n` spanning one to
/// several tasks, partial 6-row tiles and 24-row panels, not a multiple of 4.
const SHAPES: [(usize, usize, usize); 15] = [
    (1, 1, 32),
    (1, 7, 96),
    (1, 67, 576),
    (2, 13, 256),
    (3, 18, 608),
    (4, 5, 1536),
    (4, 37, 288),
    (1, 129, 1536),
    (5, 1, 32),
    (7, 7, 96),
    (8, 24, 256),
    (13, 31, 608),
    (33, 53, 320),
    (64, 25, 1536),
    (130, 49, 288),
];

fn f16_at(b: &[u8], i: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f64()
}

/// Block `b` (its bytes) of `format` as `(dw, mt, codes)` with `w = dw·code + mt`.
fn block(format: WeightFormat, b: &[u8]) -> (f64, f64, [i64; 32]) {
    let d = f16_at(b, 0);
    let mut c = [0i64; 32];
    let nibbles = |c: &mut [i64; 32], qs: &[u8]| {
        for j in 0..16 {
            c[j] = (qs[j] & 0xF) as i64;
            c[j + 16] = (qs[j] >> 4) as i64;
        }
    };
    let high = |c: &mut [i64; 32], qh: &[u8]| {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (e, v) in c.iter_mut().enumerate() {
            *v |= (((bits >> e) & 1) as i64) << 4;
        }
    };
    match format {
        WeightFormat::Q8_0 => {
            for (j, v) in c.iter_mut().enumerate() {
                *v = b[2 + j] as i8 as i64;
            }
            (d, 0.0, c)
        }
        WeightFormat::Q4_0 => {
            nibbles(&mut c, &b[2..18]);
            (d, -8.0 * d, c)
        }
        WeightFormat::Q4_1 => {
            nibbles(&mut c, &b[4..20]);
            (d, f16_at(b, 2), c)
        }
        WeightFormat::Q5_0 => {
            nibbles(&mut c, &b[6..22]);
            high(&mut c, &b[2..6]);
            (d, -16.0 * d, c)
        }
        _ => {
            nibbles(&mut c, &b[8..24]);
            high(&mut c, &b[4..8]);
            (d, f16_at(b, 2), c)
        }
    }
}

fn bytes_per_block(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q8_0 => 34,
        WeightFormat::Q4_0 => 18,
        WeightFormat::Q4_1 => 20,
        WeightFormat::Q5_0 => 22,
        _ => 24,
    }
}

/// Deterministic weights with varied magnitudes per block (and some all-zero blocks).
fn weights(n: usize, k: usize, format: WeightFormat, seed: usize) -> WeightMatrix {
    let v: Vec<f32> = (0..n * k)
        .map(|i| {
            let blk = i / 32;
            if blk % 11 == 5 {
                return 0.0;
            }
            let scale = 0.02 + ((blk * 7 + seed) % 13) as f32 * 0.05;
            let u = ((i * 2654435761 + seed * 97) % 1000) as f32 / 1000.0;
            (u - 0.3) * scale
        })
        .collect();
    WeightMatrix::from_f32(n, k, v)
        .unwrap()
        .to_format(format)
        .unwrap()
}

/// Activations with outliers (as the hidden states of a transformer have).
fn activations(m: usize, k: usize, seed: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            let u = ((i * 40503 + seed * 131) % 977) as f32 / 977.0 - 0.5;
            if i % 97 == 3 {
                u * 40.0
            } else {
                u
            }
        })
        .collect()
}

fn has_kernels() -> bool {
    let ok = crate::cpu::features().has_avx2_kernels();
    if !ok {
        println!("int16 kernels: SKIPPED (no AVX2 + FMA + F16C)");
    }
    ok
}

#[test]
fn equals_the_integer_model_within_f32_rounding() {
    if !has_kernels() {
        return;
    }
    let pool = ThreadPool::new(2);
    for format in FORMATS {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let w = weights(n, k, format, s);
            let x = activations(m, k, s);
            let mut out = vec![0.0f32; m * n];
            matmul(&pool, &x, m, &w, &mut out).unwrap();
            let nb = k / QK;
            let bb = bytes_per_block(format);
            for i in 0..m {
                let (mut q, mut dx, mut sx) = (vec![0i16; k], vec![0.0; nb], vec![0.0; nb]);
                quantize_row(&x[i * k..(i + 1) * k], &mut q, &mut dx, &mut sx);
                for j in 0..n {
                    let bytes = w.row_bytes(j).unwrap();
                    let (mut want, mut size) = (0.0f64, 0.0f64);
                    for b in 0..nb {
                        let (dw, mt, c) = block(format, &bytes[b * bb..(b + 1) * bb]);
                        let dot: i64 = (0..32).map(|e| c[e] * q[b * QK + e] as i64).sum();
                        let t1 = dw * dx[b] as f64 * dot as f64;
                        let t2 = mt * sx[b] as f64;
                        want += t1 + t2;
                        let abs: i64 = (0..32).map(|e| (c[e] * q[b * QK + e] as i64).abs()).sum();
                        size += (dw * dx[b] as f64 * abs as f64).abs() + t2.abs();
                    }
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * size + 1e-30,
                        "{format:?} m={m} n={n} k={k} [{i},{j}]: {got} vs {want} (size {size})"
                    );
                }
            }
        }
    }
}

#[test]
fn within_the_activation_rounding_of_the_exact_product() {
    if !has_kernels() {
        return;
    }
    let pool = ThreadPool::new(2);
    for format in FORMATS {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let w = weights(n, k, format, s + 3);
            let x = activations(m, k, s + 5);
            let mut out = vec![0.0f32; m * n];
            matmul(&pool, &x, m, &w, &mut out).unwrap();
            let wf = w.to_f32_vec();
            let bb = bytes_per_block(format);
            let mut worst = 0.0f64;
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let wr = &wf[j * k..(j + 1) * k];
                    let bytes = w.row_bytes(j).unwrap();
                    let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    // amax/65534 per element times the scaled codes, plus f32 rounding.
                    let mut bound = 0.0f64;
                    let mut size = 0.0f64;
                    for b in 0..k / QK {
                        let xb = &xr[b * QK..(b + 1) * QK];
                        let wb = &wr[b * QK..(b + 1) * QK];
                        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
                        let (dw, _, c) = block(format, &bytes[b * bb..(b + 1) * bb]);
                        let csum: f64 = c.iter().map(|v| (dw * *v as f64).abs()).sum();
                        bound += amax / 65534.0 * csum;
                        size += xb
                            .iter()
                            .zip(wb)
                            .map(|(a, b)| (a * b).abs() as f64)
                            .sum::<f64>();
                    }
                    let err = (out[i * n + j] as f64 - want).abs();
                    worst = worst.max(err / (bound + 1e-30));
                    assert!(
                        err <= bound + 1e-6 * size + 1e-30,
                        "{format:?} m={m} n={n} k={k} [{i},{j}]: err {err} > bound {bound}"
                    );
                }
            }
            assert!(
                worst > 0.0 || k < 64,
                "{format:?}: no rounding at all is suspicious"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_quantizer_equals_the_portable_one() {
    if !has_kernels() {
        return;
    }
    let k = 1536;
    let mut x = activations(1, k, 9);
    x[40..72].fill(0.0); // an all-zero block
    x[100] = 1e-30; // a subnormal-scaled block
    let nb = k / QK;
    let (mut q0, mut d0, mut s0) = (vec![0i16; k], vec![0.0; nb], vec![0.0; nb]);
    let (mut q1, mut d1, mut s1) = (vec![0i16; k], vec![0.0; nb], vec![0.0; nb]);
    quantize_row(&x, &mut q0, &mut d0, &mut s0);
    // SAFETY: has_kernels() checked the features; the buffers are sized.
    unsafe { avx2::quantize_row(&x, &mut q1, &mut d1, &mut s1) };
    assert_eq!(q0, q1);
    assert_eq!(d0, d1);
    for (a, b) in s0.iter().zip(&s1) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
    }
    assert!(
        q0.iter().any(|&v| v == 32767 || v == -32767),
        "the block maximum maps to ±32767"
    );
}

#[test]
fn products_together_equal_products_one_by_one() {
    if !has_kernels() {
        return;
    }
    let pool = ThreadPool::new(2);
    let k = 576;
    let ws: Vec<WeightMatrix> = FORMATS
        .iter()
        .enumerate()
        .map(|(i, &f)| weights(40 + 17 * i, k, f, i))
        .collect();
    for m in [1, 2, 3, 4, 5, 8, 33, 70] {
        let x = activations(m, k, m);
        let mut one: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows()]).collect();
        for (w, o) in ws.iter().zip(one.iter_mut()) {
            matmul(&pool, &x, m, w, o).unwrap();
        }
        let mut all: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows()]).collect();
        let mut products: Vec<(&WeightMatrix, &mut [f32])> = ws
            .iter()
            .zip(all.iter_mut())
            .map(|(w, o)| (w, o.as_mut_slice()))
            .collect();
        matmul_each(&pool, &x, m, &mut products).unwrap();
        assert_eq!(one, all, "m={m}");
    }
}

#[test]
fn non_finite_activations_reach_the_output() {
    if !has_kernels() {
        return;
    }
    let pool = ThreadPool::new(1);
    let (n, k) = (3, 96);
    for format in FORMATS {
        let w = weights(n, k, format, 1);
        for (m, bad) in [
            (1, f32::NAN),
            (1, f32::INFINITY),
            (9, f32::NAN),
            (9, f32::INFINITY),
        ] {
            // Row m − 1 holds the bad value: its outputs, and only they, are not finite.
            let mut x = activations(m, k, 2);
            x[(m - 1) * k + 50] = bad;
            let mut out = vec![0.0f32; m * n];
            matmul(&pool, &x, m, &w, &mut out).unwrap();
            let (good, last) = out.split_at((m - 1) * n);
            assert!(
                last.iter().all(|v| !v.is_finite()) && good.iter().all(|v| v.is_finite()),
                "{format:?} m={m} {bad}: {out:?}"
            );
        }
    }
}

#[test]
fn refuses_what_it_has_no_kernel_for() {
    let pool = ThreadPool::new(1);
    let w = weights(2, 64, WeightFormat::Q4_1, 0);
    let f = WeightMatrix::from_f32(2, 64, vec![0.5; 128]).unwrap();
    let mut out = [0.0; 10];
    let x = vec![1.0; 5 * 64];
    assert!(
        matmul(&pool, &x[..0], 0, &w, &mut out[..0]).is_err(),
        "m = 0"
    );
    assert!(
        matmul(&pool, &x[..64], 1, &f, &mut out[..2]).is_err(),
        "f32 weights"
    );
    assert!(
        matmul(&pool, &x[..63], 1, &w, &mut out[..2]).is_err(),
        "short x"
    );
    assert!(!applies(WeightFormat::Q4_K, 1));
    assert!(!applies(WeightFormat::Q4_1, 0));
}
