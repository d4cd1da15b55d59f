//! Unit tests.
use super::*;
use crate::backend::PagedBatch;
use crate::cpu::kv_store::KvStore;
use crate::kv_dtype::KvCacheDType;

/// `x` stored in a cache of type `dt` in rows of `hd` (one scale each for FP8).
fn store(dt: KvCacheDType, x: &[f32], hd: usize) -> KvStore {
    let mut s = KvStore::zeros(dt, x.len(), hd).unwrap();
    s.view_mut(0..x.len()).encode(0, x);
    s
}

/// `x` as a cache of type `dt` holds it (stored, then read back as f32).
fn dequantized(dt: KvCacheDType, x: &[f32], hd: usize) -> Vec<f32> {
    let mut o = vec![0.0; x.len()];
    store(dt, x, hd).view(0..x.len()).decode(0, &mut o);
    o
}

struct Lcg(u64);
impl Lcg {
    fn u(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn f(&mut self) -> f32 {
        (self.u() % 20001) as f32 / 10000.0 - 1.0
    }
}

/// A cache holding `lens[s]` tokens per sequence in shuffled blocks.
struct Setup {
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<Vec<u32>>,
    dense_k: Vec<Vec<f32>>, // per sequence [len, nkv, hd]
    dense_v: Vec<Vec<f32>>,
}

/// With `spread`, the K/V head rows are scaled by 2⁻ᵏ, k cycling through 0..=20 (what
/// FP8 holds only with its per-row scales).
fn setup(g: &mut Lcg, lens: &[usize], nkv: usize, hd: usize, bs: usize, spread: bool) -> Setup {
    let row = nkv * hd;
    let total_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..total_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        let j = (g.u() as usize) % (i + 1);
        ids.swap(i, j);
    }
    let mut k = vec![f32::NAN; total_blocks * bs * row]; // unused slots are NaN
    let mut v = k.clone();
    let mut tables = Vec::new();
    let (mut dk, mut dv) = (Vec::new(), Vec::new());
    let mut next = 0;
    for &len in lens {
        let nb = len.div_ceil(bs);
        let t: Vec<u32> = ids[next..next + nb].to_vec();
        next += nb;
        let magnitude = |i: usize| {
            if spread {
                2f32.powi(-((i / hd * 5 % 21) as i32))
            } else {
                1.0
            }
        };
        let kk: Vec<f32> = (0..len * row).map(|i| g.f() * magnitude(i)).collect();
        let vv: Vec<f32> = (0..len * row).map(|i| g.f() * magnitude(i)).collect();
        let slots: Vec<usize> = (0..len).map(|j| t[j / bs] as usize * bs + j % bs).collect();
        write_kv(&mut k, &mut v, nkv, hd, &slots, &kk, &vv).unwrap();
        tables.push(t);
        dk.push(kk);
        dv.push(vv);
    }
    Setup {
        k,
        v,
        tables,
        dense_k: dk,
        dense_v: dv,
    }
}

#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    nq: usize,
    nkv: usize,
    hd: usize,
    scale: f32,
    dk: &[f32],
    dv: &[f32],
    kv_len: usize,
) -> (Vec<f64>, Vec<f64>) {
    let r = nq / nkv;
    let mut o = vec![0.0; nq * hd];
    let mut lse = vec![f64::NEG_INFINITY; nq];
    for h in 0..nq {
        let g = h / r;
        let s: Vec<f64> = (0..kv_len)
            .map(|j| {
                (0..hd)
                    .map(|d| q[h * hd + d] as f64 * dk[(j * nkv + g) * hd + d] as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        if kv_len == 0 {
            continue;
        }
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        lse[h] = m + z.ln();
        for j in 0..kv_len {
            let p = (s[j] - m).exp() / z;
            for d in 0..hd {
                o[h * hd + d] += p * dv[(j * nkv + g) * hd + d] as f64;
            }
        }
    }
    (o, lse)
}

fn run_case(
    nq: usize,
    nkv: usize,
    hd: usize,
    bs: usize,
    lens: &[usize],
    threads: usize,
    seed: u64,
) {
    // Tokens: for each sequence the last 3 positions (causal), plus kv_len 0 tokens.
    let mut tokens = Vec::new();
    for (s, &len) in lens.iter().enumerate() {
        for back in 0..3usize {
            tokens.push((s as u32, len.saturating_sub(back) as u32));
        }
    }
    check(nq, nkv, hd, bs, lens, &tokens, threads, seed, 2.0, false);
}

/// Runs `tokens` (`(seq, kv_len)`) through the kernel of every level this CPU runs
/// with caches of every [`KvCacheDType`]; compares each with the f64 reference on the
/// cache's dequantized contents (1e-4, as for f32: the kernels convert exactly) and
/// each SIMD level with the scalar one (2e-5).
#[allow(clippy::too_many_arguments)]
fn check(
    nq: usize,
    nkv: usize,
    hd: usize,
    bs: usize,
    lens: &[usize],
    tokens: &[(u32, u32)],
    threads: usize,
    seed: u64,
    qscale: f32,
    spread: bool,
) {
    let mut g = Lcg(seed);
    let su = setup(&mut g, lens, nkv, hd, bs, spread);
    let tseq: Vec<u32> = tokens.iter().map(|t| t.0).collect();
    let tlen: Vec<u32> = tokens.iter().map(|t| t.1).collect();
    let n = tseq.len();
    let q: Vec<f32> = (0..n * nq * hd).map(|_| g.f() * qscale).collect();
    let tables: Vec<&[u32]> = su.tables.iter().map(|t| t.as_slice()).collect();
    let b = AttentionBatch {
        q: &q,
        params: PagedAttentionParams {
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            batch: PagedBatch {
                block_size: bs,
                token_seq: &tseq,
                token_kv_len: &tlen,
                block_tables: &tables,
            },
        },
    };
    let pool = ThreadPool::new(threads);
    for dt in KvCacheDType::ALL {
        let (kc, vc) = (store(dt, &su.k, hd), store(dt, &su.v, hd));
        let dense = |x: &Vec<f32>| dequantized(dt, x, hd);
        let dense_k: Vec<Vec<f32>> = su.dense_k.iter().map(dense).collect();
        let dense_v: Vec<Vec<f32>> = su.dense_v.iter().map(dense).collect();
        let (kv, vv) = (kc.view(0..su.k.len()), vc.view(0..su.v.len()));
        check_kernels(&pool, &b, kv, vv, &dense_k, &dense_v);
    }
}

/// The kernels of every available level on caches `kc`/`vc` against the f64 reference over
/// `dense_k`/`dense_v` (per sequence, the values the caches hold).
fn check_kernels(
    pool: &ThreadPool,
    b: &AttentionBatch,
    kc: KvRef<'_>,
    vc: KvRef<'_>,
    dense_k: &[Vec<f32>],
    dense_v: &[Vec<f32>],
) {
    let (nq, nkv, hd, bs) = (
        b.params.n_q_heads,
        b.params.n_kv_heads,
        b.params.head_dim,
        b.params.batch.block_size,
    );
    let (q, tseq, tlen) = (b.q, b.params.batch.token_seq, b.params.batch.token_kv_len);
    let n = tseq.len();
    let dt = kc.dtype();
    let mut results = Vec::new();
    let levels = CpuIsa::available();
    assert_eq!(levels[0], CpuIsa::Scalar);
    for &isa in &levels {
        let mut out = vec![f32::NAN; n * nq * hd];
        let mut lse = vec![f32::NAN; n * nq];
        paged_attention_impl(pool, b, kc, vc, &mut out, &mut lse, isa).unwrap();
        for t in 0..n {
            let s = tseq[t] as usize;
            let (ro, rl) = reference(
                &q[t * nq * hd..(t + 1) * nq * hd],
                nq,
                nkv,
                hd,
                b.params.scale,
                &dense_k[s],
                &dense_v[s],
                tlen[t] as usize,
            );
            for h in 0..nq {
                let got = lse[t * nq + h];
                if rl[h] == f64::NEG_INFINITY {
                    assert_eq!(got, f32::NEG_INFINITY, "{dt} {isa}");
                } else {
                    assert!(
                        (got as f64 - rl[h]).abs() < 1e-4,
                        "{dt} {isa}: lse {got} vs {}",
                        rl[h]
                    );
                }
            }
            for (a, e) in out[t * nq * hd..(t + 1) * nq * hd].iter().zip(&ro) {
                assert!((*a as f64 - e).abs() < 1e-4, "{dt} {isa}: out {a} vs {e}");
            }
        }
        results.push((out, lse));
    }
    let (so, sl) = &results[0];
    for (isa, (vo, vl)) in levels.iter().zip(&results).skip(1) {
        for (a, e) in vo.iter().zip(so).chain(vl.iter().zip(sl)) {
            assert!(
                a == e || (a - e).abs() < 2e-5,
                "{dt}: {isa} {a} vs scalar {e} (nq={nq} nkv={nkv} hd={hd} bs={bs})"
            );
        }
    }
}

#[test]
fn prefill_tiles_and_odd_head_dims() {
    // Causal prefill chunks (tiles of several tokens of one sequence), decode tokens
    // of other sequences and empty tokens in one batch.
    for &(nq, nkv, hd, bs) in &[
        (4, 1, 64, 16),
        (4, 1, 128, 16),
        (8, 2, 20, 5),
        (3, 3, 72, 16),
        (2, 1, 136, 7),
        (16, 1, 8, 16),
        (1, 1, 48, 3),
        (6, 2, 40, 16),
        (5, 1, 13, 4),
    ] {
        let lens = [300usize, 90, 17];
        let mut tokens = Vec::new();
        for i in 0..40u32 {
            tokens.push((0, 261 + i)); // last 40 positions of sequence 0
        }
        tokens.push((1, 90));
        tokens.push((2, 0));
        tokens.push((2, 17));
        for i in 0..9u32 {
            tokens.push((1, 1 + i * 10)); // sparse, non-monotone within a tile
        }
        for threads in [1, 2] {
            check(
                nq,
                nkv,
                hd,
                bs,
                &lens,
                &tokens,
                threads,
                5 + hd as u64,
                2.0,
                false,
            );
        }
    }
}

#[test]
fn large_scores_and_splits() {
    // Scores of magnitude ~30 move the running max often; long contexts split.
    for &(nq, nkv, hd) in &[(4, 1, 64), (8, 1, 64), (4, 4, 128), (2, 2, 16)] {
        let lens = [2500usize];
        let tokens = [(0u32, 2500u32), (0, 2499), (0, 1)];
        for threads in [1, 2, 3] {
            check(nq, nkv, hd, 16, &lens, &tokens, threads, 77, 30.0, false);
        }
        check(nq, nkv, hd, 16, &lens, &[(0, 2500)], 2, 78, 30.0, false);
    }
}

/// K/V head rows of magnitudes 1 to 2⁻²⁰ (each FP8 row with its own scale; the cache
/// holds the same rows as the dense reference, so every level must match it as
/// tightly as for f32), with tiles and odd head dims that cut decoded rows mid-vector.
#[test]
fn rows_of_every_magnitude() {
    for &(nq, nkv, hd, bs) in &[
        (4, 1, 64, 16),
        (8, 2, 20, 5),
        (6, 3, 13, 4),
        (4, 4, 128, 16),
    ] {
        let lens = [300usize, 45];
        let mut tokens: Vec<(u32, u32)> = (0..20).map(|i| (0, 281 + i)).collect();
        tokens.extend([(1, 45), (1, 0), (1, 7)]);
        for threads in [1, 2] {
            check(
                nq,
                nkv,
                hd,
                bs,
                &lens,
                &tokens,
                threads,
                31 + hd as u64,
                20.0,
                true,
            );
        }
    }
}

#[test]
fn matches_dense_reference() {
    for &(nq, nkv) in &[(4, 4), (9, 3), (8, 2)] {
        for &bs in &[1, 16] {
            run_case(nq, nkv, 16, bs, &[0, 1, 37, 70], 2, (nq * 100 + bs) as u64);
        }
    }
    run_case(9, 3, 64, 16, &[5, 130], 1, 7);
}

#[test]
fn long_sequence_split_matches() {
    run_case(3, 1, 64, 16, &[3000], 2, 11);
    run_case(4, 2, 32, 16, &[2100], 3, 12);
}

#[test]
fn sharded_kv_merge_equals_full() {
    // DCP-style: position p lives on shard p % n_shards; attend each shard, merge.
    let (nq, nkv, hd, bs, len) = (6, 2, 32, 4, 45usize);
    for n_shards in [1usize, 2, 3, 8] {
        let mut g = Lcg(99 + n_shards as u64);
        let full = setup(&mut g, &[len], nkv, hd, bs, false);
        let q: Vec<f32> = (0..nq * hd).map(|_| g.f()).collect();
        let scale = 0.2;
        let pool = ThreadPool::new(2);
        let mut outs = vec![vec![0.0f32; nq * hd]; n_shards];
        let mut lses = vec![vec![0.0f32; nq]; n_shards];
        for sh in 0..n_shards {
            let pos: Vec<usize> = (sh..len).step_by(n_shards).collect();
            let row = nkv * hd;
            let kk: Vec<f32> = pos
                .iter()
                .flat_map(|&p| full.dense_k[0][p * row..(p + 1) * row].to_vec())
                .collect();
            let vv: Vec<f32> = pos
                .iter()
                .flat_map(|&p| full.dense_v[0][p * row..(p + 1) * row].to_vec())
                .collect();
            let nb = pos.len().div_ceil(bs).max(1);
            let table: Vec<u32> = (0..nb as u32).rev().collect();
            let mut kc = vec![0.0; nb * bs * row];
            let mut vc = kc.clone();
            let slots: Vec<usize> = (0..pos.len())
                .map(|j| table[j / bs] as usize * bs + j % bs)
                .collect();
            write_kv(&mut kc, &mut vc, nkv, hd, &slots, &kk, &vv).unwrap();
            let tables: [&[u32]; 1] = [&table];
            let b = AttentionBatch {
                q: &q,
                params: PagedAttentionParams {
                    n_q_heads: nq,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale,
                    batch: PagedBatch {
                        block_size: bs,
                        token_seq: &[0],
                        token_kv_len: &[pos.len() as u32],
                        block_tables: &tables,
                    },
                },
            };
            paged_attention(&pool, &b, &kc, &vc, &mut outs[sh], &mut lses[sh]).unwrap();
        }
        let po: Vec<&[f32]> = outs.iter().map(|v| v.as_slice()).collect();
        let pl: Vec<&[f32]> = lses.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0.0; nq * hd];
        let mut lse = vec![0.0; nq];
        merge_partials(&po, &pl, nq, hd, &mut out, &mut lse).unwrap();
        let (ro, rl) = reference(
            &q,
            nq,
            nkv,
            hd,
            scale,
            &full.dense_k[0],
            &full.dense_v[0],
            len,
        );
        for (a, e) in out.iter().zip(&ro) {
            assert!((*a as f64 - e).abs() < 1e-5);
        }
        for (a, e) in lse.iter().zip(&rl) {
            assert!((*a as f64 - e).abs() < 1e-5);
        }
    }
}

#[test]
fn merge_all_empty_and_errors() {
    let nan = [f32::NAN; 2];
    let (mut out, mut lse) = ([1.0; 2], [1.0; 1]);
    merge_partials(&[&nan], &[&[f32::NEG_INFINITY]], 1, 2, &mut out, &mut lse).unwrap();
    assert_eq!(out, [0.0, 0.0]);
    assert_eq!(lse, [f32::NEG_INFINITY]);
    assert!(merge_partials(&[&nan], &[&[0.0, 0.0]], 1, 2, &mut out, &mut lse).is_err());
    let bt: [&[u32]; 1] = [&[5]];
    let b = AttentionBatch {
        q: &[0.0; 2],
        params: PagedAttentionParams {
            n_q_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
            batch: PagedBatch {
                block_size: 1,
                token_seq: &[0],
                token_kv_len: &[1],
                block_tables: &bt,
            },
        },
    };
    let pool = ThreadPool::new(1);
    assert!(paged_attention(&pool, &b, &[0.0; 4], &[0.0; 4], &mut out, &mut lse).is_err());
}

/// The AVX2 primitives against the scalar ones at every length 1..=40 (all tails).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_primitives_match_scalar() {
    use super::avx2::Avx2;
    if !CpuIsa::available().contains(&CpuIsa::Avx2) {
        return;
    }
    // Runs `f` with the features enabled, as `attend_body_avx2` does.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
    // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
    unsafe { on_avx2(primitives_match_scalar::<Avx2>) };
}

/// The NEON primitives against the scalar ones at every length 1..=40 (all tails).
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_primitives_match_scalar() {
    primitives_match_scalar::<super::neon::Neon>();
}

/// `M`'s primitives against the scalar ones at every length 1..=40 (all tails); the
/// CPU must support `M`'s instructions.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn primitives_match_scalar<M: Math>() {
    let mut g = Lcg(3);
    for n in 1..=40usize {
        let a: Vec<f32> = (0..n).map(|_| g.f()).collect();
        let k: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| g.f()).collect()).collect();
        let kr = [&k[0][..], &k[1][..], &k[2][..], &k[3][..]];
        let d = (M::dot(&a, &k[0]), M::dot4(&a, kr));
        let e = Scalar::dot4(&a, kr);
        assert!((d.0 - e[0]).abs() < 1e-5, "dot n={n}");
        for x in 0..4 {
            assert!(
                (d.1[x] - e[x]).abs() < 1e-5,
                "dot4 n={n}: {:?} vs {e:?}",
                d.1
            );
        }
        // p·V over c = n % 7 + 1 rows of a V laid out with stride n + 3.
        let c = n % 7 + 1;
        let v: Vec<f32> = (0..c * (n + 3)).map(|_| g.f()).collect();
        let offs: Vec<usize> = (0..c).rev().map(|j| j * (n + 3)).collect();
        let p: Vec<f32> = (0..c).map(|_| g.f()).collect();
        let (mut x, mut y) = (a.clone(), a.clone());
        M::pv(&p, &offs, &v, &mut x);
        Scalar::pv(&p, &offs, &v, &mut y);
        let (mut x2, mut y2) = (x.clone(), y.clone());
        M::scale(0.3, &mut x);
        M::axpy(-1.5, &k[1], &mut x2);
        Scalar::scale(0.3, &mut y);
        Scalar::axpy(-1.5, &k[1], &mut y2);
        for (a, e) in x.iter().zip(&y).chain(x2.iter().zip(&y2)) {
            assert!((a - e).abs() < 1e-5, "pv/scale/axpy n={n}: {a} vs {e}");
        }
        // exp: -inf gives 0 (and no NaN in the sum); the rest within ~2 ulp of f64
        // (below the normal range 0 is within 1.2e-38).
        let mut s: Vec<f32> = (0..n).map(|i| g.f() * 40.0 - 40.0 + i as f32).collect();
        if n > 1 {
            s[n / 2] = f32::NEG_INFINITY; // the max stays finite, as in the kernel
        }
        let mx = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: Vec<f64> = s.iter().map(|&x| ((x - mx) as f64).exp()).collect();
        let sum = M::exp_sum(&mut s, mx);
        for (a, e) in s.iter().zip(&want) {
            assert!(
                (*a as f64 - e).abs() <= 2.5e-7 * e + 1.2e-38,
                "exp n={n}: {a} vs {e}"
            );
        }
        let ws: f64 = want.iter().sum();
        assert!((sum as f64 - ws).abs() < 1e-6 * ws, "exp sum n={n}");
    }
    // The clamps: far below the normal range flushes to 0; NaN stays NaN.
    let mut s = [
        -90.0f32,
        -87.0,
        -200.0,
        f32::NAN,
        0.0,
        -1e-3,
        -20.0,
        -50.0,
        -87.3,
    ];
    let want: Vec<f64> = s.iter().map(|&x| (x as f64).exp()).collect();
    M::exp_sum(&mut s, 0.0);
    assert_eq!((s[0], s[2]), (0.0, 0.0));
    assert!(s[3].is_nan());
    for i in [1, 4, 5, 6, 7, 8] {
        let (a, e) = (s[i] as f64, want[i]);
        assert!((a - e).abs() <= 2.5e-7 * e, "exp of lane {i}: {a} vs {e}");
    }
}
