//! Paged-attention throughput: decode GB/s of KV read and prefill tokens/s.
//!
//! `cargo run -p dcpserve-kernels --release --example attention_bench [decode|prefill] [reps]`
//!
//! Decode: one query token per sequence against a long context, for contexts 1k/4k/16k,
//! GQA 4:1 (4 query heads on 1 KV head) and 1:1 (4 on 4), head_dim 64 and 128, 1 and 2
//! threads. Each call attends a different "layer" of a cache much larger than L3, so the
//! numbers are DRAM-bound like a real decode step, not L3-hot (`ATT_COLD_MB=0`: hot).
//! Prefill: a chunk of query tokens at the end of a long cache (causal via
//! `token_kv_len`), and a whole short prompt. Every line is the median of `reps` runs.

use dcpserve_kernels::{
    paged_attention, AttentionBatch, PagedAttentionParams, PagedBatch, ThreadPool,
};
use std::time::Instant;

/// Total cache footprint (MiB) cycled through by the decode benchmark: well above L3
/// by default; `ATT_COLD_MB=0` measures an L2/L3-hot cache instead.
fn cold_bytes() -> usize {
    std::env::var("ATT_COLD_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(160usize)
        << 20
}
const BS: usize = 16;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn fill(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 31 % 97) as f32 - 48.0) * 1e-2)
        .collect()
}

/// `ATT_ONLY=substring` restricts the run to matching lines.
fn selected(line: &str) -> bool {
    std::env::var("ATT_ONLY").map_or(true, |f| line.contains(&f))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// CPU time of the calling thread in seconds (Linux), if available.
fn thread_cpu() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? * 1e-9)
}

/// Seconds per call (median of `reps` timed batches of at least `min_s` each).
/// With `ATT_CPU=1`, the calling thread's CPU time instead of wall time: on a shared
/// machine this removes time the thread was descheduled (meaningful for 1 thread).
fn time(reps: usize, min_s: f64, mut f: impl FnMut()) -> f64 {
    let cpu = std::env::var("ATT_CPU").is_ok_and(|v| v == "1") && thread_cpu().is_some();
    let now = || {
        if cpu {
            thread_cpu().unwrap_or(0.0)
        } else {
            START.with(|s| s.elapsed().as_secs_f64())
        }
    };
    f();
    let mut samples = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let c0 = now();
        let mut n = 0u32;
        while t.elapsed().as_secs_f64() < min_s || n < 2 {
            f();
            n += 1;
        }
        samples.push((now() - c0) / n as f64);
    }
    median(samples)
}

thread_local! {
    static START: Instant = Instant::now();
}

#[allow(clippy::too_many_arguments)]
fn decode(
    pools: &[ThreadPool],
    reps: usize,
    n_seqs: usize,
    kv_len: usize,
    nq: usize,
    nkv: usize,
    hd: usize,
) {
    let mut line = format!(
        "decode seqs={n_seqs:<2} ctx={:>3}k heads={nq}:{nkv} hd={hd:<3}",
        kv_len / 1024
    );
    if !selected(&line) {
        return;
    }
    let row = nkv * hd;
    let blocks_per_seq = kv_len.div_ceil(BS);
    let layer_bytes = 2 * n_seqs * blocks_per_seq * BS * row * 4;
    let n_layers = cold_bytes().div_ceil(layer_bytes).max(1);
    let n_blocks = n_layers * n_seqs * blocks_per_seq;
    let kc = fill(n_blocks * BS * row, 0);
    let vc = fill(n_blocks * BS * row, 5);
    // Blocks in order, as the block manager hands out a fresh sequence's blocks;
    // ATT_SHUFFLE=1 scatters them (a fragmented cache: every block its own page).
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    if std::env::var("ATT_SHUFFLE").is_ok_and(|v| v == "1") {
        let mut g = Lcg(42);
        for i in (1..ids.len()).rev() {
            ids.swap(i, g.next() as usize % (i + 1));
        }
    }
    // tables[layer][seq]
    let tables: Vec<Vec<&[u32]>> = (0..n_layers)
        .map(|l| {
            (0..n_seqs)
                .map(|s| {
                    let o = (l * n_seqs + s) * blocks_per_seq;
                    &ids[o..o + blocks_per_seq]
                })
                .collect()
        })
        .collect();
    let q = fill(n_seqs * nq * hd, 3);
    let seqs: Vec<u32> = (0..n_seqs as u32).collect();
    let lens = vec![kv_len as u32; n_seqs];
    let mut out = vec![0.0; n_seqs * nq * hd];
    let mut lse = vec![0.0; n_seqs * nq];
    let bytes = (2 * n_seqs * kv_len * row * 4) as f64;
    for pool in pools {
        let mut layer = 0;
        let secs = time(reps, 0.08, || {
            let b = AttentionBatch {
                q: &q,
                params: PagedAttentionParams {
                    n_q_heads: nq,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    batch: PagedBatch {
                        block_size: BS,
                        token_seq: &seqs,
                        token_kv_len: &lens,
                        block_tables: &tables[layer],
                    },
                },
            };
            paged_attention(pool, &b, &kc, &vc, &mut out, &mut lse).expect("attention");
            layer = (layer + 1) % n_layers;
        });
        line += &format!(
            " | t{}: {:8.1} us {:6.1} GB/s",
            pool.n_threads(),
            secs * 1e6,
            bytes / secs / 1e9
        );
    }
    println!("{line}");
}

/// `n_new` query tokens at positions `ctx - n_new .. ctx` of one sequence (causal).
fn prefill(pools: &[ThreadPool], reps: usize, ctx: usize, n_new: usize, nq: usize, hd: usize) {
    let nkv = 1;
    let mut line = format!(
        "prefill ctx={:>3}k new={n_new:<5} heads={nq}:{nkv} hd={hd:<3}",
        ctx / 1024
    );
    if !selected(&line) {
        return;
    }
    let row = nkv * hd;
    let nb = ctx.div_ceil(BS);
    let kc = fill(nb * BS * row, 0);
    let vc = fill(nb * BS * row, 5);
    let table: Vec<u32> = (0..nb as u32).collect();
    let tables: [&[u32]; 1] = [&table];
    let q = fill(n_new * nq * hd, 3);
    let seqs = vec![0u32; n_new];
    let lens: Vec<u32> = (0..n_new).map(|i| (ctx - n_new + i + 1) as u32).collect();
    let mut out = vec![0.0; n_new * nq * hd];
    let mut lse = vec![0.0; n_new * nq];
    let b = AttentionBatch {
        q: &q,
        params: PagedAttentionParams {
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            batch: PagedBatch {
                block_size: BS,
                token_seq: &seqs,
                token_kv_len: &lens,
                block_tables: &tables,
            },
        },
    };
    // q·k and p·v multiply-adds, 2 flops each.
    let pairs: f64 = lens.iter().map(|&l| l as f64).sum();
    let flops = pairs * nq as f64 * hd as f64 * 4.0;
    for pool in pools {
        let secs = time(reps, 0.2, || {
            paged_attention(pool, &b, &kc, &vc, &mut out, &mut lse).expect("attention");
        });
        line += &format!(
            " | t{}: {:8.0} tok/s {:5.1} GFLOP/s",
            pool.n_threads(),
            n_new as f64 / secs,
            flops / secs / 1e9
        );
    }
    println!("{line}");
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let reps = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    // ATT_THREADS=1 runs only the 1-thread pool (e.g. under `perf stat`).
    let pools: Vec<ThreadPool> = match std::env::var("ATT_THREADS").as_deref() {
        Ok("1") => vec![ThreadPool::new(1)],
        Ok("2") => vec![ThreadPool::new(2)],
        _ => vec![ThreadPool::new(1), ThreadPool::new(2)],
    };
    if what == "all" || what == "decode" {
        for &hd in &[64usize, 128] {
            for &(nq, nkv) in &[(4usize, 1usize), (4, 4)] {
                for &ctx in &[1024usize, 4096, 16384] {
                    decode(&pools, reps, 1, ctx, nq, nkv, hd);
                }
            }
        }
        // DCP: 2 ranks' query heads on this rank's KV shard; a decode batch.
        decode(&pools, reps, 1, 8192, 8, 1, 64);
        decode(&pools, reps, 32, 1024, 4, 1, 64);
    }
    if what == "all" || what == "prefill" {
        for &hd in &[64usize, 128] {
            prefill(&pools, reps, 16384, 256, 4, hd);
        }
        prefill(&pools, reps, 2048, 2048, 4, 64);
    }
}
