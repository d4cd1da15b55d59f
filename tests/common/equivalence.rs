//! Running prompts through engines of different layouts and comparing the outputs.

use dcpserve::{Engine, EngineConfig, ParallelConfig, Prompt, TokenOutput};

use super::{f32_config, greedy};

/// Log-probabilities of two layouts may differ by this much (summation order only).
pub const TOL: f32 = 1e-4;

pub type Run = Vec<Vec<TokenOutput>>;

pub fn layout(tp: usize, dcp: usize, interleave: usize) -> ParallelConfig {
    pcp_layout(tp, 1, dcp, interleave)
}

/// `tp` × `pcp` ranks (prefill context parallelism), DCP groups of `dcp`, interleave.
pub fn pcp_layout(tp: usize, pcp: usize, dcp: usize, interleave: usize) -> ParallelConfig {
    ParallelConfig {
        tensor_parallel_size: tp,
        decode_context_parallel_size: dcp,
        prefill_context_parallel_size: pcp,
        cp_kv_cache_interleave_size: interleave,
    }
}

pub fn cfg(p: ParallelConfig, batched_tokens: usize, kv_bytes: u64) -> EngineConfig {
    EngineConfig {
        parallel: p,
        max_num_batched_tokens: batched_tokens,
        kv_cache_memory_bytes: Some(kv_bytes),
        ..f32_config()
    }
}

/// Prompts of 1 to `long` tokens (ids avoid the special tokens 0..3).
pub fn prompts(vocab: u32, long: usize) -> Vec<Vec<u32>> {
    [1usize, 7, 40, long]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((j * 131 + i * 71) as u32 % (vocab - 3)) + 3)
                .collect()
        })
        .collect()
}

/// Six prompts of 90 to 95 tokens that fit in a small KV cache together but whose
/// growth does not, so running sequences are preempted and recomputed.
pub fn preemption_prompts() -> Vec<Vec<u32>> {
    (0..6)
        .map(|i| {
            (0..90 + i)
                .map(|j| ((j * 29 + i * 7) % 380) as u32 + 3)
                .collect()
        })
        .collect()
}

/// Sampled (temperature `temperature`, seeded per prompt) completions of `n` tokens with
/// `ignore_eos`: each has exactly `n` tokens, all inside the 384-token vocabulary.
pub async fn assert_sampled_completions(
    engine: &Engine,
    prompts: &[Vec<u32>],
    temperature: f32,
    n: usize,
) {
    for (i, p) in prompts.iter().enumerate() {
        let mut params = greedy(n);
        params.temperature = temperature;
        params.seed = Some(i as u64);
        let out = engine
            .complete(Prompt::Tokens(p.clone()), params)
            .await
            .expect("completion");
        assert_eq!(
            out.token_ids.len(),
            n,
            "prompt {i}: ignore_eos keeps the length"
        );
        assert!(out.token_ids.iter().all(|&t| t < 384));
    }
}

pub async fn generate_all(engine: &Engine, prompts: &[Vec<u32>], n: usize) -> Run {
    use futures::StreamExt;
    // Submit everything first so the sequences are batched together.
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut params = greedy(n);
            params.logprobs = Some(5);
            engine.generate(Prompt::Tokens(p.clone()), params)
        })
        .collect();
    let mut out = Vec::new();
    for s in streams {
        let mut s = s.expect("generate");
        let mut toks = Vec::new();
        while let Some(ev) = s.next().await {
            match ev.expect("event") {
                dcpserve::GenerationEvent::Token { token, .. } => toks.push(token),
                dcpserve::GenerationEvent::Finished { .. } => break,
            }
        }
        out.push(toks);
    }
    out
}

pub async fn run_stats(
    model: &std::path::Path,
    cfg: EngineConfig,
    prompts: &[Vec<u32>],
    n: usize,
) -> (Run, dcpserve_actors::SchedulerStats) {
    let engine = Engine::builder(model)
        .config(cfg)
        .build()
        .await
        .expect("engine");
    let out = generate_all(&engine, prompts, n).await;
    (out, engine.stats().await.expect("stats"))
}

pub async fn run(
    model: &std::path::Path,
    cfg: EngineConfig,
    prompts: &[Vec<u32>],
    n: usize,
) -> Run {
    run_stats(model, cfg, prompts, n).await.0
}

pub fn assert_same(base: &Run, got: &Run, what: &str) {
    assert_same_within(base, got, what, TOL);
}

/// [`assert_same`] with log-probabilities within `tol`.
pub fn assert_same_within(base: &Run, got: &Run, what: &str, tol: f32) {
    assert_eq!(
        base.len(),
        got.len(),
        "{what}: number of prompts with output differs"
    );
    for (p, (a, b)) in base.iter().zip(got).enumerate() {
        assert_eq!(
            a.len(),
            b.len(),
            "{what}: prompt {p} produced a different number of tokens"
        );
        assert!(!a.is_empty(), "{what}: prompt {p} produced no tokens");
        let ids_a: Vec<u32> = a.iter().map(|t| t.token_id).collect();
        let ids_b: Vec<u32> = b.iter().map(|t| t.token_id).collect();
        assert_eq!(ids_a, ids_b, "{what}: prompt {p} greedy tokens differ");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let d = (x.logprob.unwrap() - y.logprob.unwrap()).abs();
            assert!(d <= tol, "{what}: prompt {p} token {i}: |Δ logprob| = {d}");
            assert_eq!(
                x.top_logprobs.len(),
                y.top_logprobs.len(),
                "{what}: prompt {p} token {i}: number of top logprobs differs"
            );
            for ((tx, lx), (ty, ly)) in x.top_logprobs.iter().zip(&y.top_logprobs) {
                if tx == ty {
                    assert!(
                        (lx - ly).abs() <= tol,
                        "{what}: prompt {p} token {i} top {tx}"
                    );
                }
            }
        }
    }
}
