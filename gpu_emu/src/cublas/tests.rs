//! GEMMs through the C entry points against a naive reference.

use std::ffi::c_void;
use std::ptr::null_mut;

use super::gemm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::*;
use crate::driver::tests::{alloc, download, init, new_stream, upload};

/// Column-major reference: C = alpha op(A) op(B) + beta C, in f64.
#[allow(clippy::too_many_arguments)]
fn reference(
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) {
    for j in 0..n {
        for i in 0..m {
            let mut s = 0f64;
            for l in 0..k {
                let av = if ta { a[l + i * lda] } else { a[i + l * lda] };
                let bv = if tb { b[j + l * ldb] } else { b[l + j * ldb] };
                s += av as f64 * bv as f64;
            }
            let prev = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * c[i + j * ldc] as f64
            };
            c[i + j * ldc] = (alpha as f64 * s + prev) as f32;
        }
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) % 200) as f32 / 100.0
                - 1.0
        })
        .collect()
}

#[test]
fn gemm_ex_matches_reference_for_every_transpose_and_type() {
    init();
    let (m, n, k) = (37usize, 5usize, 70usize);
    let stream = new_stream();
    let mut h = null_mut();
    unsafe {
        assert_eq!(cublasCreate_v2(&mut h), status::SUCCESS);
        assert_eq!(cublasSetStream_v2(h, stream), status::SUCCESS);
    }
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for bf16 in [false, true] {
            let (lda, ldb, ldc) = (
                if ta { k + 3 } else { m + 1 },
                if tb { n + 2 } else { k },
                m + 4,
            );
            let a = values(lda * if ta { m } else { k }, 1);
            let b = values(ldb * if tb { k } else { n }, 2);
            // Inputs rounded to bf16 where bf16 is used, so the reference sees the same.
            let round = |v: &[f32]| -> Vec<f32> {
                v.iter()
                    .map(|x| {
                        if bf16 {
                            bf16_to_f32(f32_to_bf16(*x))
                        } else {
                            *x
                        }
                    })
                    .collect()
            };
            let (a, b) = (round(&a), round(&b));
            let mut c_ref = values(ldc * n, 3);
            let pa = alloc(a.len() * 4);
            let pb = alloc(b.len() * 4);
            let pc = alloc(c_ref.len() * 4);
            let elem_type = if bf16 { 14 } else { 0 };
            if bf16 {
                upload(pa, &a.iter().map(|x| f32_to_bf16(*x)).collect::<Vec<u16>>());
                upload(pb, &b.iter().map(|x| f32_to_bf16(*x)).collect::<Vec<u16>>());
            } else {
                upload(pa, &a);
                upload(pb, &b);
            }
            upload(pc, &c_ref);
            let (alpha, beta) = (1.5f32, 0.5f32);
            let st = unsafe {
                cublasGemmEx(
                    h,
                    ta as u32,
                    tb as u32,
                    m as i32,
                    n as i32,
                    k as i32,
                    (&alpha as *const f32).cast(),
                    pa as *const c_void,
                    elem_type,
                    lda as i32,
                    pb as *const c_void,
                    elem_type,
                    ldb as i32,
                    (&beta as *const f32).cast(),
                    pc as *mut c_void,
                    0,
                    ldc as i32,
                    68,
                    -1,
                )
            };
            assert_eq!(st, status::SUCCESS);
            unsafe { assert_eq!(crate::driver::stream_api::cuStreamSynchronize(stream), 0) };
            reference(
                ta, tb, m, n, k, &a, lda, &b, ldb, &mut c_ref, ldc, alpha, beta,
            );
            let got: Vec<f32> = download(pc, c_ref.len());
            for (i, (g, r)) in got.iter().zip(&c_ref).enumerate() {
                assert!(
                    (g - r).abs() <= 1e-4 * (1.0 + r.abs()),
                    "ta={ta} tb={tb} bf16={bf16} [{i}]: {g} vs {r}"
                );
            }
        }
    }
}

#[test]
fn strided_batched_and_bounds() {
    init();
    let (m, n, k, batch) = (4usize, 3usize, 5usize, 3usize);
    let stream = new_stream();
    let mut h = null_mut();
    unsafe {
        assert_eq!(cublasCreate_v2(&mut h), status::SUCCESS);
        assert_eq!(cublasSetStream_v2(h, stream), status::SUCCESS);
    }
    let a = values(m * k * batch, 4);
    let b = values(k * n * batch, 5);
    let (pa, pb, pc) = (
        alloc(a.len() * 4),
        alloc(b.len() * 4),
        alloc(m * n * batch * 4),
    );
    upload(pa, &a);
    upload(pb, &b);
    let (alpha, beta) = (1f32, 0f32);
    let st = unsafe {
        cublasSgemmStridedBatched(
            h,
            0,
            0,
            m as i32,
            n as i32,
            k as i32,
            &alpha,
            pa as *const f32,
            m as i32,
            (m * k) as i64,
            pb as *const f32,
            k as i32,
            (k * n) as i64,
            &beta,
            pc as *mut f32,
            m as i32,
            (m * n) as i64,
            batch as i32,
        )
    };
    assert_eq!(st, status::SUCCESS);
    unsafe { assert_eq!(crate::driver::stream_api::cuStreamSynchronize(stream), 0) };
    let got: Vec<f32> = download(pc, m * n * batch);
    for i in 0..batch {
        let mut c = vec![0f32; m * n];
        reference(
            false,
            false,
            m,
            n,
            k,
            &a[i * m * k..],
            m,
            &b[i * k * n..],
            k,
            &mut c,
            m,
            1.0,
            0.0,
        );
        for (g, r) in got[i * m * n..(i + 1) * m * n].iter().zip(&c) {
            assert!((g - r).abs() < 1e-5, "{g} vs {r}");
        }
    }
    // One batch too many overruns A: refused at the call.
    let st = unsafe {
        cublasSgemmStridedBatched(
            h,
            0,
            0,
            m as i32,
            n as i32,
            k as i32,
            &alpha,
            pa as *const f32,
            m as i32,
            (m * k) as i64,
            pb as *const f32,
            k as i32,
            (k * n) as i64,
            &beta,
            pc as *mut f32,
            m as i32,
            (m * n) as i64,
            batch as i32 + 1,
        )
    };
    assert_eq!(st, status::INVALID_VALUE);
}

#[test]
fn half_conversions_round_to_nearest_even() {
    for v in [0.0f32, 1.0, -2.5, 65504.0, 1e-7, 3.3, -0.0001] {
        let h = f32_to_f16(v);
        assert!((f16_to_f32(h) - v).abs() <= v.abs() * 1e-3 + 6e-8, "{v}");
    }
    assert_eq!(f32_to_f16(1e6), 0x7c00);
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80); // a tie rounds to even
    assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
}
