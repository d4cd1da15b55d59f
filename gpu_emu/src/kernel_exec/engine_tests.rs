//! The engine's own kernels (`kernels/src/cuda/kernels/*.cu`, `cuda_comm/sum.cu`)
//! compiled as `cuda/module.rs` compiles them and run against host references, under
//! several schedules: a kernel whose result depends on the order threads run in fails.

use std::ffi::c_void;

use super::tests::{launch, load};
use super::{with_settings, Kernel, LaunchDims, Module, Schedule};

const COMMON: &str = include_str!("../../../kernels/src/cuda/kernels/common.cu");

/// (file stem, text, kernels with their parameter counts), as `cuda::module::SOURCES`.
/// A source: file stem, text, and its kernels with their parameter counts.
type Source = (&'static str, &'static str, &'static [(&'static str, usize)]);

const SOURCES: &[Source] = &[
    (
        "elementwise",
        include_str!("../../../kernels/src/cuda/kernels/elementwise.cu"),
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
        include_str!("../../../kernels/src/cuda/kernels/rope_embed.cu"),
        &[("rope_f32", 13), ("embed_f32", 5), ("embed_bf16", 5)],
    ),
    (
        "matmul",
        include_str!("../../../kernels/src/cuda/kernels/matmul.cu"),
        &[("matmul_bf16_exact", 7)],
    ),
    (
        "kv",
        include_str!("../../../kernels/src/cuda/kernels/kv.cu"),
        &[
            ("kv_write_rows", 6),
            ("kv_write_rows_fp8", 8),
            ("kv_to_f32", 6),
        ],
    ),
    (
        "attention",
        include_str!("../../../kernels/src/cuda/kernels/attention.cu"),
        &[
            ("attention_partial", 21),
            ("merge_lse_f32", 7),
            ("scale_by_lse_share_f32", 6),
        ],
    ),
    (
        "routing",
        include_str!("../../../kernels/src/cuda/kernels/routing.cu"),
        &[("route_experts_f32", 13)],
    ),
    (
        "sampling",
        include_str!("../../../kernels/src/cuda/kernels/sampling.cu"),
        &[("sample_rows_f32", 9), ("row_logprobs_f32", 10)],
    ),
];

fn engine_module(stem: &str) -> Module {
    let (_, text, _) = SOURCES.iter().find(|s| s.0 == stem).unwrap();
    load(&format!("{COMMON}\n{text}"))
}

fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// Deterministic pseudo-random f32 in [-1, 1).
fn rand_f32(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn schedules() -> Vec<(Schedule, usize)> {
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
    let sum = load(include_str!("../../../kernels/src/cuda_comm/sum.cu"));
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
    let m = load(include_str!("../../../kernels/src/cuda_comm/sum.cu"));
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
fn launch_dims(
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

/// Nearest fp8 code by exhaustive search (ties to the even code), saturating to the
/// largest finite value: an independent reference for both conversions.
fn reference_fp8(x: f32, e5m2: bool) -> u8 {
    let (m, bias, max_code) = if e5m2 {
        (2, 15, 0x7Bu8)
    } else {
        (3, 7, 0x7Eu8)
    };
    let value = |c: u8| -> f64 {
        let (e, f) = (i32::from(c >> m), f64::from(c & ((1 << m) - 1)));
        if e == 0 {
            f * 2f64.powi(1 - bias - m)
        } else {
            (1.0 + f / f64::from(1u8 << m)) * 2f64.powi(e - bias)
        }
    };
    let a = f64::from(x.abs());
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if a >= value(max_code) {
        return max_code | sign;
    }
    let mut best = 0u8;
    for c in 0..=max_code {
        let (d, db) = ((value(c) - a).abs(), (value(best) - a).abs());
        if d < db || (d == db && c & 1 == 0) {
            best = c;
        }
    }
    best | sign
}

#[test]
fn bf16_and_fp8_conversions_round_as_the_device() {
    let m = load(&format!(
        "#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n{COMMON}\n{}",
        r#"
extern "C" __global__ void convert(const float* x, unsigned n, unsigned short* bf, unsigned char* fp8) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        bf[2 * i] = __bfloat16_as_ushort(__float2bfloat16(v));
        bf[2 * i + 1] = f32_to_bf16(v);
        unsigned char* o = fp8 + 6 * i;
        o[0] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        o[1] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
        o[2] = encode_fp8(v, 0);
        o[3] = encode_fp8(v, 1);
        o[4] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3);
        o[5] = __nv_fp8_e5m2(v).__x;
    }
}
extern "C" __global__ void decode(float* out) {
    unsigned c = threadIdx.x;
    out[4 * c] = decode_fp8((u8)c, 0);
    __nv_fp8_e4m3 a; a.__x = (u8)c;
    __nv_fp8_e5m2 b; b.__x = (u8)c;
    out[4 * c + 1] = (float)a;
    out[4 * c + 2] = decode_fp8((u8)c, 1);
    out[4 * c + 3] = (float)b;
}
"#
    ));
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 128.0 + 1.0 / 512.0,
        f32::MAX,
        3.389_531_4e38,
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        448.0,
        464.0,
        465.0,
        479.0,
        480.0,
        1e9,
        -464.0,
        57344.0,
        61439.0,
        61440.0,
        65536.0,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        1.5 * 2f32.powi(-17),
        0.0625 + 0.0625 / 16.0,
        240.0,
        248.0,
        0.1,
        -0.3,
        3.0e-3,
    ];
    let mut seed = 77;
    for _ in 0..20_000 {
        let mant = rand_f32(&mut seed);
        let exp = (rand_f32(&mut seed) * 24.0) as i32;
        x.push(mant * 2f32.powi(exp));
    }
    let n = x.len();
    let mut bf = vec![0u16; 2 * n];
    let mut fp8 = vec![0u8; 6 * n];
    let (mut xp, mut nn, mut bp, mut fp) =
        (x.as_ptr(), n as u32, bf.as_mut_ptr(), fp8.as_mut_ptr());
    launch(
        &m.function("convert").unwrap(),
        16,
        256,
        0,
        &mut [arg(&mut xp), arg(&mut nn), arg(&mut bp), arg(&mut fp)],
    )
    .unwrap();
    for (i, &v) in x.iter().enumerate() {
        let want = half::bf16::from_f32(v).to_bits();
        assert_eq!(bf[2 * i], want, "__float2bfloat16({v:e})");
        assert_eq!(bf[2 * i + 1], want, "common.cu f32_to_bf16({v:e})");
        let o = &fp8[6 * i..6 * i + 6];
        let (e4, e5) = (reference_fp8(v, false), reference_fp8(v, true));
        assert_eq!(
            [o[0], o[1], o[2], o[3], o[5]],
            [e4, e5, e4, e5, e5],
            "fp8 of {v:e}"
        );
        let nosat = if v.abs() > 448.0 {
            0x7F | (e4 & 0x80)
        } else {
            e4
        };
        assert_eq!(o[4], nosat, "E4M3 without saturation of {v:e}");
    }
    // NaN: the device's canonical NaNs; the engine keeps the sign with the all-ones code.
    let mut nan = [f32::NAN];
    let (mut np, mut one) = (nan.as_mut_ptr(), 1u32);
    launch(
        &m.function("convert").unwrap(),
        1,
        32,
        0,
        &mut [arg(&mut np), arg(&mut one), arg(&mut bp), arg(&mut fp)],
    )
    .unwrap();
    assert_eq!(bf[0], 0x7FFF);
    assert!(half::bf16::from_bits(bf[1]).is_nan());
    assert_eq!(&fp8[..4], &[0x7F, 0x7E, 0x7F, 0x7F]);
    // Every code decodes to the same value both ways.
    let mut dec = vec![0f32; 4 * 256];
    let mut dp = dec.as_mut_ptr();
    launch(
        &m.function("decode").unwrap(),
        1,
        256,
        0,
        &mut [arg(&mut dp)],
    )
    .unwrap();
    for c in 0..256 {
        let d = &dec[4 * c..4 * c + 4];
        assert!(
            d[0].to_bits() == d[1].to_bits() || (d[0].is_nan() && d[1].is_nan()),
            "e4m3 code {c:#x}: {d:?}"
        );
        assert!(
            d[2].to_bits() == d[3].to_bits() || (d[2].is_nan() && d[3].is_nan()),
            "e5m2 code {c:#x}: {d:?}"
        );
        if c & 0x7F <= 0x7E {
            assert_eq!(
                reference_fp8(d[1], false),
                c as u8,
                "e4m3 round trip {c:#x}"
            );
        }
        if c & 0x7F <= 0x7B {
            assert_eq!(reference_fp8(d[3], true), c as u8, "e5m2 round trip {c:#x}");
        }
    }
}

#[test]
fn sampling_draws_the_same_under_every_schedule() {
    let m = engine_module("sampling");
    let k = m.function("sample_rows_f32").unwrap();
    let lp = m.function("row_logprobs_f32").unwrap();
    let vocab = 3000usize;
    let mut seed = 1234;
    let logits: Vec<f32> = (0..2 * vocab).map(|_| rand_f32(&mut seed) * 6.0).collect();
    // Draws: greedy, unfiltered, top-k 40, top-p 0.8, min-p 0.2, top-k 3000 + top-p 0.5.
    let rows = [0u32, 1, 0, 1, 0, 1];
    let top_k = [3000u32, 3000, 40, 3000, 3000, 3000];
    let flags = [1u32, 2, 0, 0, 0, 0];
    let fparams = [
        1.0f32, 1.0, 0.0, 1.25, 1.0, 0.0, 1.0, 1.0, 0.0, 0.7, 0.8, 0.0, 1.0, 1.0, 0.2, 1.0, 0.5,
        0.0,
    ];
    let uniform = [0.5f64, 0.3141, 0.77, 0.05, 0.6, 0.999];
    let draws = rows.len();
    let mut first = None;
    for (sched, threads) in schedules() {
        let mut tok = vec![0u32; draws];
        let mut status = vec![0u32; draws];
        let (mut l, mut v, mut r, mut tk, mut fl, mut fp, mut u, mut t, mut s) = (
            logits.as_ptr(),
            vocab as u64,
            rows.as_ptr(),
            top_k.as_ptr(),
            flags.as_ptr(),
            fparams.as_ptr(),
            uniform.as_ptr(),
            tok.as_mut_ptr(),
            status.as_mut_ptr(),
        );
        let mut args = [
            arg(&mut l),
            arg(&mut v),
            arg(&mut r),
            arg(&mut tk),
            arg(&mut fl),
            arg(&mut fp),
            arg(&mut u),
            arg(&mut t),
            arg(&mut s),
        ];
        let dims = LaunchDims {
            grid: [draws as u32, 1, 1],
            block: [1024, 1, 1],
            dynamic_shared_bytes: 0,
        };
        launch_dims(&k, dims, &mut args, &sched, threads).unwrap();
        // Greedy: the argmax of row 0.
        let row0 = &logits[..vocab];
        let amax = (0..vocab).fold(0, |b, i| if row0[i] > row0[b] { i } else { b });
        assert_eq!((tok[0], status[0]), (amax as u32, 0));
        // Unfiltered: the host's index-order walk at temperature 1 / 1.25.
        let row1 = &logits[vocab..];
        let mx = row1.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = row1
            .iter()
            .map(|&l| (f64::from((l - mx) * 1.25)).exp() as f32 as f64)
            .collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let walk = w.iter().position(|&x| {
            acc += x;
            uniform[1] * total < acc
        });
        assert_eq!(
            (tok[1], status[1]),
            (walk.unwrap() as u32, 1),
            "unfiltered draw under {sched:?}"
        );
        // Top-k 40: one of row 0's 40 largest.
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row0[b].total_cmp(&row0[a]).then(a.cmp(&b)));
        assert!(order[..40].contains(&(tok[2] as usize)) && status[2] == 1);
        assert!(status.iter().all(|&s| s == 0 || s == 1), "{status:?}");
        match &first {
            None => first = Some((tok.clone(), status.clone())),
            Some(f) => assert_eq!(
                &(tok.clone(), status.clone()),
                f,
                "draws differ under {sched:?} / {threads} OS threads"
            ),
        }
        // Log-probabilities of the drawn tokens and the top 5, against the host's.
        let which = [0u32, 1];
        let top_n = [5u32, 5];
        let mut out_lp = [0f32; 2];
        let mut ids = [0u32; 10];
        let mut vals = [0f32; 10];
        let (mut l2, mut v2, mut r2, mut t2, mut w2, mut n2, mut mx2, mut o1, mut o2, mut o3) = (
            logits.as_ptr(),
            vocab as u64,
            rows.as_ptr(),
            tok.as_ptr(),
            which.as_ptr(),
            top_n.as_ptr(),
            5u32,
            out_lp.as_mut_ptr(),
            ids.as_mut_ptr(),
            vals.as_mut_ptr(),
        );
        let mut args = [
            arg(&mut l2),
            arg(&mut v2),
            arg(&mut r2),
            arg(&mut t2),
            arg(&mut w2),
            arg(&mut n2),
            arg(&mut mx2),
            arg(&mut o1),
            arg(&mut o2),
            arg(&mut o3),
        ];
        let dims = LaunchDims {
            grid: [2, 1, 1],
            block: [1024, 1, 1],
            dynamic_shared_bytes: 0,
        };
        launch_dims(&lp, dims, &mut args, &sched, threads).unwrap();
        for b in 0..2 {
            let row = &logits[b * vocab..(b + 1) * vocab];
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let s: f64 = row.iter().map(|&l| f64::from(l - mx).exp()).sum();
            let lse = mx + s.ln() as f32;
            assert!((out_lp[b] - (row[tok[b] as usize] - lse)).abs() < 1e-5);
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &c| row[c].total_cmp(&row[a]).then(a.cmp(&c)));
            let got: Vec<usize> = ids[b * 5..b * 5 + 5].iter().map(|&i| i as usize).collect();
            assert_eq!(got, order[..5]);
        }
    }
}

#[test]
fn attention_matches_a_naive_softmax_for_f32_and_bf16_caches() {
    let m = engine_module("attention");
    let k = m.function("attention_partial").unwrap();
    let merge = m.function("merge_lse_f32").unwrap();
    // Two tokens of one sequence, 4 query heads sharing 2 KV heads, d = dv = 40, 37 keys
    // in blocks of 8, split in chunks of 16 (3 splits) and merged.
    let (n_heads, kv_heads, d, block_size, len) = (4u32, 2u32, 40u32, 8u32, [37u32, 20]);
    let blocks = 5u32;
    let row_stride = u64::from(kv_heads * d);
    let mut seed = 99;
    let slots = (blocks * block_size) as usize;
    let kc: Vec<f32> = (0..slots * row_stride as usize)
        .map(|_| rand_f32(&mut seed))
        .collect();
    let vc: Vec<f32> = (0..slots * row_stride as usize)
        .map(|_| rand_f32(&mut seed))
        .collect();
    let q: Vec<f32> = (0..2 * n_heads as usize * d as usize)
        .map(|_| rand_f32(&mut seed))
        .collect();
    let bt: Vec<u32> = vec![3, 0, 4, 1, 2];
    let (bt_off, token_seq) = ([0u64], [0u32, 0]);
    let scale = 1.0 / (d as f32).sqrt();
    let (chunk, splits) = (16u32, 3u32);
    let rows = 2 * n_heads as usize;
    for (sched, threads) in schedules() {
        let mut out = vec![0f32; splits as usize * rows * d as usize];
        let mut lse = vec![0f32; splits as usize * rows];
        let (mut qp, mut kp, mut vp, mut ks, mut vs, mut dt, mut rs) = (
            q.as_ptr(),
            kc.as_ptr(),
            vc.as_ptr(),
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0i32,
            row_stride,
        );
        let (mut ts, mut tl, mut btp, mut bo) = (
            token_seq.as_ptr(),
            len.as_ptr(),
            bt.as_ptr(),
            bt_off.as_ptr(),
        );
        let (mut nh, mut hpk, mut dd, mut dv, mut bs, mut sc, mut ch) =
            (n_heads, n_heads / kv_heads, d, d, block_size, scale, chunk);
        let (mut op, mut lp, mut sr) = (out.as_mut_ptr(), lse.as_mut_ptr(), rows as u64);
        let mut args = [
            arg(&mut qp),
            arg(&mut kp),
            arg(&mut vp),
            arg(&mut ks),
            arg(&mut vs),
            arg(&mut dt),
            arg(&mut rs),
            arg(&mut ts),
            arg(&mut tl),
            arg(&mut btp),
            arg(&mut bo),
            arg(&mut nh),
            arg(&mut hpk),
            arg(&mut dd),
            arg(&mut dv),
            arg(&mut bs),
            arg(&mut sc),
            arg(&mut ch),
            arg(&mut op),
            arg(&mut lp),
            arg(&mut sr),
        ];
        let dims = LaunchDims {
            grid: [rows as u32, splits, 1],
            block: [128, 1, 1],
            dynamic_shared_bytes: 0,
        };
        launch_dims(&k, dims, &mut args, &sched, threads).unwrap();
        // Merge the splits.
        let out_ptrs: Vec<u64> = (0..splits as usize)
            .map(|s| out[s * rows * d as usize..].as_ptr() as u64)
            .collect();
        let lse_ptrs: Vec<u64> = (0..splits as usize)
            .map(|s| lse[s * rows..].as_ptr() as u64)
            .collect();
        let mut merged = vec![0f32; rows * d as usize];
        let mut merged_lse = vec![0f32; rows];
        let (mut a, mut b, mut p, mut r, mut h, mut o, mut l) = (
            out_ptrs.as_ptr(),
            lse_ptrs.as_ptr(),
            splits,
            rows as u64,
            d,
            merged.as_mut_ptr(),
            merged_lse.as_mut_ptr(),
        );
        let mut args = [
            arg(&mut a),
            arg(&mut b),
            arg(&mut p),
            arg(&mut r),
            arg(&mut h),
            arg(&mut o),
            arg(&mut l),
        ];
        let dims = LaunchDims {
            grid: [rows as u32, 1, 1],
            block: [64, 1, 1],
            dynamic_shared_bytes: 0,
        };
        launch_dims(&merge, dims, &mut args, &sched, threads).unwrap();
        for row in 0..rows {
            let (t, h) = (row / n_heads as usize, row % n_heads as usize);
            let kvh = h / (n_heads / kv_heads) as usize;
            let slot = |j: usize| {
                bt[j / block_size as usize] as usize * block_size as usize + j % block_size as usize
            };
            let base = |j: usize| slot(j) * row_stride as usize + kvh * d as usize;
            let qh = &q[row * d as usize..(row + 1) * d as usize];
            let s: Vec<f64> = (0..len[t] as usize)
                .map(|j| {
                    (0..d as usize)
                        .map(|e| f64::from(qh[e]) * f64::from(kc[base(j) + e]))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            assert!(
                (f64::from(merged_lse[row]) - (mx + z.ln())).abs() < 1e-4,
                "lse of row {row} under {sched:?}"
            );
            for e in 0..d as usize {
                let want: f64 = (0..len[t] as usize)
                    .map(|j| (s[j] - mx).exp() / z * f64::from(vc[base(j) + e]))
                    .sum();
                let got = f64::from(merged[row * d as usize + e]);
                assert!(
                    (got - want).abs() < 1e-4,
                    "row {row} element {e}: {got} vs {want} under {sched:?}"
                );
            }
        }
    }
}

#[test]
fn fp8_kv_rows_round_trip_with_their_scales() {
    let m = engine_module("kv");
    let write = m.function("kv_write_rows_fp8").unwrap();
    let read = m.function("kv_to_f32").unwrap();
    let (tokens, width, row_len) = (3usize, 128usize, 64usize);
    let mut seed = 4;
    let rows: Vec<f32> = (0..tokens * width)
        .map(|i| rand_f32(&mut seed) * (1 + i % 7) as f32 * 30.0)
        .collect();
    // Token 1 is another rank's: skipped.
    let slots = [2u64, u64::MAX, 0];
    let n_slots = 4usize;
    for dt in [2i32, 3] {
        let mut first = None;
        for (sched, threads) in schedules() {
            let mut cache = vec![0u8; n_slots * width];
            let mut scales = vec![0u8; n_slots * width / row_len];
            let (mut rp, mut sp, mut cp, mut scp, mut nt, mut w, mut rl, mut d) = (
                rows.as_ptr(),
                slots.as_ptr(),
                cache.as_mut_ptr(),
                scales.as_mut_ptr(),
                tokens as u64,
                width as u64,
                row_len as u64,
                dt,
            );
            let mut args = [
                arg(&mut rp),
                arg(&mut sp),
                arg(&mut cp),
                arg(&mut scp),
                arg(&mut nt),
                arg(&mut w),
                arg(&mut rl),
                arg(&mut d),
            ];
            let dims = LaunchDims {
                grid: [2, 1, 1],
                block: [64, 1, 1],
                dynamic_shared_bytes: 0,
            };
            launch_dims(&write, dims, &mut args, &sched, threads).unwrap();
            let mut back = vec![0f32; n_slots * width];
            let (mut cp2, mut scp2, mut op, mut n, mut d2, mut rl2) = (
                cache.as_ptr(),
                scales.as_ptr(),
                back.as_mut_ptr(),
                (n_slots * width) as u64,
                dt,
                row_len as u64,
            );
            let mut args = [
                arg(&mut cp2),
                arg(&mut scp2),
                arg(&mut op),
                arg(&mut n),
                arg(&mut d2),
                arg(&mut rl2),
            ];
            let dims = LaunchDims {
                grid: [4, 1, 1],
                block: [128, 1, 1],
                dynamic_shared_bytes: 0,
            };
            launch_dims(&read, dims, &mut args, &sched, threads).unwrap();
            let rel = if dt == 2 { 1.0 / 16.0 } else { 1.0 / 8.0 };
            for (t, &slot) in slots.iter().enumerate() {
                if slot == u64::MAX {
                    continue;
                }
                for c in 0..width {
                    let (want, got) = (rows[t * width + c], back[slot as usize * width + c]);
                    let row_max = rows[t * width + c / row_len * row_len..][..row_len]
                        .iter()
                        .fold(0f32, |a, v| a.max(v.abs()));
                    assert!(
                        (want - got).abs() <= want.abs() * rel + row_max * 1e-3,
                        "dt {dt} token {t} col {c}: {want} vs {got}"
                    );
                }
            }
            assert!(
                cache[width..2 * width].iter().all(|&b| b == 0),
                "slot 1 untouched"
            );
            match &first {
                None => first = Some((cache.clone(), scales.clone())),
                Some(f) => assert_eq!(&(cache, scales), f, "fp8 rows differ under {sched:?}"),
            }
        }
    }
}

/// Timings of typical launches (`cargo test --release -p dcpserve-gpu-emu -- --ignored
/// --nocapture launch_timings`).
#[test]
#[ignore]
fn launch_timings() {
    let ew = engine_module("elementwise");
    let fill = ew.function("fill_f32").unwrap();
    let n = 1usize << 20;
    let mut x = vec![0f32; n];
    let (mut xp, mut nn, mut v) = (x.as_mut_ptr(), n as u64, 1.5f32);
    let t = std::time::Instant::now();
    launch(
        &fill,
        4096,
        256,
        0,
        &mut [arg(&mut xp), arg(&mut nn), arg(&mut v)],
    )
    .unwrap();
    println!("fill_f32 of 1M floats, 4096 x 256: {:?}", t.elapsed());
    let mm = engine_module("matmul")
        .function("matmul_bf16_exact")
        .unwrap();
    let (m, nf, k) = (1u32, 2048u32, 2048u32);
    let xs = vec![0.5f32; (m * k) as usize];
    let w = vec![0x3F80u16; (nf * k) as usize];
    let mut out = vec![0f32; (m * nf) as usize];
    for vec in [1i32, 0] {
        let (mut a, mut b, mut c, mut d, mut e, mut f, mut g) =
            (xs.as_ptr(), w.as_ptr(), out.as_mut_ptr(), m, nf, k, vec);
        let dims = LaunchDims {
            grid: [nf.div_ceil(8), m.div_ceil(4), 1],
            block: [256, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let mut args = [
            arg(&mut a),
            arg(&mut b),
            arg(&mut c),
            arg(&mut d),
            arg(&mut e),
            arg(&mut f),
            arg(&mut g),
        ];
        let t = std::time::Instant::now();
        unsafe { mm.launch_counted(&dims, &mut args) }.unwrap();
        println!(
            "matmul_bf16_exact 1 x 2048 x 2048 (vec {vec}): {:?}",
            t.elapsed()
        );
        assert_eq!(out[0], 1024.0);
    }
    let rms = ew.function("rms_norm_f32").unwrap();
    let (rows, d) = (64usize, 4096usize);
    let xs = vec![1f32; rows * d];
    let mut out = vec![0f32; rows * d];
    let (mut a, mut b, mut c, mut dd, mut eps) = (
        xs.as_ptr(),
        xs.as_ptr(),
        out.as_mut_ptr(),
        d as u64,
        1e-5f32,
    );
    let t = std::time::Instant::now();
    launch(
        &rms,
        rows as u32,
        256,
        0,
        &mut [
            arg(&mut a),
            arg(&mut b),
            arg(&mut c),
            arg(&mut dd),
            arg(&mut eps),
        ],
    )
    .unwrap();
    println!("rms_norm_f32 64 x 4096: {:?}", t.elapsed());
}
