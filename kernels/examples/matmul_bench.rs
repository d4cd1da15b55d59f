//! Matmul throughput on SmolLM2-135M shapes, plus TinyLlama-1.1B ones when a format
//! with 256-element super-blocks (the K-quants) is asked for: SmolLM2's K = 576 is not
//! a multiple of 256. A shape a format cannot hold is skipped.
//!
//! `cargo run -p dcpserve-kernels --release --example matmul_bench [threads] [formats] [ms]`
//! e.g. `... matmul_bench 2 f32,bf16,q4_1` or `... matmul_bench 2 q4_k,q6_k 1`
//! (`ms`: the m values, default `1,32,512`); set `FAST=1` for `Precision::Fast`,
//! `INT8=1` for the int8-activation kernels on quantized formats (ISA from
//! `DCPSERVE_INT8_ISA`, else the best available), `INT16=1` for the int16-activation
//! kernels on the 32-element block formats (AVX2); `CPU=1` reports CPU time per call,
//! `MIN=1` the fastest call.

use dcpserve_kernels::{matmul_with_precision, Precision, ThreadPool, WeightFormat, WeightMatrix};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let formats: Vec<WeightFormat> = args
        .get(2)
        .map(|s| s.as_str())
        .unwrap_or("f32,bf16,f16,q8_0,q4_0,q4_1")
        .split(',')
        .filter_map(|f| match f {
            "f32" => Some(WeightFormat::F32),
            "f16" => Some(WeightFormat::F16),
            "bf16" => Some(WeightFormat::BF16),
            "q8_0" => Some(WeightFormat::Q8_0),
            "q4_0" => Some(WeightFormat::Q4_0),
            "q4_1" => Some(WeightFormat::Q4_1),
            "q5_0" => Some(WeightFormat::Q5_0),
            "q5_1" => Some(WeightFormat::Q5_1),
            "q4_k" => Some(WeightFormat::Q4_K),
            "q5_k" => Some(WeightFormat::Q5_K),
            "q6_k" => Some(WeightFormat::Q6_K),
            _ => None,
        })
        .collect();
    let ms: Vec<usize> = args
        .get(3)
        .map(|s| s.as_str())
        .unwrap_or("1,32,512")
        .split(',')
        .filter_map(|m| m.parse().ok())
        .collect();
    let pool = ThreadPool::new(threads);
    let cpu_time = std::env::var("CPU").is_ok_and(|v| v == "1");
    // MIN=1: the fastest call instead of the mean (what the kernel can do, with the
    // neighbours' interruptions filtered out).
    let min_time = std::env::var("MIN").is_ok_and(|v| v == "1");
    let precision = if std::env::var("FAST").is_ok_and(|v| v == "1") {
        Precision::Fast
    } else {
        Precision::Exact
    };
    let int8 = std::env::var("INT8").is_ok_and(|v| v == "1");
    let isa = dcpserve_kernels::Int8Isa::detect();
    let int16 = std::env::var("INT16").is_ok_and(|v| v == "1");
    let matmul = |x: &[f32], m, w: &WeightMatrix, out: &mut [f32]| match isa {
        Some(isa) if int8 && dcpserve_kernels::cpu::int8_matmul::int8_supported(w.format()) => {
            dcpserve_kernels::matmul_int8(&pool, x, m, w, out, isa)
        }
        _ if int16 && dcpserve_kernels::cpu::int16_matmul::applies(w.format(), m) => {
            dcpserve_kernels::cpu::int16_matmul::matmul(&pool, x, m, w, out)
        }
        _ => matmul_with_precision(&pool, x, m, w, out, precision),
    };
    // (name, N = out features, K = in features)
    let mut shapes = vec![
        ("q/o 576x576", 576, 576),
        ("kv 192x576", 192, 576),
        ("gate/up 1536x576", 1536, 576),
        ("down 576x1536", 576, 1536),
        ("lm_head 49152x576", 49152, 576),
    ];
    if formats.iter().any(|f| f.block_elems() > 32) {
        shapes.extend([
            ("q/o 2048x2048", 2048, 2048),
            ("gate/up 5632x2048", 5632, 2048),
            ("down 2048x5632", 2048, 5632),
            ("lm_head 32000x2048", 32000, 2048),
        ]);
    }
    println!(
        "threads={threads} cpu isa={} precision={precision:?} int8={int8} ({isa:?}) int16={int16}",
        dcpserve_kernels::cpu::isa()
    );
    for &(name, n, k) in &shapes {
        let wf: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3)
            .collect();
        let w32 = WeightMatrix::from_f32(n, k, wf).expect("shape");
        for &f in &formats {
            if k % f.block_elems() != 0 {
                continue;
            }
            let w = w32.to_format(f).expect("convert");
            let mut line = format!("{name:<20} {f:>5?}:");
            for &m in &ms {
                let x: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 31 % 97) as f32 - 48.0) * 1e-2)
                    .collect();
                let mut out = vec![0.0f32; m * n];
                matmul(&x, m, &w, &mut out).expect("matmul");
                let start = Instant::now();
                let cpu0 = cpu_seconds();
                let mut iters = 0u32;
                let mut fastest = f64::INFINITY;
                while start.elapsed() < Duration::from_millis(150) || iters < 3 {
                    let t = Instant::now();
                    matmul(&x, m, &w, &mut out).expect("matmul");
                    fastest = fastest.min(t.elapsed().as_secs_f64());
                    iters += 1;
                }
                // CPU=1: process CPU time instead of wall time (steadier on a shared
                // machine; meaningful with 1 thread, whose pool runs tasks inline).
                let secs = if min_time {
                    fastest
                } else if cpu_time {
                    (cpu_seconds() - cpu0) / iters as f64
                } else {
                    start.elapsed().as_secs_f64() / iters as f64
                };
                let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
                if m == 1 {
                    let gbs = (n * f.bytes_for(k)) as f64 / secs / 1e9;
                    line += &format!(
                        "  m=1 {gflops:6.1} GF/s ({gbs:5.1} GB/s, {:7.1} us)",
                        secs * 1e6
                    );
                } else {
                    line += &format!("  m={m} {gflops:6.1} GF/s");
                }
            }
            println!("{line}");
        }
    }
}

/// CPU time of the whole process so far.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
