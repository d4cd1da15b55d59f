//! Latency of in-process collectives between rank threads.
//! `cargo run -p dcpserve-kernels --release --example comm_bench [ranks] [floats]`
use std::time::Instant;

use dcpserve_kernels::{Communicator, InProcessComm};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ranks = args.first().copied().unwrap_or(2);
    let n = args.get(1).copied().unwrap_or(256);
    let iters = 2000;
    let comms = InProcessComm::group(ranks);
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut x = vec![1.0f32; n];
                for _ in 0..iters {
                    c.all_reduce_sum(&mut x).unwrap();
                    x.fill(1.0);
                }
            });
        }
    });
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{ranks} ranks, all_reduce of {n} floats: {us:.1} µs per call");
}
