//! The engine's own kernels (`kernels/src/cuda/kernels/*.cu`, `cuda_comm/sum.cu`)
//! compiled as `cuda/module.rs` compiles them and run against host references, under
//! several schedules: a kernel whose result depends on the order threads run in fails.

use std::ffi::c_void;

mod formats;
mod model_ops;

use super::tests::{launch, load};
use super::{with_settings, Kernel, LaunchDims, Module, Schedule};

pub(super) const COMMON: &str = include_str!("../../../../kernels/src/cuda/kernels/common.cu");

/// A source: file stem, text, and its kernels with their parameter counts.
type Source = (&'static str, &'static str, &'static [(&'static str, usize)]);

/// Every source, as `cuda::module::SOURCES`.
const SOURCES: &[Source] = &[
    (
        "elementwise",
        include_str!("../../../../kernels/src/cuda/kernels/elementwise.cu"),
        &[
            ("fill_f32", 3),
            ("add_f32", 3),
            ("add_bias_f32", 4),
            ("silu_mul_f32", 4),
            ("f32_to_bf16_kernel", 3),
            ("copy_strided_f32", 8),
            ("gather_rows_f32", 5),
            ("scatter_add_rows_f32", 6),
            ("rms_norm_f32", 5),
            ("argmax_f32", 3),
        ],
    ),
    (
        "rope_embed",
        include_str!("../../../../kernels/src/cuda/kernels/rope_embed.cu"),
        &[("rope_f32", 13), ("embed_f32", 5), ("embed_bf16", 5)],
    ),
    (
        "matmul",
        include_str!("../../../../kernels/src/cuda/kernels/matmul.cu"),
        &[("matmul_bf16_exact", 7)],
    ),
    (
        "kv",
        include_str!("../../../../kernels/src/cuda/kernels/kv.cu"),
        &[
            ("kv_write_rows", 6),
            ("kv_write_rows_fp8", 8),
            ("kv_to_f32", 6),
        ],
    ),
    (
        "attention",
        include_str!("../../../../kernels/src/cuda/kernels/attention.cu"),
        &[
            ("attention_partial", 21),
            ("merge_lse_f32", 7),
            ("scale_by_lse_share_f32", 6),
        ],
    ),
    (
        "routing",
        include_str!("../../../../kernels/src/cuda/kernels/routing.cu"),
        &[("route_experts_f32", 13)],
    ),
    (
        "sampling",
        include_str!("../../../../kernels/src/cuda/kernels/sampling.cu"),
        &[("sample_rows_f32", 9), ("row_logprobs_f32", 10)],
    ),
];

pub(super) fn engine_module(stem: &str) -> Module {
    let (_, text, _) = SOURCES.iter().find(|s| s.0 == stem).unwrap();
    load(&format!("{COMMON}\n{text}"))
}

pub(super) fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// Deterministic pseudo-random f32 in [-1, 1).
pub(super) fn rand_f32(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

pub(super) fn schedules() -> Vec<(Schedule, usize)> {
    vec![
        (Schedule::Forward, 1),
        (Schedule::Reverse, 1),
        (Schedule::parse("random:11").unwrap(), 1),
        (Schedule::parse("random:12").unwrap(), 2),
    ]
}

#[test]
fn every_engine_kernel_compiles_with_its_signature() {
    for (stem, _, kernels) in SOURCES {
        let m = engine_module(stem);
        for &(name, n) in kernels.iter() {
            let k = m
                .function(name)
                .unwrap_or_else(|| panic!("{stem}.cu lacks {name}"));
            assert_eq!(k.params().len(), n, "{name}");
            assert!(k.static_shared_bytes() <= super::SHARED_LIMIT, "{name}");
        }
        assert_eq!(
            m.kernels().len(),
            kernels.len(),
            "{stem}.cu registers other kernels"
        );
    }
    let s = engine_module("sampling")
        .function("sample_rows_f32")
        .unwrap();
    assert_eq!(s.max_threads_per_block(), 1024);
    assert!(
        s.static_shared_bytes() > 30_000,
        "{}",
        s.static_shared_bytes()
    );
    let sum = load(include_str!("../../../../kernels/src/cuda_comm/sum.cu"));
    for name in ["dcp_sum_f32", "dcp_sum_bf16"] {
        let k = sum.function(name).unwrap();
        let sizes: Vec<usize> = k.params().iter().map(|p| p.size).collect();
        assert_eq!(
            sizes,
            [8, 128, 4, 8],
            "{name}: out, DcpSources by value, n_src, n"
        );
    }
}

#[test]
fn sum_kernel_adds_sources_in_rank_order() {
    let m = load(include_str!("../../../../kernels/src/cuda_comm/sum.cu"));
    let k = m.function("dcp_sum_f32").unwrap();
    let n = 3000usize;
    let mut seed = 5;
    let srcs: Vec<Vec<f32>> = (0..3)
        .map(|_| (0..n).map(|_| rand_f32(&mut seed) * 1e3).collect())
        .collect();
    let mut table = [0u64; 16];
    for (i, s) in srcs.iter().enumerate() {
        table[i] = s.as_ptr() as u64;
    }
    let mut out = vec![0f32; n];
    let (mut op, mut n_src, mut nn) = (out.as_mut_ptr(), 3i32, n as u64);
    // 256 threads, few blocks: the grid-stride loop covers the rest.
    launch(
        &k,
        4,
        256,
        0,
        &mut [arg(&mut op), arg(&mut table), arg(&mut n_src), arg(&mut nn)],
    )
    .unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            ((srcs[0][i] + srcs[1][i]) + srcs[2][i]).to_bits(),
            "element {i}"
        );
    }
}

#[test]
fn rms_norm_and_argmax_match_the_host() {
    let m = engine_module("elementwise");
    let rms = m.function("rms_norm_f32").unwrap();
    let argmax = m.function("argmax_f32").unwrap();
    let (rows, d) = (3usize, 1000usize);
    let mut seed = 9;
    let x: Vec<f32> = (0..rows * d).map(|_| rand_f32(&mut seed) * 4.0).collect();
    let w: Vec<f32> = (0..d).map(|_| rand_f32(&mut seed)).collect();
    for (sched, threads) in schedules() {
        let mut out = vec![0f32; rows * d];
        let (mut xp, mut wp, mut op, mut dd, mut eps) =
            (x.as_ptr(), w.as_ptr(), out.as_mut_ptr(), d as u64, 1e-5f32);
        with_settings(sched.clone(), threads, || {
            launch(
                &rms,
                rows as u32,
                256,
                0,
                &mut [
                    arg(&mut xp),
                    arg(&mut wp),
                    arg(&mut op),
                    arg(&mut dd),
                    arg(&mut eps),
                ],
            )
            .unwrap()
        });
        for r in 0..rows {
            let row = &x[r * d..(r + 1) * d];
            let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let s = 1.0 / (ss / d as f64 + 1e-5).sqrt();
            for i in 0..d {
                let want = f64::from(row[i]) * s * f64::from(w[i]);
                assert!(
                    (f64::from(out[r * d + i]) - want).abs() < 1e-5,
                    "row {r} col {i} under {sched:?}"
                );
            }
        }
        // Ties at the maximum: the lowest index wins; a NaN never does.
        let mut logits = x.clone();
        logits[d + 10] = 9.0;
        logits[d + 700] = 9.0;
        logits[d + 5] = f32::NAN;
        for v in &mut logits[2 * d..] {
            *v = f32::NEG_INFINITY;
        }
        let mut ids = vec![7u32; rows];
        let (mut lp, mut vocab, mut ip) = (logits.as_ptr(), d as u64, ids.as_mut_ptr());
        with_settings(sched.clone(), threads, || {
            launch(
                &argmax,
                rows as u32,
                1024,
                0,
                &mut [arg(&mut lp), arg(&mut vocab), arg(&mut ip)],
            )
            .unwrap()
        });
        let host0 = (0..d).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        assert_eq!(ids, [host0 as u32, 10, 0], "under {sched:?}");
    }
}

#[test]
fn bf16_matmul_vector_and_scalar_paths_agree_with_the_host() {
    let m = engine_module("matmul");
    let k = m.function("matmul_bf16_exact").unwrap();
    let (mm, n, kk) = (5u32, 20u32, 72u32);
    let mut seed = 3;
    let x: Vec<f32> = (0..mm * kk).map(|_| rand_f32(&mut seed)).collect();
    let w: Vec<u16> = (0..n * kk)
        .map(|_| half::bf16::from_f32(rand_f32(&mut seed)).to_bits())
        .collect();
    let mut results = Vec::new();
    for vec in [0i32, 1] {
        let mut out = vec![0f32; (mm * n) as usize];
        let (mut xp, mut wp, mut op, mut a, mut b, mut c, mut v) =
            (x.as_ptr(), w.as_ptr(), out.as_mut_ptr(), mm, n, kk, vec);
        let dims = LaunchDims {
            grid: [n.div_ceil(8), mm.div_ceil(4), 1],
            block: [256, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let mut args = [
            arg(&mut xp),
            arg(&mut wp),
            arg(&mut op),
            arg(&mut a),
            arg(&mut b),
            arg(&mut c),
            arg(&mut v),
        ];
        unsafe { k.launch_counted(&dims, &mut args) }.unwrap();
        for t in 0..mm as usize {
            for col in 0..n as usize {
                let want: f64 = (0..kk as usize)
                    .map(|j| {
                        f64::from(x[t * kk as usize + j])
                            * f64::from(half::bf16::from_bits(w[col * kk as usize + j]).to_f32())
                    })
                    .sum();
                let got = out[t * n as usize + col];
                assert!(
                    (f64::from(got) - want).abs() < 1e-4,
                    "vec={vec} [{t}, {col}]: {got} vs {want}"
                );
            }
        }
        results.push(out);
    }
}

/// Launches `k` on one block of `threads` under `sched`.
pub(super) fn launch_dims(
    k: &Kernel,
    dims: LaunchDims,
    args: &mut [*mut c_void],
    sched: &Schedule,
    threads: usize,
) -> Result<(), String> {
    with_settings(sched.clone(), threads, || unsafe {
        k.launch_counted(&dims, args)
    })
}

#[test]
fn routing_is_the_same_under_every_schedule_and_picks_the_top_k() {
    let m = engine_module("routing");
    let k = m.function("route_experts_f32").unwrap();
    let (tokens, experts, top) = (4usize, 64u32, 6u32);
    let mut seed = 21;
    let logits: Vec<f32> = (0..tokens * experts as usize)
        .map(|_| rand_f32(&mut seed) * 3.0)
        .collect();
    let bias: Vec<f32> = (0..experts).map(|_| rand_f32(&mut seed) * 0.1).collect();
    let mut first: Option<(Vec<u32>, Vec<f32>)> = None;
    for (sched, threads) in schedules() {
        for grouped in [0i32, 1] {
            let mut ids = vec![0u32; tokens * top as usize];
            let mut wts = vec![0f32; tokens * top as usize];
            let (mut lp, mut bp, mut hb, mut ne, mut kk, mut ng, mut tg) = (
                logits.as_ptr(),
                bias.as_ptr(),
                1i32,
                experts,
                top,
                if grouped == 1 { 8u32 } else { 1 },
                4u32,
            );
            let (mut gr, mut sig, mut norm, mut scale, mut ip, mut wp) = (
                grouped,
                1i32,
                1i32,
                2.5f32,
                ids.as_mut_ptr(),
                wts.as_mut_ptr(),
            );
            let mut args = [
                arg(&mut lp),
                arg(&mut bp),
                arg(&mut hb),
                arg(&mut ne),
                arg(&mut kk),
                arg(&mut ng),
                arg(&mut tg),
                arg(&mut gr),
                arg(&mut sig),
                arg(&mut norm),
                arg(&mut scale),
                arg(&mut ip),
                arg(&mut wp),
            ];
            let dims = LaunchDims {
                grid: [tokens as u32, 1, 1],
                block: [128, 1, 1],
                dynamic_shared_bytes: 0,
            };
            launch_dims(&k, dims, &mut args, &sched, threads).unwrap();
            if grouped == 0 {
                for t in 0..tokens {
                    // Ungrouped: the k largest biased sigmoid scores.
                    let score = |e: usize| {
                        1.0 / (1.0 + (-logits[t * experts as usize + e]).exp()) + bias[e]
                    };
                    let mut order: Vec<usize> = (0..experts as usize).collect();
                    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
                    let got: Vec<usize> = ids[t * top as usize..(t + 1) * top as usize]
                        .iter()
                        .map(|&i| i as usize)
                        .collect();
                    assert_eq!(got, order[..top as usize], "token {t} under {sched:?}");
                }
                match &first {
                    None => first = Some((ids.clone(), wts.clone())),
                    Some((i0, w0)) => {
                        assert_eq!(&ids, i0, "ids differ under {sched:?}");
                        assert_eq!(&wts, w0, "weights differ under {sched:?}");
                    }
                }
            }
        }
    }
}
