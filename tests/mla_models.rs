//! Tiny random DeepSeek-V3 models (MLA + MoE; fixtures made by scripts/make_references.py
//! `--only deepseek`): logprobs against transformers, every TP / DCP / interleave layout
//! against the single-rank engine, and the latent cache's memory under DCP.

mod common;

use common::equivalence::*;
use common::reference::check_logprobs;
use common::*;
use dcpserve::{Engine, Prompt};
use dcpserve_actors::Placement;
use dcpserve_kernels::CpuBackend;
use dcpserve_model::arch::{RankCache, RankModel, WeightPrecision};
use dcpserve_model::ModelFiles;

/// q_lora_rank 24, YaRN, interleaved RoPE, 8 experts, f32 weights.
const MODEL: &str = "tiny-deepseek";
/// Plain q_proj, no scaling, rotate-half RoPE, 4 experts, bf16 weights.
const MODEL_NOQ: &str = "tiny-deepseek-noq";

#[test]
fn tiny_deepseek_matches_transformers() {
    check_logprobs(MODEL);
}

#[test]
fn tiny_deepseek_noq_matches_transformers() {
    check_logprobs(MODEL_NOQ);
}

/// Saved in transformers 5's native format: fused experts, `rope_parameters` (YaRN) only,
/// `"architectures": null`; bf16 weights.
#[test]
fn tiny_deepseek_fused_matches_transformers() {
    check_logprobs("tiny-deepseek-fused");
}

// ---------------------------------------------------------------------------------------
// Layouts against the single-rank engine
// ---------------------------------------------------------------------------------------

/// tp ∈ {1, 2, 4} with every dcp dividing it and interleave 1, 2 and the block size (16),
/// on a 3,100-token prompt (plus short ones) prefilled in chunks of 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_every_layout_equals_single_rank() {
    let prompts = prompts(384, 3100);
    let big = 64 << 20;
    let base = run(&fixture(MODEL), cfg(layout(1, 1, 1), 512, big), &prompts, 8).await;
    let layouts = [
        (2, 1, 1),
        (2, 2, 1),
        (2, 2, 16),
        (4, 1, 1),
        (4, 2, 2),
        (4, 4, 1),
        (4, 4, 2),
        (4, 4, 16),
    ];
    for (tp, dcp, i) in layouts {
        let got = run(
            &fixture(MODEL),
            cfg(layout(tp, dcp, i), 512, big),
            &prompts,
            8,
        )
        .await;
        assert_same(&base, &got, &format!("tp={tp} dcp={dcp} I={i}"));
    }
}

/// The model without q_lora_rank / YaRN, under the widest DCP and a mixed layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_noq_layouts_equal_single_rank() {
    let prompts = prompts(384, 1200);
    let big = 64 << 20;
    let base = run(
        &fixture(MODEL_NOQ),
        cfg(layout(1, 1, 1), 256, big),
        &prompts,
        8,
    )
    .await;
    for (tp, dcp, i) in [(4, 4, 1), (4, 2, 16)] {
        let got = run(
            &fixture(MODEL_NOQ),
            cfg(layout(tp, dcp, i), 256, big),
            &prompts,
            8,
        )
        .await;
        assert_same(&base, &got, &format!("noq tp={tp} dcp={dcp} I={i}"));
    }
}

/// Preemption under DCP: prompts that fit together but whose growth does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_dcp_with_forced_preemption_equals_single_rank() {
    let prompts = preemption_prompts();
    let base = run(
        &fixture(MODEL),
        cfg(layout(1, 1, 1), 256, 64 << 20),
        &prompts,
        40,
    )
    .await;
    // Per rank: 3 layers × (32 + 8) latent values × 4 bytes = 480 bytes per token.
    let tight = 480 * 16 * 20; // 20 blocks of 16 tokens per rank: 640 tokens under dcp=2
    let (got, stats) = run_stats(
        &fixture(MODEL),
        cfg(layout(4, 2, 2), 256, tight),
        &prompts,
        40,
    )
    .await;
    assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
    assert_same(&base, &got, "tp=4 dcp=2 I=2 with preemption");
}

/// Prefix-cache hits under DCP: requests sharing a 700-token prefix, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_dcp_prefix_cache_hits_equal_single_rank() {
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
        base.extend(
            run(
                &fixture(MODEL),
                no_cache.clone(),
                std::slice::from_ref(p),
                6,
            )
            .await,
        );
    }
    for (tp, dcp, i) in [(2, 2, 1), (4, 4, 2)] {
        let engine = Engine::builder(fixture(MODEL))
            .config(cfg(layout(tp, dcp, i), 256, 64 << 20))
            .build()
            .await
            .unwrap();
        let mut got = Vec::new();
        for p in &prompts {
            got.extend(generate_all(&engine, std::slice::from_ref(p), 6).await);
        }
        let stats = engine.stats().await.unwrap();
        assert!(
            stats.prefix_cache_hits >= 2 * 640,
            "tp={tp} dcp={dcp}: expected the shared prefix to hit, got {stats:?}"
        );
        assert_same(&base, &got, &format!("prefix hits tp={tp} dcp={dcp} I={i}"));
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

/// With dcp=N each rank stores 1/N of every sequence's latent tokens, at
/// (kv_lora_rank + qk_rope_head_dim) × 4 bytes per token per layer, and the engine's
/// capacity is that of one latent copy per rank (not K and V, not per head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_dcp_shards_the_latent_cache() {
    let files = ModelFiles::open(fixture(MODEL)).unwrap();
    let c = &files.config;
    let mla = c.mla.as_ref().unwrap();
    let per_token = c.num_hidden_layers * (mla.kv_lora_rank + mla.qk_rope_head_dim) * 4;
    assert_eq!(per_token, 3 * 40 * 4);
    for tp in [1, 2, 4] {
        assert_eq!(
            c.kv_shape()
                .bytes_per_token_per_rank(tp, dcpserve_kernels::KvCacheDType::F32),
            per_token,
            "replicated latent, tp={tp}"
        );
    }
    // The cache a rank allocates holds exactly that per slot.
    let model = RankModel::load(
        CpuBackend::new(1),
        c.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .unwrap();
    match model.new_kv_cache(10, 16).unwrap() {
        RankCache::Latent(l) => assert_eq!(l.lock().unwrap().bytes(), 160 * per_token),
        RankCache::Dense(_) => panic!("an MLA model got a K/V cache"),
    }
    let budget: u64 = 1 << 20;
    let block = 16;
    let per_rank = (budget as usize / (per_token * block)) * block;
    for (tp, dcp, i) in [(1, 1, 1), (4, 1, 1), (2, 2, 1), (4, 4, 2), (4, 2, 16)] {
        let engine = Engine::builder(fixture(MODEL))
            .config(cfg(layout(tp, dcp, i), 256, budget))
            .build()
            .await
            .unwrap();
        assert_eq!(
            engine.kv_capacity(),
            (per_rank, per_rank * dcp),
            "tp={tp} dcp={dcp}"
        );
        for len in [1usize, 17, 100, 3100] {
            let local: Vec<usize> = (0..dcp)
                .map(|r| {
                    Placement {
                        block_size: block,
                        dcp_size: dcp,
                        interleave: i,
                        dcp_rank: r,
                    }
                    .local_len(len)
                })
                .collect();
            assert_eq!(local.iter().sum::<usize>(), len);
            let most = len.div_ceil(dcp * i) * i;
            assert!(
                local.iter().all(|&l| l <= most),
                "len {len} dcp={dcp} I={i}: {local:?}"
            );
        }
    }
}

/// Greedy continuations through the engine (actor path, concurrent requests) equal
/// transformers' up to the first near-tie in the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_deepseek_greedy_through_the_engine() {
    for name in [MODEL, MODEL_NOQ] {
        let reference = read_json(fixture(name).join("reference.json"));
        let engine = Engine::builder(fixture(name))
            .config(f32_config())
            .build()
            .await
            .expect(name);
        let prompts = reference["prompts"].as_array().unwrap();
        let outs = futures::future::join_all(prompts.iter().map(|p| {
            let n = ids(&p["greedy"]).len();
            engine.complete(Prompt::Tokens(ids(&p["ids"])), greedy(n))
        }))
        .await;
        for (p, out) in prompts.iter().zip(outs) {
            let got = out.expect("completion").token_ids;
            let want = ids(&p["greedy"]);
            let margins = floats(&p["greedy_margin"]);
            let trusted = margins.iter().position(|&m| m < 1e-3).unwrap_or(want.len());
            assert_eq!(
                got[..trusted],
                want[..trusted],
                "{name} prompt {}: greedy continuation differs",
                p["name"]
            );
            assert_eq!(got.len(), want.len());
        }
    }
}
