//! The planner's capacity and maximum concurrency agree with what the engine allocates
//! and reaches: same KV bytes per rank, same layout, same workload.

mod common;

use common::*;
use dcpserve::{Engine, EngineConfig, ParallelConfig, Prompt};
use dcpserve_tools::planner::{
    load_model_config, plan_layouts, Hardware, HardwareOverrides, HardwarePreset, KvDtype,
    LayoutEstimate, PlanOptions, WeightDtype, Workload,
};

fn layout(tp: usize, dcp: usize) -> ParallelConfig {
    ParallelConfig {
        tensor_parallel_size: tp,
        decode_context_parallel_size: dcp,
        cp_kv_cache_interleave_size: 1,
        ..Default::default()
    }
}

/// The planner's row for (tp, dcp) of `model` with `kv_bytes` per rank.
fn planned(
    model: &str,
    tp: usize,
    dcp: usize,
    kv_bytes: u64,
    workload: Workload,
) -> LayoutEstimate {
    planned_in(model, tp, dcp, kv_bytes, workload, KvDtype::F32)
}

/// [`planned`] with a KV cache of `kv_dtype`.
fn planned_in(
    model: &str,
    tp: usize,
    dcp: usize,
    kv_bytes: u64,
    workload: Workload,
    kv_dtype: KvDtype,
) -> LayoutEstimate {
    let cfg = load_model_config(&fixture(model)).unwrap();
    let hw = Hardware::new(
        HardwarePreset::Cpu,
        &HardwareOverrides {
            ranks: Some(tp),
            kv_cache_memory_bytes: Some(kv_bytes),
            ..Default::default()
        },
    );
    let opts = PlanOptions {
        weight_dtype: WeightDtype::F32,
        attention_dtype: WeightDtype::F32,
        kv_dtype,
        block_size: 16,
        interleave: 1,
        max_num_seqs: 256,
        workload,
        concurrency: None,
    };
    plan_layouts(&cfg, &hw, &opts)
        .into_iter()
        .find(|r| r.layout.tp == tp && r.layout.dcp == dcp)
        .expect("layout listed")
        .outcome
        .expect("layout valid")
}

async fn engine(model: &str, tp: usize, dcp: usize, kv_bytes: u64) -> Engine {
    engine_in(model, tp, dcp, kv_bytes, KvDtype::F32).await
}

/// [`engine`] with its KV cache stored as the planner's `kv_dtype` names it.
async fn engine_in(model: &str, tp: usize, dcp: usize, kv_bytes: u64, kv_dtype: KvDtype) -> Engine {
    let cfg = EngineConfig {
        parallel: layout(tp, dcp),
        kv_cache_memory_bytes: Some(kv_bytes),
        kv_cache_dtype: kv_dtype.explicit(),
        block_size: 16,
        ..f32_config()
    };
    Engine::builder(fixture(model))
        .config(cfg)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_capacity_equals_the_engines_allocation() {
    // Budgets that are not whole blocks, on dense and MLA models, with and without DCP.
    for (model, tp, dcp, bytes) in [
        ("tiny-llama", 1, 1, 1_000_003u64),
        ("tiny-llama", 4, 2, 777_777),
        ("tiny-llama", 8, 4, 123_456),
        ("tiny-deepseek", 2, 2, 500_001),
        ("tiny-deepseek", 4, 4, 99_999),
    ] {
        // Every KV format the engine stores (fp8 = E4M3; E5M2 has the same width).
        for kv in [KvDtype::F32, KvDtype::Bf16, KvDtype::Fp8, KvDtype::Fp8E5M2] {
            let plan = planned_in(model, tp, dcp, bytes, Workload::fixed(100, 10), kv);
            let engine = engine_in(model, tp, dcp, bytes, kv).await;
            assert_eq!(
                (plan.capacity.tokens_per_rank, plan.capacity.tokens_total),
                engine.kv_capacity(),
                "{model} tp={tp} dcp={dcp} {kv:?}"
            );
            let stats = engine.stats().await.unwrap();
            assert_eq!(
                plan.capacity.num_blocks, stats.total_blocks,
                "{model} {kv:?} blocks"
            );
        }
    }
}

/// Sends `n` requests of `input` prompt tokens generating `output` each, all at once,
/// and returns the engine's preemption count when they are done.
async fn run_batch(engine: &Engine, n: usize, input: usize, output: usize) -> u64 {
    let before = engine.stats().await.unwrap().preemptions;
    let jobs = (0..n).map(|i| {
        let prompt: Vec<u32> = (0..input)
            .map(|t| ((t * 7 + i * 13) % 380) as u32 + 3)
            .collect();
        engine.complete(Prompt::Tokens(prompt), greedy(output))
    });
    for out in futures::future::join_all(jobs).await {
        assert_eq!(out.unwrap().token_ids.len(), output);
    }
    engine.stats().await.unwrap().preemptions - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_concurrency_runs_without_preemption_and_one_more_does_not() {
    // tiny-llama at tp=1: 256 bytes per token, 4,096 per block of 16; 40 blocks.
    // Requests of 100 + 60 tokens need 10 blocks each at the end: 4 fit. A fifth is
    // admitted on its prompt (7 blocks) and the growing batch must preempt.
    // At tp=4 dcp=2: 128 bytes per token per rank, virtual blocks of 32 tokens hold 5
    // blocks per request: 8 fit.
    for (tp, dcp, bytes, expected) in [(1, 1, 40 * 4096, 4), (4, 2, 40 * 16 * 128, 8)] {
        let plan = planned("tiny-llama", tp, dcp, bytes, Workload::fixed(100, 60));
        assert_eq!(plan.capacity.num_blocks, 40);
        assert_eq!(plan.max_concurrency, expected, "tp={tp} dcp={dcp}");
        let engine = engine("tiny-llama", tp, dcp, bytes).await;
        let fit = run_batch(&engine, plan.max_concurrency, 100, 60).await;
        assert_eq!(
            fit, 0,
            "tp={tp} dcp={dcp}: the planned concurrency preempted"
        );
        let over = run_batch(&engine, plan.max_concurrency + 1, 100, 60).await;
        assert!(
            over > 0,
            "tp={tp} dcp={dcp}: one more than planned never preempted"
        );
    }
}
