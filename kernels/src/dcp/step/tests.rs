use std::sync::Arc;

use super::*;
use crate::comm::{HostCollectives, InProcessComm};
use crate::dcp::merge::merged_lse;
use crate::CpuBackend;

fn host_groups(ranks: usize) -> Vec<HostCollectives> {
    InProcessComm::group(ranks)
        .into_iter()
        .map(|c| HostCollectives::new(Arc::new(c)))
        .collect()
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(seed: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (seed * 7919 + i * 104_729) % 1009;
            x as f32 / 504.5 - 1.0
        })
        .collect()
}

/// Naive attention of `q` (`[n, heads, d]`) to `keys`/`vals` (`[len, d]`, one KV head),
/// writing output and LSE; no keys gives zeros and −inf.
fn attend_naive(
    q: &[f32],
    heads: usize,
    d: usize,
    keys: &[f32],
    vals: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
) {
    let len = keys.len() / d;
    for (row, qv) in q.chunks_exact(d).enumerate() {
        let scores: Vec<f32> = keys
            .chunks_exact(d)
            .map(|k| k.iter().zip(qv).map(|(a, b)| a * b).sum())
            .collect();
        let l = merged_lse(scores.iter().copied());
        lse[row] = l;
        let o = &mut out[row * d..(row + 1) * d];
        o.fill(0.0);
        for j in 0..len {
            let w = (scores[j] - l).exp();
            for (a, v) in o.iter_mut().zip(&vals[j * d..(j + 1) * d]) {
                *a += w * v;
            }
        }
    }
    debug_assert_eq!(q.len() / d, out.len() / d);
    let _ = heads;
}

/// Every exchange, on groups of 1 to 4 ranks whose shards hold different numbers of
/// keys (some none), gives each rank its heads of attention over all keys.
#[test]
fn both_exchanges_equal_attention_over_the_whole_cache() {
    let (n, h, d) = (3, 2, 4);
    for ranks in 1..=4 {
        // Rank r holds r·2 keys (rank 0 none): the shards are disjoint pieces of one cache.
        let lens: Vec<usize> = (0..ranks)
            .map(|r| 2 * r + usize::from(ranks == 1))
            .collect();
        let total: usize = lens.iter().sum();
        let keys = values(1, total * d);
        let vals = values(2, total * d);
        let starts: Vec<usize> = lens
            .iter()
            .scan(0, |acc, &l| {
                let s = *acc;
                *acc += l;
                Some(s)
            })
            .collect();
        let all_h = ranks * h;
        let q_of = |r: usize| values(10 + r, n * h * d);
        // The whole group's queries, [n, all_h, d], against the whole cache.
        let mut q_all = vec![0.0; n * all_h * d];
        for r in 0..ranks {
            let q = q_of(r);
            for t in 0..n {
                q_all[(t * all_h + r * h) * d..(t * all_h + (r + 1) * h) * d]
                    .copy_from_slice(&q[t * h * d..(t + 1) * h * d]);
            }
        }
        let mut want = vec![0.0; n * all_h * d];
        let mut want_lse = vec![0.0; n * all_h];
        attend_naive(&q_all, all_h, d, &keys, &vals, &mut want, &mut want_lse);
        for exchange in [
            MergeExchange::AllToAll,
            MergeExchange::AllGatherReduceScatter,
        ] {
            let groups = host_groups(ranks);
            let dev = CpuBackend::new(1);
            std::thread::scope(|s| {
                for (rank, c) in groups.iter().enumerate() {
                    let (keys, vals, want, dev) = (&keys, &vals, &want, &dev);
                    let (start, len) = (starts[rank], lens[rank]);
                    let q = q_of(rank);
                    s.spawn(move || {
                        let mut step = DcpAttention::new(exchange);
                        let shape = DcpShape {
                            tokens: n,
                            heads: h,
                            q_dim: d,
                            v_dim: d,
                            token_parts: 1,
                        };
                        for _layer in 0..3 {
                            let mut out = vec![f32::NAN; n * h * d];
                            step.run(dev, c, &q, shape, &mut out, |qa, heads, o, l| {
                                assert_eq!(heads, all_h);
                                let (k, v) = (
                                    &keys[start * d..(start + len) * d],
                                    &vals[start * d..(start + len) * d],
                                );
                                let (qa, o) = (&qa[..n * heads * d], &mut o[..n * heads * d]);
                                attend_naive(qa, heads, d, k, v, o, &mut l[..n * heads]);
                                Ok::<(), KernelError>(())
                            })
                            .unwrap();
                            let r = rank;
                            for t in 0..n {
                                let mine = &out[t * h * d..(t + 1) * h * d];
                                let whole =
                                    &want[(t * all_h + r * h) * d..(t * all_h + (r + 1) * h) * d];
                                for (a, b) in mine.iter().zip(whole) {
                                    assert!(
                                        (a - b).abs() < 1e-5,
                                        "{exchange:?} ranks={ranks} rank={r}: {a} vs {b}"
                                    );
                                }
                            }
                        }
                    });
                }
            });
        }
    }
}

#[test]
fn wrong_buffer_lengths_are_refused() {
    let groups = host_groups(1);
    let dev = CpuBackend::new(1);
    let mut step = DcpAttention::new(MergeExchange::default());
    let shape = DcpShape {
        tokens: 2,
        heads: 1,
        q_dim: 4,
        v_dim: 4,
        token_parts: 1,
    };
    let mut out = vec![0.0; 8];
    let r = step.run(
        &dev,
        &groups[0],
        &vec![0.0; 7],
        shape,
        &mut out,
        |_, _, _, _| Ok::<(), KernelError>(()),
    );
    assert!(r.is_err());
}

/// Token blocks (prefill context parallelism): a group of `parts` blocks of `head_ranks`
/// ranks, each rank with its own tokens' queries of its own heads, gets exactly what its
/// queries give against the whole cache, whichever shard each key sits in.
#[test]
fn token_blocks_get_their_own_tokens_attention_over_the_whole_cache() {
    let (n, h, d) = (3, 2, 4);
    for (parts, head_ranks) in [(2, 1), (2, 2), (3, 1), (4, 1), (2, 3)] {
        let ranks = parts * head_ranks;
        let lens: Vec<usize> = (0..ranks).map(|r| (r * 3) % 5).collect();
        let total: usize = lens.iter().sum();
        let keys = values(3, total * d);
        let vals = values(4, total * d);
        let starts: Vec<usize> = (0..ranks).map(|r| lens[..r].iter().sum()).collect();
        let q_of = |c: usize| values(20 + c, n * h * d);
        let groups = host_groups(ranks);
        let dev = CpuBackend::new(1);
        std::thread::scope(|s| {
            for (c, g) in groups.iter().enumerate() {
                let (keys, vals, dev) = (&keys, &vals, &dev);
                let (start, len) = (starts[c], lens[c]);
                s.spawn(move || {
                    let q = q_of(c);
                    let mut want = vec![0.0; n * h * d];
                    let mut want_lse = vec![0.0; n * h];
                    attend_naive(&q, h, d, keys, vals, &mut want, &mut want_lse);
                    let shape = DcpShape {
                        tokens: n,
                        heads: h,
                        q_dim: d,
                        v_dim: d,
                        token_parts: parts,
                    };
                    let mut step = DcpAttention::new(MergeExchange::AllToAll);
                    let mut out = vec![f32::NAN; n * h * d];
                    step.run(dev, g, &q, shape, &mut out, |qa, heads, o, l| {
                        assert_eq!(heads, head_ranks * h);
                        let rows = parts * n * heads;
                        let (k, v) = (
                            &keys[start * d..(start + len) * d],
                            &vals[start * d..(start + len) * d],
                        );
                        attend_naive(
                            &qa[..rows * d],
                            heads,
                            d,
                            k,
                            v,
                            &mut o[..rows * d],
                            &mut l[..rows],
                        );
                        Ok::<(), KernelError>(())
                    })
                    .unwrap();
                    for (a, b) in out.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "parts={parts} ranks={ranks} rank={c}: {a} vs {b}"
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn token_blocks_that_do_not_tile_the_group_are_refused() {
    let groups = host_groups(1);
    let dev = CpuBackend::new(1);
    let mut step = DcpAttention::new(MergeExchange::default());
    let shape = DcpShape {
        tokens: 1,
        heads: 1,
        q_dim: 1,
        v_dim: 1,
        token_parts: 2,
    };
    let mut out = vec![0.0; 1];
    let r = step.run(
        &dev,
        &groups[0],
        &vec![0.0; 1],
        shape,
        &mut out,
        |_, _, _, _| Ok::<(), KernelError>(()),
    );
    assert!(r.unwrap_err().to_string().contains("token blocks"));
}
