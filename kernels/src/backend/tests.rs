//! Op-level tests through the [`Backend`] trait, each run on every backend present
//! ([`test_on_every_backend!`](crate::test_on_every_backend)) and compared with a
//! straightforward f64 reference on random inputs.

use super::*;
use crate::dtype::DType;
use crate::error::KernelError;
use crate::kv_dtype::KvCacheDType;
use crate::sampling_params::SamplingParams;
use crate::test_on_every_backend;

mod attention;
mod routing;
mod sampling;

/// Deterministic uniform values in `[-1, 1)`.
pub(super) struct Lcg(pub(super) u64);

impl Lcg {
    pub(super) fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub(super) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn all<'a, B: Backend>(dev: &B, buf: &'a B::Buffer) -> B::View<'a> {
    dev.view(buf, 0..dev.len(buf)).unwrap()
}

fn all_mut<'a, B: Backend>(dev: &B, buf: &'a mut B::Buffer) -> B::ViewMut<'a> {
    let n = dev.len(buf);
    dev.view_mut(buf, 0..n).unwrap()
}

fn kv_all<'a, B: Backend>(dev: &B, buf: &'a B::KvBuffer) -> B::KvView<'a> {
    dev.kv_view(buf, 0..dev.kv_len(buf)).unwrap()
}

fn kv_all_mut<'a, B: Backend>(dev: &B, buf: &'a mut B::KvBuffer) -> B::KvViewMut<'a> {
    let n = dev.kv_len(buf);
    dev.kv_view_mut(buf, 0..n).unwrap()
}

/// The f32 values a KV buffer holds.
fn kv_host<B: Backend>(dev: &B, buf: &B::KvBuffer) -> Vec<f32> {
    let mut h = vec![0.0; dev.kv_len(buf)];
    dev.kv_download(kv_all(dev, buf), &mut h).unwrap();
    h
}

/// A KV buffer of `dt` holding `rows` (`width`-wide), stored through `write_rows`.
fn kv_upload<B: Backend>(dev: &B, dt: KvCacheDType, rows: &[f32], width: usize) -> B::KvBuffer {
    let mut buf = dev.kv_zeros(dt, rows.len(), width).unwrap();
    let slots: Vec<usize> = (0..rows.len() / width).collect();
    let src = dev.upload(rows).unwrap();
    dev.write_rows(kv_all_mut(dev, &mut buf), width, &slots, all(dev, &src))
        .unwrap();
    buf
}

fn host<B: Backend>(dev: &B, buf: &B::Buffer) -> Vec<f32> {
    let mut h = vec![0.0; dev.len(buf)];
    dev.download(all(dev, buf), &mut h).unwrap();
    h
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() {
            g as f64 == w
        } else {
            (g as f64 - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(ok, "{what}[{i}]: got {g}, want {w}");
    }
}

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
];

fn memory_round_trip<B: Backend>(dev: &B) {
    let data: Vec<f32> = Lcg(1).vec(10);
    let mut buf = dev.upload(&data).unwrap();
    assert_eq!(host(dev, &buf), data);
    let mut part = [0.0; 3];
    dev.download(dev.view(&buf, 4..7).unwrap(), &mut part)
        .unwrap();
    assert_eq!(part, data[4..7]);
    assert!(dev.view(&buf, 8..11).is_err());
    assert!(dev.view_mut(&mut buf, 0..11).is_err());
    assert!(dev
        .download(dev.view(&buf, 0..2).unwrap(), &mut part)
        .is_err());
    assert_eq!(host(dev, &dev.zeros(5).unwrap()), [0.0; 5]);
    assert_eq!(dev.len(&dev.alloc(7).unwrap()), 7);
}

fn matmul_every_dtype<B: Backend>(dev: &B) {
    let (n, k) = (19, 64);
    let mut rng = Lcg(2);
    let w32 = WeightMatrix::from_f32(n, k, rng.vec(n * k)).unwrap();
    for dtype in DTYPES {
        let host_w = w32.to_format(dtype).unwrap();
        let w = dev.upload_matrix(&host_w).unwrap();
        assert_eq!(dev.matrix_shape(&w), (n, k, dtype));
        // The values the matmul must use, exactly: those of the device's storage type
        // (CUDA keeps non-f32 weights as bf16).
        let wf = host_w
            .to_format(dev.matrix_storage(&w))
            .unwrap()
            .to_f32_vec();
        for m in [1, 3, 6, 9] {
            let x = rng.vec(m * k);
            let xb = dev.upload(&x).unwrap();
            let mut out = dev.zeros(m * n).unwrap();
            let ov = all_mut(dev, &mut out);
            dev.matmul(all(dev, &xb), m, &w, ov, Precision::Exact)
                .unwrap();
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    (0..k)
                        .map(|j| x[r * k + j] as f64 * wf[c * k + j] as f64)
                        .sum()
                })
                .collect();
            // `auto` on an AVX2 CPU multiplies the 32-block formats at m ≤ 8 with int16
            // activations, each rounded by up to amax/65534 (seen: 8e-5 here); their
            // exact bound is checked in `cpu::int16_matmul::tests`.
            let int16 = dev.name() == "cpu" && crate::cpu::int16_matmul::applies(dtype, m);
            assert_close(
                &format!("matmul {dtype} m={m}"),
                &host(dev, &out),
                &want,
                if int16 { 5e-4 } else { 1e-5 },
            );
        }
    }
}

fn norms_and_elementwise<B: Backend>(dev: &B) {
    let (rows, d) = (3, 10);
    let mut rng = Lcg(3);
    let (x, w, g, u) = (
        rng.vec(rows * d),
        rng.vec(d),
        rng.vec(rows * d),
        rng.vec(rows * d),
    );
    let (xb, wb, gb, ub) = (
        dev.upload(&x).unwrap(),
        dev.upload(&w).unwrap(),
        dev.upload(&g).unwrap(),
        dev.upload(&u).unwrap(),
    );
    let eps = 1e-5;
    let want: Vec<f64> = (0..rows * d)
        .map(|i| {
            let row = &x[i / d * d..(i / d + 1) * d];
            let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
            x[i] as f64 / (ms + eps as f64).sqrt() * w[i % d] as f64
        })
        .collect();
    let mut out = dev.zeros(rows * d).unwrap();
    let ov = all_mut(dev, &mut out);
    dev.rms_norm(all(dev, &xb), all(dev, &wb), eps, ov).unwrap();
    assert_close("rms_norm", &host(dev, &out), &want, 1e-5);
    let mut inplace = dev.upload(&x).unwrap();
    dev.rms_norm_inplace(all_mut(dev, &mut inplace), all(dev, &wb), eps)
        .unwrap();
    assert_close("rms_norm_inplace", &host(dev, &inplace), &want, 1e-5);
    assert!(dev
        .rms_norm_inplace(
            all_mut(dev, &mut inplace),
            dev.view(&wb, 0..7).unwrap(),
            eps
        )
        .is_err());

    let ov = all_mut(dev, &mut out);
    dev.silu_mul(all(dev, &gb), all(dev, &ub), ov).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    assert_close("silu_mul", &host(dev, &out), &want, 1e-6);

    let mut a = dev.upload(&g).unwrap();
    dev.add(all_mut(dev, &mut a), all(dev, &ub)).unwrap();
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| (a + b) as f64).collect();
    assert_close("add", &host(dev, &a), &want, 0.0);
}

/// Plain RoPE against rotations computed in f64, for both pair layouts and for a
/// position beyond the precomputed table.
fn rope_matches_rotation<B: Backend>(dev: &B) {
    let (hd, heads, theta) = (8, 2, 10000.0f32);
    let table = dev
        .rope_table(hd, theta, RopeScalingKind::None, 16)
        .unwrap();
    let positions = [0usize, 5, 40];
    let x = Lcg(4).vec(positions.len() * heads * hd);
    for interleaved in [false, true] {
        let mut xb = dev.upload(&x).unwrap();
        let xv = all_mut(dev, &mut xb);
        dev.rope(&table, xv, &positions, hd, 0, interleaved)
            .unwrap();
        let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for (t, &pos) in positions.iter().enumerate() {
            for h in 0..heads {
                let v = &mut want[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                for i in 0..hd / 2 {
                    let inv = 1.0 / (theta as f64).powf(2.0 * i as f64 / hd as f64);
                    let (s, c) = (pos as f64 * inv).sin_cos();
                    let (a, b) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + hd / 2)
                    };
                    let (x0, x1) = (v[a], v[b]);
                    v[a] = x0 * c - x1 * s;
                    v[b] = x1 * c + x0 * s;
                }
            }
        }
        assert_close("rope", &host(dev, &xb), &want, 1e-5);
    }
}

/// YaRN RoPE on MLA-shaped rows (rope part at an offset): every pair's length is
/// scaled by the attention factor, scores depend only on relative positions, and
/// positions beyond the table agree with the table.
fn yarn_rope_properties<B: Backend>(dev: &B) {
    let (d, stride, offset) = (8, 12, 4);
    let yarn = YarnParams {
        factor: 40.0,
        original_max_position_embeddings: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale: Some(1.0),
        mscale_all_dim: Some(0.0),
        attention_factor: None,
        truncate: true,
    };
    let scaling = RopeScalingKind::Yarn(yarn);
    let short = dev.rope_table(d, 10000.0, scaling, 4).unwrap();
    let long = dev.rope_table(d, 10000.0, scaling, 64).unwrap();
    let af = 0.1 * 40f64.ln() + 1.0; // mscale_all_dim 0: yarn_get_mscale(factor, 1)
    let mut rng = Lcg(5);
    let (q, k) = (rng.vec(stride), rng.vec(stride));
    let rot = |table: &B::Rope, v: &[f32], pos: usize| {
        let mut b = dev.upload(v).unwrap();
        let bv = all_mut(dev, &mut b);
        dev.rope(table, bv, &[pos], stride, offset, false).unwrap();
        host(dev, &b)
    };
    let dot = |a: &[f32], b: &[f32]| -> f64 {
        a[offset..offset + d]
            .iter()
            .zip(&b[offset..offset + d])
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum()
    };
    let (q3, k1) = (rot(&long, &q, 3), rot(&long, &k, 1));
    let (q33, k31) = (rot(&long, &q, 33), rot(&long, &k, 31));
    assert_eq!(
        q3[..offset],
        q[..offset],
        "values before the rope part move"
    );
    assert_close(
        "yarn relative",
        &[dot(&q3, &k1) as f32],
        &[dot(&q33, &k31)],
        1e-4,
    );
    for i in 0..d / 2 {
        let pair = |v: &[f32]| (v[offset + i] as f64).hypot(v[offset + i + d / 2] as f64);
        assert_close(
            "yarn pair length",
            &[pair(&q3) as f32],
            &[af * pair(&q)],
            1e-5,
        );
    }
    let beyond: Vec<f64> = rot(&long, &q, 30).iter().map(|&v| v as f64).collect();
    assert_close("yarn beyond table", &rot(&short, &q, 30), &beyond, 1e-6);
    let mut bad = dev.upload(&q[..10]).unwrap();
    let bv = all_mut(dev, &mut bad);
    assert!(dev.rope(&long, bv, &[0], stride, offset, false).is_err());
}

fn embedding_gather<B: Backend>(dev: &B) {
    let (vocab, hidden) = (6, 32);
    let t32 = WeightMatrix::from_f32(vocab, hidden, Lcg(6).vec(vocab * hidden)).unwrap();
    for dtype in DTYPES {
        let host_t = t32.to_format(dtype).unwrap();
        let table = dev.upload_matrix(&host_t).unwrap();
        let rows = host_t
            .to_format(dev.matrix_storage(&table))
            .unwrap()
            .to_f32_vec();
        let ids = [3u32, 0, 5, 3];
        let mut out = dev.zeros(ids.len() * hidden).unwrap();
        dev.embedding(&table, &ids, all_mut(dev, &mut out)).unwrap();
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| &rows[i as usize * hidden..(i as usize + 1) * hidden])
            .map(|&v| v as f64)
            .collect();
        assert_close(&format!("embedding {dtype}"), &host(dev, &out), &want, 0.0);
        let mut out = dev.zeros(hidden).unwrap();
        assert!(dev.embedding(&table, &[6], all_mut(dev, &mut out)).is_err());
    }
}

/// Routing against brute force: softmax top-k, and V3's group-limited sigmoid choice
/// with a correction bias.
fn route_experts_matches_brute_force<B: Backend>(dev: &B) {
    let (n, e, k) = (6, 8, 3);
    let mut rng = Lcg(13);
    let logits = rng.vec(n * e).iter().map(|v| 3.0 * v).collect::<Vec<_>>();
    let bias = rng.vec(e);
    let lb = dev.upload(&logits).unwrap();
    let bb = dev.upload(&bias).unwrap();
    for (scoring, grouped) in [
        (RouterScoring::Softmax, false),
        (RouterScoring::Sigmoid, true),
    ] {
        let p = RouterParams {
            n_experts: e,
            experts_per_token: k,
            n_group: 4,
            topk_group: 2,
            group_limited: grouped,
            scoring,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        };
        let b = grouped.then(|| all(dev, &bb));
        let r = dev.route_experts(all(dev, &lb), &p, b).unwrap();
        for t in 0..n {
            let row: Vec<f64> = logits[t * e..(t + 1) * e]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let scores: Vec<f64> = match scoring {
                RouterScoring::Sigmoid => row.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect(),
                RouterScoring::Softmax => {
                    let z: f64 = row.iter().map(|l| l.exp()).sum();
                    row.iter().map(|l| l.exp() / z).collect()
                }
            };
            let choice: Vec<f64> = if grouped {
                scores
                    .iter()
                    .zip(&bias)
                    .map(|(s, b)| s + *b as f64)
                    .collect()
            } else {
                scores.clone()
            };
            let mut allowed: Vec<usize> = (0..e).collect();
            if grouped {
                // Groups of 2 ranked by the sum of both members; keep the best two.
                let mut groups: Vec<usize> = (0..4).collect();
                groups.sort_by(|&a, &b| {
                    let s = |g: usize| choice[2 * g] + choice[2 * g + 1];
                    s(b).total_cmp(&s(a))
                });
                allowed.retain(|&x| groups[..2].contains(&(x / 2)));
            }
            allowed.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]));
            let chosen = &allowed[..k];
            let total: f64 = chosen.iter().map(|&i| scores[i]).sum();
            let got = &r.experts[t * k..(t + 1) * k];
            assert_eq!(got, chosen, "token {t}, {scoring:?}");
            let want: Vec<f64> = chosen.iter().map(|&i| scores[i] / total * 2.5).collect();
            assert_close(
                "routing weights",
                &r.weights[t * k..(t + 1) * k],
                &want,
                1e-5,
            );
        }
    }
}

fn argmax_and_sampling<B: Backend>(dev: &B) {
    let vocab = 50;
    let logits = Lcg(14).vec(4 * vocab);
    let lb = dev.upload(&logits).unwrap();
    let want: Vec<u32> = logits
        .chunks_exact(vocab)
        .map(|r| (0..vocab).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap() as u32)
        .collect();
    assert_eq!(dev.argmax(all(dev, &lb), vocab).unwrap(), want);
    assert!(dev.argmax(all(dev, &lb), 7).is_err());
    let mut rng = Rng::new(1);
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let top1 = SamplingParams {
        top_k: 1,
        ..Default::default()
    };
    for (r, &w) in want.iter().enumerate() {
        let row = dev.view(&lb, r * vocab..(r + 1) * vocab).unwrap();
        assert_eq!(dev.sample(row, &greedy, &mut rng).unwrap(), w);
        assert_eq!(dev.sample(row, &top1, &mut rng).unwrap(), w);
    }
    // Two tokens with probabilities 1/4 and 3/4.
    let two = dev.upload(&[0.0, 3f32.ln()]).unwrap();
    let draws = 4000;
    let ones = (0..draws)
        .filter(|_| {
            dev.sample(all(dev, &two), &SamplingParams::default(), &mut rng)
                .unwrap()
                == 1
        })
        .count();
    let frac = ones as f64 / draws as f64;
    assert!(
        (frac - 0.75).abs() < 0.03,
        "sampled 1 with frequency {frac}"
    );
}

/// `add_bias` adds the bias to every row; `copy` copies and refuses unequal lengths.
fn bias_and_copy<B: Backend>(dev: &B) {
    let (rows, d) = (3, 5);
    let mut rng = Lcg(11);
    let (x, b) = (rng.vec(rows * d), rng.vec(d));
    let mut xb = dev.upload(&x).unwrap();
    let bb = dev.upload(&b).unwrap();
    dev.add_bias(all_mut(dev, &mut xb), all(dev, &bb)).unwrap();
    let want: Vec<f64> = (0..rows * d)
        .map(|i| x[i] as f64 + b[i % d] as f64)
        .collect();
    assert_close("add_bias", &host(dev, &xb), &want, 1e-6);
    assert!(dev
        .add_bias(dev.view_mut(&mut xb, 0..7).unwrap(), all(dev, &bb))
        .is_err());

    let mut dst = dev.zeros(rows * d).unwrap();
    dev.copy(
        dev.view(&xb, d..2 * d).unwrap(),
        dev.view_mut(&mut dst, 0..d).unwrap(),
    )
    .unwrap();
    let got = host(dev, &dst);
    assert_eq!(&got[..d], &host(dev, &xb)[d..2 * d]);
    assert!(got[d..].iter().all(|&v| v == 0.0));
    assert!(dev
        .copy(
            dev.view(&xb, 0..d).unwrap(),
            dev.view_mut(&mut dst, 0..d + 1).unwrap()
        )
        .is_err());
}

/// `fill`, `copy_strided` (one head out of every row and back), `gather_rows`,
/// `scatter_add_rows` and `write_rows` move exactly the rows they name, and refuse
/// rows out of range.
fn row_movement<B: Backend>(dev: &B) {
    let (rows, stride, width) = (3, 7, 2);
    let src: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
    let sb = dev.upload(&src).unwrap();
    let mut packed = dev.zeros(rows * width).unwrap();
    let from = (all(dev, &sb), Strided::new(stride, 4));
    let to = (all_mut(dev, &mut packed), Strided::packed(width));
    dev.copy_strided(from, to, rows, width).unwrap();
    assert_eq!(host(dev, &packed), [4.0, 5.0, 11.0, 12.0, 18.0, 19.0]);
    let mut back = dev.zeros(rows * stride).unwrap();
    dev.fill(all_mut(dev, &mut back), -1.0).unwrap();
    let from = (all(dev, &packed), Strided::packed(width));
    let to = (all_mut(dev, &mut back), Strided::new(stride, 1));
    dev.copy_strided(from, to, rows, width).unwrap();
    let got = host(dev, &back);
    assert_eq!(&got[..stride], &[-1.0, 4.0, 5.0, -1.0, -1.0, -1.0, -1.0]);
    assert_eq!(&got[2 * stride + 1..2 * stride + 3], &[18.0, 19.0]);
    let from = (all(dev, &sb), Strided::new(stride, 6));
    let to = (all_mut(dev, &mut packed), Strided::packed(width));
    assert!(dev.copy_strided(from, to, rows, width).is_err());

    let mut gathered = dev.zeros(2 * stride).unwrap();
    dev.gather_rows(all(dev, &sb), stride, &[2, 0], all_mut(dev, &mut gathered))
        .unwrap();
    let got = host(dev, &gathered);
    assert_eq!(&got[..stride], &src[2 * stride..]);
    assert_eq!(&got[stride..], &src[..stride]);
    assert!(dev
        .gather_rows(all(dev, &sb), stride, &[3, 0], all_mut(dev, &mut gathered))
        .is_err());

    let mut sum = dev.zeros(rows * stride).unwrap();
    let (r, s) = ([1usize, 1], [0.5f32, 2.0]);
    dev.scatter_add_rows(all(dev, &gathered), stride, &r, &s, all_mut(dev, &mut sum))
        .unwrap();
    let got = host(dev, &sum);
    let want: Vec<f32> = (0..stride)
        .map(|c| 0.5 * src[2 * stride + c] + 2.0 * src[c])
        .collect();
    assert_eq!(&got[stride..2 * stride], &want[..]);
    assert!(got[..stride]
        .iter()
        .chain(&got[2 * stride..])
        .all(|&v| v == 0.0));
    let bad = dev.scatter_add_rows(
        all(dev, &gathered),
        stride,
        &[0, 3],
        &s,
        all_mut(dev, &mut sum),
    );
    assert!(bad.is_err());

    // Stored rounded to nearest even: 19 = 1.1875·16 is 20 in E4M3 (3 mantissa bits);
    // in E5M2 (2 bits) 18 is a tie between 16 and 20 (to even: 16) and 19 is 20.
    for dt in KvCacheDType::ALL {
        let (a, b) = match dt {
            KvCacheDType::Fp8E4M3 => (18.0, 20.0),
            KvCacheDType::Fp8E5M2 => (16.0, 20.0),
            _ => (18.0, 19.0),
        };
        let mut cache = dev.kv_zeros(dt, 4 * width, width).unwrap();
        let slots = [3, usize::MAX, 0];
        let stored = dev
            .write_rows(
                kv_all_mut(dev, &mut cache),
                width,
                &slots,
                all(dev, &packed),
            )
            .unwrap();
        assert_eq!(stored, 2);
        assert_eq!(
            kv_host(dev, &cache),
            [a, b, 0.0, 0.0, 0.0, 0.0, 4.0, 5.0],
            "{dt}"
        );
    }
    let mut cache = dev.kv_zeros(KvCacheDType::F32, 4 * width, width).unwrap();
    let bad = dev.write_rows(
        kv_all_mut(dev, &mut cache),
        width,
        &[4, 0, 0],
        all(dev, &packed),
    );
    assert!(bad.is_err());
}

test_on_every_backend!(
    bias_and_copy,
    row_movement,
    memory_round_trip,
    matmul_every_dtype,
    norms_and_elementwise,
    rope_matches_rotation,
    yarn_rope_properties,
    embedding_gather,
    route_experts_matches_brute_force,
    argmax_and_sampling,
);
