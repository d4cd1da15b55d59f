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
        let engine = Engine::from_path(fixture("tiny-llama"), cfg).await.unwrap();
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
