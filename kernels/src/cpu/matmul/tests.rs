//! Unit tests.
use super::*;

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

const ALL: [WeightFormat; 8] = [
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::BF16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
];

fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    let mut o = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            o[i * n + j] = (0..k)
                .map(|l| x[i * k + l] as f64 * w[j * k + l] as f64)
                .sum();
        }
    }
    o
}

fn check(format: WeightFormat, m: usize, n: usize, k: usize, isa: CpuIsa, pool: &ThreadPool) {
    let mut g = Lcg(m as u64 * 1000 + n as u64 * 7 + k as u64);
    let x: Vec<f32> = (0..m * k).map(|_| g.f()).collect();
    let wf: Vec<f32> = (0..n * k).map(|_| g.f()).collect();
    let w = WeightMatrix::from_f32(n, k, wf)
        .unwrap()
        .to_format(format)
        .unwrap();
    let wd = w.to_f32_vec(); // reference uses the decoded weights
    let r = reference(&x, m, &wd, n, k);
    let mut out = vec![f32::NAN; m * n];
    matmul_impl(pool, &x, m, &w, &mut out, isa, Precision::Exact).unwrap();
    for (a, b) in out.iter().zip(&r) {
        assert!(
            (*a as f64 - b).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
            "{format:?} m={m} n={n} k={k} at {isa}: {a} vs {b}"
        );
    }
}

#[test]
fn all_formats_match_reference() {
    let pool = ThreadPool::new(2);
    for f in ALL {
        for &(m, n, k) in &[
            (1, 37, 64),
            (3, 21, 96),
            (5, 19, 32),
            (67, 35, 160),
            (130, 50, 64),
            (4, 4, 32),
            (2, 23, 96),
            // K past one block of the AVX2 outer-product kernel, n past one panel.
            (33, 53, 320),
            (17, 30, 288),
        ] {
            for isa in CpuIsa::available() {
                check(f, m, n, k, isa, &pool);
            }
        }
    }
    for f in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for &(m, n, k) in &[(1, 9, 7), (2, 13, 45), (9, 17, 33), (70, 18, 77), (1, 3, 1)] {
            for isa in CpuIsa::available() {
                check(f, m, n, k, isa, &pool);
            }
        }
    }
}

#[test]
fn sliced_weights_and_errors() {
    let pool = ThreadPool::new(2);
    let mut g = Lcg(5);
    let (n, k) = (20, 1536);
    let wf: Vec<f32> = (0..n * k).map(|_| g.f()).collect();
    let w = WeightMatrix::from_f32(n, k, wf)
        .unwrap()
        .to_format(WeightFormat::Q4_1)
        .unwrap();
    // Uneven tensor-parallel split 1536/9 -> 171 columns (decoded to f32).
    let s = w.slice_cols(171, 342).unwrap().slice_rows(3, 17).unwrap();
    let x: Vec<f32> = (0..2 * 171).map(|_| g.f()).collect();
    let mut out = vec![0.0; 2 * 14];
    matmul(&pool, &x, 2, &s, &mut out).unwrap();
    let r = reference(&x, 2, &s.to_f32_vec(), 14, 171);
    for (a, b) in out.iter().zip(&r) {
        assert!((*a as f64 - b).abs() < 1e-3);
    }
    assert!(matmul(&pool, &x, 3, &s, &mut out).is_err());
}

#[test]
fn fast_bf16_is_close() {
    if !crate::cpu::use_avx512_bf16() {
        return;
    }
    let pool = ThreadPool::new(2);
    let mut g = Lcg(9);
    let (m, n, k) = (70, 33, 100);
    let x: Vec<f32> = (0..m * k).map(|_| g.f()).collect();
    let wf: Vec<f32> = (0..n * k).map(|_| g.f()).collect();
    let w = WeightMatrix::from_f32(n, k, wf)
        .unwrap()
        .to_format(WeightFormat::BF16)
        .unwrap();
    let r = reference(&x, m, &w.to_f32_vec(), n, k);
    let mut out = vec![0.0; m * n];
    matmul_fast(&pool, &x, m, &w, &mut out).unwrap();
    for (a, b) in out.iter().zip(&r) {
        assert!((*a as f64 - b).abs() < 0.05, "{a} vs {b}");
    }
}

#[test]
fn extra_quant_formats_match_reference() {
    let pool = ThreadPool::new(2);
    for f in WeightFormat::EXTRA_QUANTS {
        // Every small m (fused or decoded panels), column counts that leave partial
        // tiles, and large m (blocked path), over several panels of rows.
        for &(m, n, k) in &[
            (1, 37, 512),
            (2, 23, 256),
            (3, 21, 256),
            (4, 18, 768),
            (67, 35, 512),
        ] {
            for isa in CpuIsa::available() {
                check(f, m, n, k, isa, &pool);
            }
        }
    }
}

#[test]
fn five_bit_and_k_quants_are_fused_at_every_simd_level() {
    use WeightFormat as W;
    for isa in CpuIsa::available() {
        for f in [W::Q5_0, W::Q5_1] {
            assert_eq!(
                fused_small_m(f, isa),
                isa != CpuIsa::Scalar,
                "{f:?} at {isa}"
            );
        }
        // The K-quant decoders are x86 only (NEON decodes panels).
        for f in [W::Q4_K, W::Q5_K, W::Q6_K] {
            assert_eq!(fused_small_m(f, isa), isa >= CpuIsa::Avx2, "{f:?} at {isa}");
        }
        for f in [W::F32, W::BF16, W::Q8_0, W::Q4_0, W::Q4_1] {
            assert!(fused_small_m(f, isa), "{f:?} at {isa}");
        }
    }
}
