//! The actor path under load: continuous batching, chunked prefill, preemption,
//! abort, rejection and rank-failure recovery, on a tiny model in float32.

mod common;

use std::time::Duration;

use common::*;
use dcpserve::{DType, Engine, EngineBuilder, EngineConfig, ParallelConfig, Prompt};
use futures::StreamExt;

fn prompts() -> Vec<Vec<u32>> {
    (0..6)
        .map(|i| {
            (0..(5 + i * 9))
                .map(|j| ((j * 31 + i * 17) % 300 + 3) as u32)
                .collect()
        })
        .collect()
}

async fn run_all(engine: &Engine, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let futs = prompts
        .iter()
        .map(|p| engine.complete(Prompt::Tokens(p.clone()), greedy(n)));
    futures::future::join_all(futs)
        .await
        .into_iter()
        .map(|r| r.expect("completion").token_ids)
        .collect()
}

async fn solo(prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(f32_config())
        .build()
        .await
        .unwrap();
    let mut out = Vec::new();
    for p in prompts {
        out.push(run_all(&engine, std::slice::from_ref(p), n).await.remove(0));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_chunked_and_preempted_outputs_equal_solo_runs() {
    let prompts = prompts();
    let want = solo(&prompts, 24).await;

    // Small token budget: prompts are prefilled in chunks, mixed with decodes.
    let cfg = EngineConfig {
        max_num_batched_tokens: 16,
        ..f32_config()
    };
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg)
        .build()
        .await
        .unwrap();
    assert_eq!(
        run_all(&engine, &prompts, 24).await,
        want,
        "chunked prefill + batching"
    );

    // Two micro-batches in ping-pong: same outputs.
    let cfg = EngineConfig {
        max_num_batched_tokens: 16,
        overlap_micro_batches: true,
        ..f32_config()
    };
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg)
        .build()
        .await
        .unwrap();
    assert_eq!(
        run_all(&engine, &prompts, 24).await,
        want,
        "ping-pong micro-batches"
    );

    // KV for about half the sequences: some must be preempted and recomputed.
    let per_block = 2 * 2 * 2 * 8 * 4 * 16; // K+V, layers, kv heads, head dim, f32, block
    let cfg = EngineConfig {
        kv_cache_memory_bytes: Some(per_block * 12),
        ..f32_config()
    };
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg)
        .build()
        .await
        .unwrap();
    assert_eq!(
        run_all(&engine, &prompts, 24).await,
        want,
        "with preemption"
    );
    let stats = engine.stats().await.unwrap();
    assert!(stats.preemptions > 0, "expected preemptions, got {stats:?}");
    assert_eq!(stats.free_blocks, stats.total_blocks, "all blocks freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_aborts_and_frees_blocks() {
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(f32_config())
        .build()
        .await
        .unwrap();
    let mut s = engine
        .generate(Prompt::Tokens(prompts()[3].clone()), greedy(3000))
        .unwrap();
    for _ in 0..3 {
        s.next().await.unwrap().unwrap();
    }
    assert!(engine.stats().await.unwrap().free_blocks < engine.stats().await.unwrap().total_blocks);
    drop(s);
    assert!(
        all_blocks_freed(&engine).await,
        "blocks still held after the abort"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_requests_are_rejected_clearly() {
    let cfg = EngineConfig {
        max_model_len: Some(32),
        ..f32_config()
    };
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg)
        .build()
        .await
        .unwrap();
    let long: Vec<u32> = (0..40).map(|i| i + 3).collect();
    let err = engine
        .complete(Prompt::Tokens(long), greedy(4))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("maximum model length of 32"),
        "{err}"
    );
    assert!(matches!(err, dcpserve::Error::InvalidRequest(_)), "{err:?}");
    let err = engine
        .complete(Prompt::Tokens(vec![]), greedy(4))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    assert!(matches!(err, dcpserve::Error::InvalidRequest(_)), "{err:?}");
    let err = engine
        .complete(Prompt::Tokens(vec![1_000_000]), greedy(4))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("out of vocabulary"), "{err}");
    assert!(matches!(err, dcpserve::Error::InvalidRequest(_)), "{err:?}");
    // The engine still serves after the rejections; output stops at max_model_len.
    let out = engine
        .complete(Prompt::Tokens(vec![5, 6, 7]), greedy(100))
        .await
        .unwrap();
    assert_eq!(out.token_ids.len(), 32 - 3);
    assert_eq!(out.finish_reason, dcpserve::FinishReason::Length);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rank_ends_its_requests_and_the_group_comes_back() {
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(f32_config())
        .build()
        .await
        .unwrap();
    let want = engine
        .complete(Prompt::Tokens(prompts()[1].clone()), greedy(8))
        .await
        .unwrap()
        .token_ids;
    let e = fail_rank_during_generation(&engine, prompts()[2].clone(), 1, 0).await;
    assert!(e.contains("rank group failed"), "{e}");
    // New requests succeed once the group is back, with the same output as before.
    let mut got = None;
    for _ in 0..50 {
        match engine
            .complete(Prompt::Tokens(prompts()[1].clone()), greedy(8))
            .await
        {
            Ok(c) => {
                got = Some(c.token_ids);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(got, Some(want));
}

/// A failed rank in a multi-rank DCP group: the survivors blocked in collectives are
/// released, the whole group restarts, and serving resumes with unchanged outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rank_in_a_dcp_group_restarts_the_group() {
    let cfg = EngineConfig {
        parallel: dcpserve::ParallelConfig {
            tensor_parallel_size: 4,
            decode_context_parallel_size: 2,
            cp_kv_cache_interleave_size: 1,
            ..Default::default()
        },
        ..f32_config()
    };
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg)
        .build()
        .await
        .unwrap();
    let want = engine
        .complete(Prompt::Tokens(prompts()[4].clone()), greedy(8))
        .await
        .unwrap()
        .token_ids;
    fail_rank_during_generation(&engine, prompts()[2].clone(), 1, 3).await;
    let got = tokio::time::timeout(
        Duration::from_secs(60),
        engine.complete(Prompt::Tokens(prompts()[4].clone()), greedy(8)),
    )
    .await
    .expect("serving resumes")
    .unwrap()
    .token_ids;
    assert_eq!(got, want);
}

/// The embedded engine built from a multi-model config file takes that entry's layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_from_a_config_file_entry() {
    let dir = std::env::temp_dir().join(format!("dcpserve-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "[[models]]\nname = \"a\"\npath = \"{0}\"\ndtype = \"float32\"\nkv_cache_memory_bytes = 8388608\n\n[[models]]\nname = \"b\"\npath = \"{0}\"\ndtype = \"float32\"\ntensor_parallel_size = 4\ndecode_context_parallel_size = 2\nkv_cache_memory_bytes = 8388608\n",
        fixture("tiny-llama").display()
    );
    let path = dir.join("models.toml");
    std::fs::write(&path, toml).unwrap();
    let from_file = |name| EngineBuilder::from_config_file(&path, Some(name));
    let a = from_file("a").unwrap().build().await.unwrap();
    let b = from_file("b").unwrap().build().await.unwrap();
    assert_eq!(a.name(), "a");
    assert_eq!(
        b.kv_capacity().1,
        2 * b.kv_capacity().0,
        "dcp=2 doubles the total"
    );
    let p = Prompt::Tokens(prompts()[3].clone());
    let ta = a.complete(p.clone(), greedy(6)).await.unwrap().token_ids;
    let tb = b.complete(p, greedy(6)).await.unwrap().token_ids;
    assert_eq!(ta, tb);
    let err = from_file("zzz").err().unwrap();
    assert_eq!(err.to_string(), "The model `zzz` does not exist.");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The builder's settings reach the engine: its name, its layout and its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_starts_the_engine_it_describes() {
    let dcp2 = ParallelConfig {
        tensor_parallel_size: 4,
        decode_context_parallel_size: 2,
        cp_kv_cache_interleave_size: 1,
        ..Default::default()
    };
    let kv_bytes = f32_config().kv_cache_memory_bytes.unwrap();
    let engine = Engine::builder(fixture("tiny-llama"))
        .name("tiny")
        .dtype(DType::Float32)
        .parallel(dcp2)
        .kv_cache_memory_bytes(kv_bytes)
        .max_model_len(48)
        .threads(2)
        .build()
        .await
        .unwrap();
    assert_eq!(engine.name(), "tiny");
    assert_eq!(engine.max_model_len(), 48);
    let (per_rank, total) = engine.kv_capacity();
    assert_eq!(total, 2 * per_rank, "dcp=2 shards the cache over two ranks");
    // Unnamed, the engine takes the model folder's name.
    let unnamed = Engine::builder(fixture("tiny-llama"))
        .config(f32_config())
        .build()
        .await
        .unwrap();
    assert_eq!(unnamed.name(), "tiny-llama");
    // An impossible layout is a configuration error, before any weight is read.
    let err = Engine::builder(fixture("tiny-llama"))
        .config(f32_config())
        .parallel(ParallelConfig {
            tensor_parallel_size: 3,
            decode_context_parallel_size: 2,
            cp_kv_cache_interleave_size: 1,
            ..Default::default()
        })
        .build()
        .await
        .err()
        .unwrap();
    assert!(matches!(err, dcpserve::Error::Config(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "tp_size=3 must be divisible by dcp_size=2."
    );
}
