//! Decode attention throughput (SmolLM2-135M heads: 9 query, 3 KV, dim 64).
//!
//! `cargo run -p dcpserve-kernels --release --example attention_bench [threads]`

use dcpserve_kernels::{paged_attention, AttentionBatch, ThreadPool};
use std::time::{Duration, Instant};

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let (nq, nkv, hd, bs) = (9usize, 3usize, 64usize, 16usize);
    for &(n_seqs, kv_len) in &[
        (1usize, 512usize),
        (1, 8192),
        (1, 32768),
        (32, 1024),
        (64, 512),
    ] {
        let blocks_per = kv_len.div_ceil(bs);
        let n_blocks = blocks_per * n_seqs;
        let kc: Vec<f32> = (0..n_blocks * bs * nkv * hd)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) * 1e-2)
            .collect();
        let vc = kc.clone();
        let tables: Vec<Vec<u32>> = (0..n_seqs)
            .map(|s| ((s * blocks_per) as u32..((s + 1) * blocks_per) as u32).collect())
            .collect();
        let tref: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let q: Vec<f32> = (0..n_seqs * nq * hd)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let seqs: Vec<u32> = (0..n_seqs as u32).collect();
        let lens = vec![kv_len as u32; n_seqs];
        let b = AttentionBatch {
            q: &q,
            n_q_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            scale: 0.125,
            token_seq: &seqs,
            token_kv_len: &lens,
            block_tables: &tref,
        };
        let mut out = vec![0.0; n_seqs * nq * hd];
        let mut lse = vec![0.0; n_seqs * nq];
        paged_attention(&pool, &b, &kc, &vc, &mut out, &mut lse).expect("attention");
        let start = Instant::now();
        let mut iters = 0u32;
        while start.elapsed() < Duration::from_millis(200) || iters < 3 {
            paged_attention(&pool, &b, &kc, &vc, &mut out, &mut lse).expect("attention");
            iters += 1;
        }
        let secs = start.elapsed().as_secs_f64() / iters as f64;
        let bytes = (2 * n_seqs * kv_len * nkv * hd * 4) as f64;
        println!(
            "seqs={n_seqs:>3} kv_len={kv_len:>6}: {:9.1} us/layer  {:6.1} GB/s of KV",
            secs * 1e6,
            bytes / secs / 1e9
        );
    }
}
