//! `bench-dcp --section prefill`: prefill context parallelism on CPU ranks. The prefill
//! time of one long prompt at pcp=1, 2 and 4 (tp=1, one compute thread per rank, so each
//! copy has a core of its own as long as the machine has them), its parallel efficiency
//! (speedup / pcp), and where the rest goes: the share of the step the ranks spend in
//! collectives (the query all-gather and the partial exchange, and waiting there for a
//! slower rank) and the imbalance of the token split.

use std::time::Instant;

use anyhow::{bail, Result};
use futures::StreamExt;

use dcpserve::{Engine, GenerationEvent};
use dcpserve_kernels::dcp::PrefillSplit;

use dcpserve_kernels::KvCacheDType;

use super::synthetic_engine::{engine_config, params, prompt};

/// Time to the first token (s) of one `n`-token prompt (`salt` picks its tokens): the
/// prefill, chunk after chunk, and one sampling.
async fn ttft_s(engine: &Engine, n: usize, salt: usize) -> Result<f64> {
    let start = Instant::now();
    let mut s = engine.generate_ids(prompt(n, salt), params(1))?;
    while let Some(ev) = s.next().await {
        if let GenerationEvent::Token { .. } = ev? {
            return Ok(start.elapsed().as_secs_f64());
        }
    }
    bail!("the prompt finished without a token")
}

/// One layout's figures.
struct PrefillRun {
    pcp: usize,
    seconds: f64,
    /// Mean over ranks of the seconds spent in collectives, per prefill.
    collective_s: f64,
}

/// The report of the `prefill` section: prompts of `n` tokens, `runs` per layout, on the
/// synthetic model in `dir` whose tokens take `per_token` KV bytes per rank.
pub(super) async fn prefill_report(
    dir: &std::path::Path,
    (n, runs): (usize, usize),
    kv: KvCacheDType,
    per_token: usize,
) -> Result<String> {
    let runs = runs.max(1);
    let mut results = Vec::new();
    for pcp in [1, 2, 4] {
        let room = ((n + 256) * per_token) as u64;
        let mut cfg = engine_config(1, 1, room, pcp, kv);
        cfg.parallel.prefill_context_parallel_size = pcp;
        // One compute thread per rank.
        cfg.num_threads = Some(pcp);
        let engine = Engine::builder(dir).config(cfg).build().await?;
        ttft_s(&engine, 512, 0).await?; // warm-up
        let before = engine.seconds_in_collectives().await?;
        let mut times = Vec::new();
        for r in 0..runs {
            times.push(ttft_s(&engine, n, 100 + r).await?);
        }
        let after = engine.seconds_in_collectives().await?;
        let spent: f64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
        times.sort_by(f64::total_cmp);
        results.push(PrefillRun {
            pcp,
            seconds: times[times.len() / 2],
            collective_s: spent / after.len().max(1) as f64 / runs as f64,
        });
    }
    let base = results[0].seconds;
    let mut out = format!(
        "prefill of one {n}-token prompt, tp=1, one thread per rank (median of {runs}; chunks of {} tokens):\n{:<6}{:>12}{:>10}{:>12}{:>16}{:>14}\n",
        engine_config(1, 1, 0, 1, kv).max_num_batched_tokens,
        "pcp", "prefill", "speedup", "efficiency", "in collectives", "token split"
    );
    for r in &results {
        let speedup = base / r.seconds;
        let split = PrefillSplit {
            pcp: r.pcp,
            pcp_rank: 0,
            dcp: 1,
            interleave: 1,
        };
        let positions: Vec<usize> = (0..n).collect();
        let parts = split.assign(&positions);
        let most = parts.iter().map(Vec::len).max().unwrap_or(0);
        let imbalance = most as f64 * r.pcp as f64 / n as f64;
        out.push_str(&format!(
            "{:<6}{:>10.2} s{:>10.2}{:>12.2}{:>15.0}%{:>13.3}x\n",
            r.pcp,
            r.seconds,
            speedup,
            speedup / r.pcp as f64,
            100.0 * r.collective_s / r.seconds,
            imbalance,
        ));
    }
    out.push_str(&format!(
        "(this machine has {} cores: pcp above that shares them)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    Ok(out)
}
