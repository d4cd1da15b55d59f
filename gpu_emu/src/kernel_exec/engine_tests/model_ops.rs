//! The model-level kernels (sampling, attention with its LSE merge, FP8 KV rows) against
//! host references under several schedules, and launch timings.

use super::{arg, engine_module, launch, launch_dims, rand_f32, schedules};
use crate::kernel_exec::LaunchDims;

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
