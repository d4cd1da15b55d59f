//! Every tensor-parallel / decode-context-parallel layout gives the single-rank
//! engine's outputs: greedy tokens equal and log-probabilities within 1e-4, on CPU
//! ranks in float32, with chunked prefill, long prompts and forced preemption.

mod common;

use common::equivalence::*;
use common::*;
use dcpserve::{Engine, Prompt};

/// Prompts of 1 to `long` tokens (ids avoid the special tokens 0..3).
fn gqa_prompts(vocab: u32, long: usize) -> Vec<Vec<u32>> {
    [1usize, 7, 40, 333, long]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((j * 131 + i * 71) as u32 % (vocab - 3)) + 3)
                .collect()
        })
        .collect()
}

/// Tiny GQA model (8 query heads, 2 KV heads, block size 16): tp ∈ {1, 2, 4, 8} with
/// every allowed dcp (tp=4: dcp 2; tp=8: dcp 2 and 4) and interleave 1, 2 and the
/// block size; a 3,100-token prompt prefilled in chunks of 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_gqa_every_layout_equals_single_rank() {
    let model = fixture("tiny-llama");
    let prompts = gqa_prompts(384, 3100);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 512, big), &prompts, 12).await;
    let layouts = [
        (2, 1, 1),
        (4, 1, 1),
        (4, 2, 1),
        (4, 2, 2),
        (4, 2, 16),
        (8, 1, 1),
        (8, 2, 1),
        (8, 2, 2),
        (8, 2, 16),
        (8, 4, 1),
        (8, 4, 2),
        (8, 4, 16),
    ];
    for (tp, dcp, i) in layouts {
        let got = run(&model, cfg(layout(tp, dcp, i), 512, big), &prompts, 12).await;
        assert_same(&base, &got, &format!("tp={tp} dcp={dcp} I={i}"));
    }
}

/// Qwen2 (q/k/v biases; 8 query heads, 2 KV heads, bfloat16 weights run in float32):
/// sharding the biases with their heads gives the single-rank outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_qwen2_sharded_equals_single_rank() {
    let model = fixture("tiny-qwen2");
    let prompts = prompts(384, 600);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 512, big), &prompts, 12).await;
    for (tp, dcp, i) in [(2, 1, 1), (4, 2, 1), (8, 4, 2)] {
        let got = run(&model, cfg(layout(tp, dcp, i), 512, big), &prompts, 12).await;
        assert_same(&base, &got, &format!("qwen2 tp={tp} dcp={dcp} I={i}"));
    }
}

/// Qwen3 (per-head q/k RMSNorm; 4 query heads, 2 KV heads, head_dim 16, float16
/// weights run in float32): tp=2, and tp=4 with dcp=2 at interleave 1 and the block size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_qwen3_sharded_equals_single_rank() {
    let model = fixture("tiny-qwen3");
    let prompts = prompts(384, 600);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 512, big), &prompts, 12).await;
    for (tp, dcp, i) in [(2, 1, 1), (4, 2, 1), (4, 2, 16)] {
        let got = run(&model, cfg(layout(tp, dcp, i), 512, big), &prompts, 12).await;
        assert_same(&base, &got, &format!("qwen3 tp={tp} dcp={dcp} I={i}"));
    }
}

/// Preemption under DCP: prompts that fit together but whose growth does not, so
/// running sequences are preempted and recomputed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcp_with_forced_preemption_equals_single_rank() {
    let model = fixture("tiny-llama");
    let prompts = preemption_prompts();
    let base = run(&model, cfg(layout(1, 1, 1), 256, 64 << 20), &prompts, 40).await;
    // Per rank: 2 layers × 1 KV head × 8 dims × 4 bytes × 2 (K, V) = 128 bytes per token.
    let tight = 128 * 16 * 20; // 20 blocks of 16 tokens per rank: 640 tokens under dcp=2
    let engine_cfg = cfg(layout(4, 2, 2), 256, tight);
    let (got, stats) = run_stats(&model, engine_cfg, &prompts, 40).await;
    assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
    assert_same(&base, &got, "tp=4 dcp=2 I=2 with preemption");
}

/// The default model (9 query heads, 3 KV heads): tp=9 with dcp 1 and 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_model_tp9_equals_single_rank() {
    let model = default_model();
    let prompts = vec![
        gqa_prompts(49152, 300)[2].clone(),
        gqa_prompts(49152, 300)[4].clone(),
    ];
    let big = 256 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 2048, big), &prompts, 6).await;
    for (tp, dcp) in [(9, 1), (9, 3)] {
        let got = run(&model, cfg(layout(tp, dcp, 1), 2048, big), &prompts, 6).await;
        assert_same(&base, &got, &format!("default model tp={tp} dcp={dcp}"));
    }
}

/// Prefix-cache hits under DCP: requests sharing a long prefix, served one after the
/// other, reuse its blocks and still equal the single-rank engine without caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcp_prefix_cache_hits_equal_single_rank() {
    let model = fixture("tiny-llama");
    let prefix: Vec<u32> = (0..700).map(|j| (j * 37 % 380) as u32 + 3).collect();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend((0..5 + i * 11).map(|j| ((j * 13 + i) % 380) as u32 + 3));
            p
        })
        .collect();
    let mut no_cache = cfg(layout(1, 1, 1), 256, 64 << 20);
    no_cache.enable_prefix_caching = false;
    let mut base = Vec::new();
    for p in &prompts {
        base.extend(run(&model, no_cache.clone(), std::slice::from_ref(p), 10).await);
    }
    for (tp, dcp, i) in [(1, 1, 1), (4, 2, 1), (8, 4, 2)] {
        let engine = Engine::builder(&model)
            .config(cfg(layout(tp, dcp, i), 256, 64 << 20))
            .build()
            .await
            .unwrap();
        let mut got = Vec::new();
        for p in &prompts {
            let mut params = greedy(10);
            params.logprobs = Some(5);
            use futures::StreamExt;
            let mut s = engine.generate(Prompt::Tokens(p.clone()), params).unwrap();
            let mut toks = Vec::new();
            while let Some(ev) = s.next().await {
                match ev.unwrap() {
                    dcpserve::GenerationEvent::Token { token, .. } => toks.push(token),
                    dcpserve::GenerationEvent::Finished { .. } => break,
                }
            }
            got.push(toks);
        }
        let stats = engine.stats().await.unwrap();
        assert!(
            stats.prefix_cache_hits >= 2 * 640,
            "tp={tp} dcp={dcp}: expected the shared prefix to hit, got {stats:?}"
        );
        assert_same(&base, &got, &format!("prefix hits tp={tp} dcp={dcp} I={i}"));
    }
}
