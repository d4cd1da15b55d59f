//! With the same KV memory per rank, dcp=N holds N× the tokens of the replicated
//! layout, and sequences that cannot fit without DCP are served with it.

mod common;

use common::*;
use dcpserve::{Engine, EngineConfig, ParallelConfig, Prompt};

fn layout(tp: usize, dcp: usize) -> ParallelConfig {
    ParallelConfig {
        tensor_parallel_size: tp,
        decode_context_parallel_size: dcp,
        cp_kv_cache_interleave_size: 1,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcp_multiplies_kv_capacity_at_equal_memory_per_rank() {
    // tiny-llama at tp=8: one replicated KV head per rank, 2 layers × 8 dims × 4 bytes × 2.
    let per_token_per_rank = 2 * 8 * 4 * 2;
    let block = 16;
    let blocks_per_rank = 24;
    let bytes = (per_token_per_rank * block * blocks_per_rank) as u64;
    let mut totals = Vec::new();
    for dcp in [1, 2, 4] {
        let cfg = EngineConfig {
            parallel: layout(8, dcp),
            kv_cache_memory_bytes: Some(bytes),
            block_size: block,
            ..f32_config()
        };
        let engine = Engine::builder(fixture("tiny-llama"))
            .config(cfg)
            .build()
            .await
            .unwrap();
        let (per_rank, total) = engine.kv_capacity();
        assert_eq!(
            per_rank,
            block * blocks_per_rank,
            "dcp={dcp}: tokens per rank"
        );
        assert_eq!(total, per_rank * dcp, "dcp={dcp}: tokens in total");
        let stats = engine.stats().await.unwrap();
        assert_eq!(
            stats.total_blocks, blocks_per_rank,
            "dcp={dcp}: virtual blocks"
        );
        totals.push(total);

        // A sequence of 1.5× the replicated capacity fits only when dcp ≥ 2.
        let long: Vec<u32> = (0..(block * blocks_per_rank * 3 / 2))
            .map(|i| (i % 380) as u32 + 3)
            .collect();
        let res = engine.complete(Prompt::Tokens(long), greedy(2)).await;
        if dcp == 1 {
            let err = res.unwrap_err().to_string();
            // The engine lowered max_model_len to what the cache holds, and the prompt exceeds it.
            assert!(
                err.contains(&format!(
                    "maximum model length of {}",
                    block * blocks_per_rank
                )),
                "{err}"
            );
        } else {
            assert_eq!(res.unwrap().token_ids.len(), 2);
        }
    }
    assert_eq!(totals[1], 2 * totals[0]);
    assert_eq!(totals[2], 4 * totals[0]);
}

/// At equal `--kv-cache-memory-bytes`, a bfloat16 cache holds 2× the float32 cache's
/// tokens, and an FP8 cache as many as one byte per value plus one scale byte per
/// cached row allow: 4·hd/(hd + 1)× (3.94× at SmolLM2's head_dim 64, 3.56× at these
/// fixtures' 8), in whole blocks (dense and MLA models, with and without DCP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrow_kv_caches_hold_two_and_about_four_times_the_tokens() {
    // Budgets of whole f32 blocks: tiny-llama at tp=1 costs 256 bytes per f32 token
    // (2 layers × K and V × 2 KV heads × 8 values × 4 bytes), 72 in FP8 (2 × 2 × 2 ×
    // (8 + 1)); at tp=4 one replicated head: 128 and 36; tiny-deepseek (3 layers × 40
    // latent values) 480 and 3 × 41 = 123.
    for (model, tp, dcp, bytes, fp8_per_token) in [
        ("tiny-llama", 1, 1, 256 * 16 * 24u64, 72u64),
        ("tiny-llama", 4, 2, 128 * 16 * 10, 36),
        ("tiny-deepseek", 2, 2, 480 * 16 * 12, 123),
    ] {
        let mut tokens = Vec::new();
        for dt in dcpserve::KvCacheDType::ALL {
            let cfg = EngineConfig {
                parallel: layout(tp, dcp),
                kv_cache_memory_bytes: Some(bytes),
                kv_cache_dtype: Some(dt),
                block_size: 16,
                ..f32_config()
            };
            let engine = Engine::builder(fixture(model))
                .config(cfg)
                .build()
                .await
                .unwrap();
            let (per_rank, total) = engine.kv_capacity();
            assert_eq!(total, per_rank * dcp, "{model} {dt}");
            tokens.push(total);
        }
        let f32_tokens = tokens[0];
        let fp8_tokens = (bytes / (16 * fp8_per_token)) as usize * 16 * dcp;
        assert_eq!(
            tokens,
            [f32_tokens, 2 * f32_tokens, fp8_tokens, fp8_tokens],
            "{model} tp={tp} dcp={dcp}: f32, bf16, fp8_e4m3, fp8_e5m2"
        );
        println!(
            "MEASURED {model} tp={tp} dcp={dcp}: FP8 holds {:.2}× the float32 tokens",
            fp8_tokens as f64 / f32_tokens as f64
        );
    }
}
