//! `dcpserve bench-dcp`: decode context parallelism in miniature on CPU ranks.
//!
//! On a random long-context MQA model (one KV head, so every TP rank holds a replica of
//! it without DCP), it measures
//! - the decode step time of one long sequence at tp=N, dcp=1 vs tp=N, dcp=N;
//! - the KV capacity and the most sequences running at once, with the same KV memory
//!   per rank, for both layouts;
//! - overlapped micro-batches, and the two ways of exchanging DCP partials (sections
//!   `overlap` and `merge`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;

use dcpserve_kernels::dcp::{kv_bytes_per_token, DcpAttention, DcpShape};
use dcpserve_kernels::{
    Communicator, CpuBackend, HostCollectives, InProcessComm, KernelError, KvCacheDType, LinkModel,
    ModeledLink,
};

use dcpserve::{
    DistributedBackend, Engine, EngineConfig, GenerationEvent, ModeledLinkConfig, Prompt,
};
use dcpserve_config::MergeExchange;
use dcpserve_tools::synthetic::{write_synthetic_llama, SyntheticSpec};

use super::synthetic_engine::{engine_config, params, prompt};

/// Settings of one `bench-dcp` run.
pub struct DcpBenchSpec {
    pub tp: usize,
    /// Query heads of the synthetic MQA model (one KV head): 8 is a GQA ratio of 8:1 as
    /// in large models; fewer make attention memory-bound on CPU cores.
    pub query_heads: usize,
    pub context: usize,
    pub decode_tokens: usize,
    pub capacity_context: usize,
    pub capacity_sequences: usize,
    pub overlap_batch: usize,
    pub overlap_context: usize,
    pub threads: usize,
    /// The modeled link of the second overlap measurement.
    pub link: ModeledLinkConfig,
    /// Which measurements to run.
    pub sections: Vec<DcpBenchSection>,
    /// How the KV cache stores values (`--kv-cache-dtype`; the synthetic model computes
    /// in float32, so `auto` is float32).
    pub kv_cache_dtype: KvCacheDType,
    /// Where the ranks run (section `ranks`).
    pub executor: DistributedBackend,
    /// Prompt length of the `prefill` section.
    pub prefill_context: usize,
    /// Prefills measured per layout in the `prefill` section (the median is reported).
    pub prefill_runs: usize,
}

/// The measurements of `bench-dcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DcpBenchSection {
    /// Decode step time of one long sequence, dcp=1 vs dcp=tp.
    Step,
    /// KV capacity and sequences running at once with the same memory.
    Capacity,
    /// Decode step time with and without two overlapped micro-batches.
    Overlap,
    /// Decode step time with the DCP partials merged after one all-to-all vs after an
    /// LSE all-gather and a reduce-scatter.
    Merge,
    /// Decode step time at tp=dcp=N with the ranks where `--distributed-executor-backend`
    /// puts them (threads, or MPI processes): one long sequence, and a batch one step at
    /// a time and in two micro-batches. Not in the default set (scripts/bench-mpi.sh runs
    /// it in process, over MPI shared memory and over MPI TCP).
    Ranks,
    /// Prefill time of one long prompt at pcp=1, 2 and 4 (prefill context parallelism,
    /// tp=1, one thread per rank), its parallel efficiency and where the rest goes. Not in
    /// the default set (a 16k-token prefill takes seconds per run).
    Prefill,
}

fn model_spec(context: usize, query_heads: usize) -> SyntheticSpec {
    SyntheticSpec {
        hidden: 256,
        layers: 4,
        heads: query_heads,
        kv_heads: 1,
        head_dim: 64,
        intermediate: 512,
        max_position_embeddings: (context + 1024).next_power_of_two(),
        seed: 7,
    }
}

/// Median decode step (ms) of one sequence with `context` tokens of history.
async fn step_ms(engine: &Engine, context: usize, n: usize) -> Result<f64> {
    let mut s = engine.generate_ids(prompt(context, 1), params(n + 1))?;
    let mut last: Option<Instant> = None;
    let mut steps = Vec::new();
    while let Some(ev) = s.next().await {
        match ev? {
            GenerationEvent::Token { .. } => {
                let now = Instant::now();
                if let Some(prev) = last {
                    steps.push((now - prev).as_secs_f64() * 1e3);
                }
                last = Some(now);
            }
            GenerationEvent::Finished { .. } => break,
        }
    }
    if steps.is_empty() {
        bail!("no decode steps measured");
    }
    steps.sort_by(f64::total_cmp);
    Ok(steps[steps.len() / 2])
}

/// Median (of 3 runs) decode step in ms of `overlap_batch` sequences of
/// `overlap_context` tokens decoding 64 tokens together.
async fn batch_step_ms(engine: &Engine, spec: &DcpBenchSpec) -> Result<f64> {
    let mut runs = Vec::new();
    for r in 0..3 {
        runs.push(batch_step_once_ms(engine, spec, r).await?);
    }
    runs.sort_by(f64::total_cmp);
    Ok(runs[1])
}

/// Decode step in ms of run `run` of [`batch_step_ms`]'s batch.
async fn batch_step_once_ms(engine: &Engine, spec: &DcpBenchSpec, run: usize) -> Result<f64> {
    let tok_s =
        super::engine_bench::decode_once(engine, spec.overlap_batch, spec.overlap_context, 64, run)
            .await?;
    Ok(spec.overlap_batch as f64 / tok_s * 1e3)
}

/// Most sequences running at once when `count` sequences of `context` tokens arrive together.
async fn max_running(engine: &Engine, context: usize, count: usize) -> Result<usize> {
    let streams: Vec<_> = (0..count)
        .map(|i| engine.generate(Prompt::Tokens(prompt(context, 10 + i)), params(16)))
        .collect::<Result<_, dcpserve::Error>>()?;
    let drain = tokio::spawn(async move {
        for mut s in streams {
            while let Some(ev) = s.next().await {
                if matches!(ev?, GenerationEvent::Finished { .. }) {
                    break;
                }
            }
        }
        anyhow::Ok(())
    });
    let mut best = 0;
    while !drain.is_finished() {
        best = best.max(engine.stats().await?.running);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drain.await??;
    Ok(best)
}

/// Runs the benchmark and returns a printable report.
pub async fn run(spec: &DcpBenchSpec) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("dcpserve-bench-dcp-{}", std::process::id()));
    let longest = spec
        .context
        .max(spec.capacity_context)
        .max(spec.prefill_context);
    let mspec = model_spec(longest, spec.query_heads);
    write_synthetic_llama(&dir, &mspec)?;
    // One KV head per rank, K and V.
    let per_token = kv_bytes_per_token(mspec.layers, 2, mspec.head_dim, spec.kv_cache_dtype);
    let mut report = String::new();
    let tp = spec.tp;

    if spec.sections.contains(&DcpBenchSection::Step) {
        // 1. Decode step time of one long sequence.
        let room = ((spec.context + spec.decode_tokens + 64) * per_token) as u64;
        let mut times = Vec::new();
        for dcp in [1, tp] {
            let engine = Engine::builder(&dir)
                .config(engine_config(
                    tp,
                    dcp,
                    room,
                    spec.threads,
                    spec.kv_cache_dtype,
                ))
                .build()
                .await?;
            step_ms(&engine, 256, 4).await?; // warm-up
            times.push(step_ms(&engine, spec.context, spec.decode_tokens).await?);
        }
        report.push_str(&format!(
        "decode step, one {}-token sequence, {} KV cache: tp={tp} dcp=1 {:.2} ms, tp={tp} dcp={tp} {:.2} ms, ratio {:.2}\n",
        spec.context,
        spec.kv_cache_dtype,
        times[0],
        times[1],
        times[1] / times[0]
    ));
    }
    if spec.sections.contains(&DcpBenchSection::Capacity) {
        // 2. Capacity with the same KV memory per rank.
        let budget = (4 * (spec.capacity_context + 32) * per_token) as u64;
        for dcp in [1, tp] {
            let engine = Engine::builder(&dir)
                .config(engine_config(
                    tp,
                    dcp,
                    budget,
                    spec.threads,
                    spec.kv_cache_dtype,
                ))
                .build()
                .await?;
            let (per_rank, total) = engine.kv_capacity();
            let running =
                max_running(&engine, spec.capacity_context, spec.capacity_sequences).await?;
            report.push_str(&format!(
            "capacity, {budget} KV bytes per rank: tp={tp} dcp={dcp}: {per_rank} tokens per rank, {total} in total; at most {running} of {} sequences of {} tokens running at once\n",
            spec.capacity_sequences, spec.capacity_context
        ));
        }
    }
    if spec.sections.contains(&DcpBenchSection::Overlap) {
        report.push_str(&overlap_report(&dir, spec, per_token).await?);
    }
    if spec.sections.contains(&DcpBenchSection::Merge) {
        report.push_str(&merge_report(&dir, spec, per_token).await?);
    }
    if spec.sections.contains(&DcpBenchSection::Ranks) {
        report.push_str(&ranks_report(&dir, spec, per_token).await?);
    }
    if spec.sections.contains(&DcpBenchSection::Prefill) {
        let (n, runs, kv) = (spec.prefill_context, spec.prefill_runs, spec.kv_cache_dtype);
        report
            .push_str(&super::prefill_bench::prefill_report(&dir, (n, runs), kv, per_token).await?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// Decode of a batch at tp=N, dcp=N, one step at a time vs two micro-batches in
/// ping-pong, over shared memory and over a modeled link.
async fn overlap_report(
    dir: &std::path::Path,
    spec: &DcpBenchSpec,
    per_token: usize,
) -> Result<String> {
    let tp = spec.tp;
    let batch_budget = (spec.overlap_batch * (spec.overlap_context + 96) * per_token) as u64;
    let link = spec.link;
    let mut out = format!(
        "decode step, {} sequences of {} tokens at tp={tp} dcp={tp} (median of 3 runs):\n{:<34}{:>20}{:>20}{:>8}\n",
        spec.overlap_batch, spec.overlap_context, "collectives", "one step at a time", "two micro-batches", "ratio"
    );
    let links = [
        ("shared memory".to_string(), None),
        (
            format!(
                "modeled link {} us + {} GB/s",
                link.latency_us, link.gigabytes_per_second
            ),
            Some(link),
        ),
    ];
    for (name, modeled) in links {
        let mut step = Vec::new();
        for overlap in [false, true] {
            let mut cfg = engine_config(tp, tp, batch_budget, spec.threads, spec.kv_cache_dtype);
            cfg.overlap_micro_batches = overlap;
            cfg.modeled_link = modeled;
            let engine = Engine::builder(dir).config(cfg).build().await?;
            step.push(batch_step_ms(&engine, spec).await?);
        }
        out.push_str(&format!(
            "{name:<34}{:>20}{:>20}{:>8.2}\n",
            format!("{:.2} ms", step[0]),
            format!("{:.2} ms", step[1]),
            step[1] / step[0]
        ));
    }
    Ok(out)
}

/// Decode step times at tp=dcp=N with the ranks where the executor puts them, as one
/// line `ranks (EXECUTOR): ...` (scripts/bench-mpi.sh tabulates the lines of its runs).
async fn ranks_report(
    dir: &std::path::Path,
    spec: &DcpBenchSpec,
    per_token: usize,
) -> Result<String> {
    let tp = spec.tp;
    let with_executor = |mut cfg: EngineConfig| {
        cfg.distributed_executor_backend = spec.executor;
        cfg
    };
    let room = ((spec.context + spec.decode_tokens + 64) * per_token) as u64;
    let engine = Engine::builder(dir)
        .config(with_executor(engine_config(
            tp,
            tp,
            room,
            spec.threads,
            spec.kv_cache_dtype,
        )))
        .build()
        .await?;
    step_ms(&engine, 256, 4).await?; // warm-up
    let one = step_ms(&engine, spec.context, spec.decode_tokens).await?;
    drop(engine);
    let batch_budget = (spec.overlap_batch * (spec.overlap_context + 96) * per_token) as u64;
    let mut batch = Vec::new();
    for overlap in [false, true] {
        let mut cfg = engine_config(tp, tp, batch_budget, spec.threads, spec.kv_cache_dtype);
        cfg.overlap_micro_batches = overlap;
        let engine = Engine::builder(dir)
            .config(with_executor(cfg))
            .build()
            .await?;
        batch.push(batch_step_ms(&engine, spec).await?);
    }
    Ok(format!(
        "ranks ({:?}): tp={tp} dcp={tp}: one {}-token sequence {one:.2} ms; {} sequences of {} tokens: one step at a time {:.2} ms, two micro-batches {:.2} ms\n",
        spec.executor, spec.context, spec.overlap_batch, spec.overlap_context, batch[0], batch[1]
    ))
}

/// Decode of a batch at tp=N, dcp=N with the two ways of exchanging the DCP partials,
/// over shared memory and over a modeled link. The two engines run alternately (3 runs
/// each) so drifting load affects both alike.
async fn merge_report(
    dir: &std::path::Path,
    spec: &DcpBenchSpec,
    per_token: usize,
) -> Result<String> {
    let tp = spec.tp;
    let batch_budget = (spec.overlap_batch * (spec.overlap_context + 96) * per_token) as u64;
    let link = spec.link;
    let exchanges = [
        MergeExchange::AllGatherReduceScatter,
        MergeExchange::AllToAll,
    ];
    let mut out = format!(
        "decode step, {} sequences of {} tokens at tp={tp} dcp={tp} (median of 3 runs):\n{:<34}{:>28}{:>20}{:>8}\n",
        spec.overlap_batch,
        spec.overlap_context,
        "collectives",
        "LSE all-gather + red.-scatter",
        "one all-to-all",
        "ratio"
    );
    let links = [
        ("shared memory".to_string(), None),
        (
            format!(
                "modeled link {} us + {} GB/s",
                link.latency_us, link.gigabytes_per_second
            ),
            Some(link),
        ),
    ];
    for (name, modeled) in links {
        let mut engines = Vec::new();
        for exchange in exchanges {
            let mut cfg = engine_config(tp, tp, batch_budget, spec.threads, spec.kv_cache_dtype);
            cfg.modeled_link = modeled;
            cfg.dcp_merge_exchange = exchange;
            engines.push(Engine::builder(dir).config(cfg).build().await?);
        }
        let mut runs = vec![Vec::new(); engines.len()];
        for r in 0..3 {
            for (engine, times) in engines.iter().zip(&mut runs) {
                times.push(batch_step_once_ms(engine, spec, r).await?);
            }
        }
        let step: Vec<f64> = runs
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                t[t.len() / 2]
            })
            .collect();
        out.push_str(&format!(
            "{name:<34}{:>28}{:>20}{:>8.2}\n",
            format!("{:.2} ms", step[0]),
            format!("{:.2} ms", step[1]),
            step[1] / step[0]
        ));
    }
    out.push_str(&exchange_report(spec));
    Ok(out)
}

/// The exchange alone, without the model around it: per layer, the query all-gather and
/// the merge of `tp` rank threads whose attention is a no-op (medians of 3 runs of 2000
/// layers, the two exchanges alternating).
fn exchange_report(spec: &DcpBenchSpec) -> String {
    let tp = spec.tp;
    let heads = (spec.query_heads / tp).max(1);
    let shape = DcpShape {
        tokens: spec.overlap_batch,
        heads,
        q_dim: 64,
        v_dim: 64,
        token_parts: 1,
    };
    let link = LinkModel {
        latency: Duration::from_secs_f64(spec.link.latency_us * 1e-6),
        bytes_per_second: spec.link.gigabytes_per_second * 1e9,
    };
    let mut out = format!(
        "the exchange alone, per layer ({} tokens, {heads} heads of 64 per rank, tp=dcp={tp}):\n",
        shape.tokens
    );
    for (name, modeled) in [("shared memory", None), ("modeled link", Some(link))] {
        let iters = if modeled.is_some() { 200 } else { 2000 };
        let mut runs = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, exchange) in [
                MergeExchange::AllGatherReduceScatter,
                MergeExchange::AllToAll,
            ]
            .into_iter()
            .enumerate()
            {
                runs[i].push(exchange_us(tp, exchange, modeled, shape, iters));
            }
        }
        let med: Vec<f64> = runs
            .iter_mut()
            .map(|t| {
                t.sort_by(f64::total_cmp);
                t[1]
            })
            .collect();
        out.push_str(&format!(
            "{name:<34}{:>28}{:>20}{:>8.2}\n",
            format!("{:.1} us", med[0]),
            format!("{:.1} us", med[1]),
            med[1] / med[0]
        ));
    }
    out
}

/// Microseconds per layer of the DCP step with a no-op attention on `tp` rank threads.
fn exchange_us(
    tp: usize,
    exchange: MergeExchange,
    link: Option<LinkModel>,
    shape: DcpShape,
    iters: usize,
) -> f64 {
    let comms: Vec<HostCollectives> = InProcessComm::group(tp)
        .into_iter()
        .map(|c| {
            let c: Arc<dyn Communicator> = Arc::new(c);
            HostCollectives::new(match link {
                Some(l) => Arc::new(ModeledLink::new(c, l)) as Arc<dyn Communicator>,
                None => c,
            })
        })
        .collect();
    let dev = CpuBackend::new(1);
    let q = vec![0.5f32; shape.tokens * shape.heads * shape.q_dim];
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in &comms {
            let (q, dev) = (&q, &dev);
            s.spawn(move || {
                let mut step = DcpAttention::new(exchange);
                let mut out = vec![0.0f32; shape.tokens * shape.heads * shape.v_dim];
                for i in 0..iters {
                    step.run(dev, c, q, shape, &mut out, |_, _, o, l| {
                        o.fill(1.0);
                        l.fill((i % 3) as f32);
                        Ok::<(), KernelError>(())
                    })
                    .expect("in-process DCP step");
                }
            });
        }
    });
    start.elapsed().as_secs_f64() * 1e6 / iters as f64
}
