//! Prefill context parallelism (`--prefill-context-parallel-size`): `pcp` copies of the
//! TP group split every step's tokens, composed with DCP, and give the single-rank
//! engine's outputs (greedy tokens equal, log-probabilities within 1e-4, float32) on
//! prompts of more than 3,000 tokens, with prefix-cache hits and forced preemption, for
//! GQA and MLA. The KV placement test checks that a pcp prefill leaves every token's K/V
//! on the rank the DCP placement assigns it, exactly where a dcp-only prefill puts it.

mod common;

use std::sync::Arc;

use common::equivalence::*;
use common::*;
use dcpserve::{Engine, Prompt};
use dcpserve_actors::plan::{LocalBatch, StepBatch};
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::{CpuBackend, HostCollectives, InProcessComm, KvCacheDType};
use dcpserve_model::arch::{DecoderModel, KvCache, RankComms, TpShard, WeightPrecision};
use dcpserve_model::ModelFiles;

/// Tiny GQA model (8 query heads, 2 KV heads): tp=2 pcp=2, tp=4 pcp=2 dcp=2 I=16 and
/// pcp=4 on a 3,100-token prompt (and short ones) prefilled in chunks of 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gqa_pcp_layouts_equal_single_rank() {
    let model = fixture("tiny-llama");
    let prompts = prompts(384, 3100);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 512, big), &prompts, 12).await;
    for (tp, pcp, dcp, i) in [(2, 2, 1, 1), (4, 2, 2, 16), (1, 4, 1, 1)] {
        let got = run(
            &model,
            cfg(pcp_layout(tp, pcp, dcp, i), 512, big),
            &prompts,
            12,
        )
        .await;
        assert_same(&base, &got, &format!("tp={tp} pcp={pcp} dcp={dcp} I={i}"));
    }
}

/// Tiny DeepSeek-V3 (MLA + MoE): tp=2 pcp=2 dcp=2 and pcp=4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_pcp_layouts_equal_single_rank() {
    let model = fixture("tiny-deepseek");
    let prompts = prompts(384, 3100);
    let big = 64 << 20;
    let base = run(&model, cfg(layout(1, 1, 1), 512, big), &prompts, 8).await;
    for (tp, pcp, dcp, i) in [(2, 2, 2, 1), (1, 4, 1, 1)] {
        let got = run(
            &model,
            cfg(pcp_layout(tp, pcp, dcp, i), 512, big),
            &prompts,
            8,
        )
        .await;
        assert_same(
            &base,
            &got,
            &format!("MLA tp={tp} pcp={pcp} dcp={dcp} I={i}"),
        );
    }
}

/// Requests sharing a 3,000-token prefix, served one after the other, hit the prefix
/// cache under pcp (GQA tp=2 pcp=2, MLA tp=2 pcp=2 dcp=2) and equal the single rank
/// without caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_prefix_cache_hits_equal_single_rank() {
    let prefix: Vec<u32> = (0..3000).map(|j| (j * 37 % 380) as u32 + 3).collect();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend((0..5 + i * 11).map(|j| ((j * 13 + i) % 380) as u32 + 3));
            p
        })
        .collect();
    for (name, (tp, pcp, dcp)) in [("tiny-llama", (2, 2, 1)), ("tiny-deepseek", (2, 2, 2))] {
        let model = fixture(name);
        let mut no_cache = cfg(layout(1, 1, 1), 512, 64 << 20);
        no_cache.enable_prefix_caching = false;
        let mut base = Vec::new();
        for p in &prompts {
            base.extend(run(&model, no_cache.clone(), std::slice::from_ref(p), 10).await);
        }
        let engine = Engine::builder(&model)
            .config(cfg(pcp_layout(tp, pcp, dcp, 1), 512, 64 << 20))
            .build()
            .await
            .unwrap();
        let mut got = Vec::new();
        for p in &prompts {
            got.extend(generate_all(&engine, std::slice::from_ref(p), 10).await);
        }
        let stats = engine.stats().await.unwrap();
        assert!(
            stats.prefix_cache_hits >= 2 * 2900,
            "{name} tp={tp} pcp={pcp} dcp={dcp}: expected the shared prefix to hit, got {stats:?}"
        );
        assert_same(
            &base,
            &got,
            &format!("{name} prefix hits tp={tp} pcp={pcp} dcp={dcp}"),
        );
    }
}

/// Preemption under pcp: prompts that fit together but whose growth does not, so running
/// sequences are preempted and recomputed (GQA tp=2 pcp=2, MLA tp=2 pcp=2 dcp=2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_with_forced_preemption_equals_single_rank() {
    let prompts = preemption_prompts();
    // GQA per rank: 2 layers × 1 KV head × 8 dims × 4 bytes × (K, V) = 128 bytes per
    // token; 20 blocks of 16 tokens per rank hold 640 tokens over the 2 context-parallel
    // ranks, less than the six sequences grow to together.
    let cases = [
        ("tiny-llama", (2, 2, 1, 2), 128 * 16 * 20),
        ("tiny-deepseek", (2, 2, 2, 1), 0),
    ];
    for (name, (tp, pcp, dcp, i), budget) in cases {
        let model = fixture(name);
        let base = run(&model, cfg(layout(1, 1, 1), 256, 64 << 20), &prompts, 40).await;
        let budget = if budget > 0 {
            budget
        } else {
            // MLA: one latent row per token per layer, on every rank: 20 blocks of 16.
            let files = ModelFiles::open(&model).unwrap();
            let shape = files.config.kv_shape();
            (shape.bytes_per_token_per_rank(1, KvCacheDType::F32) * 16 * 10) as u64
        };
        let engine_cfg = cfg(pcp_layout(tp, pcp, dcp, i), 256, budget);
        let (got, stats) = run_stats(&model, engine_cfg, &prompts, 40).await;
        assert!(
            stats.preemptions > 0,
            "{name}: expected preemptions: {stats:?}"
        );
        assert_same(
            &base,
            &got,
            &format!("{name} tp={tp} pcp={pcp} dcp={dcp} with preemption"),
        );
    }
}

/// Speculation (n-gram) keeps working under pcp: the same tokens as the single rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_with_ngram_speculation_equals_single_rank() {
    let model = fixture("tiny-llama");
    // A repetitive prompt, so the n-gram proposer finds drafts.
    let prompt: Vec<u32> = (0..3100).map(|j| (j % 23) as u32 + 3).collect();
    let prompts = vec![prompt];
    let spec = dcpserve::SpeculativeConfig::from_json(
        r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}"#,
    )
    .unwrap();
    let base = run(&model, cfg(layout(1, 1, 1), 512, 64 << 20), &prompts, 24).await;
    let mut with_spec = cfg(pcp_layout(2, 2, 1, 1), 512, 64 << 20);
    with_spec.speculative = Some(spec);
    let (got, stats) = run_stats(&model, with_spec, &prompts, 24).await;
    assert!(
        stats.speculation.num_draft_tokens > 0,
        "expected drafts: {stats:?}"
    );
    assert_same(&base, &got, "tp=2 pcp=2 with n-gram speculation");
}

/// A draft model (tiny-qwen2, same vocabulary, on its own single rank) proposing for a
/// tp=2 pcp=2 target: most drafts fail, the output must not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_with_a_draft_model_equals_single_rank() {
    let model = fixture("tiny-llama");
    let prompts = prompts(384, 3100);
    let spec = dcpserve::SpeculativeConfig::from_json(&format!(
        r#"{{"method": "draft_model", "model": "{}", "num_speculative_tokens": 3}}"#,
        fixture("tiny-qwen2").display()
    ))
    .unwrap();
    let base = run(&model, cfg(layout(1, 1, 1), 512, 64 << 20), &prompts, 12).await;
    let mut with_spec = cfg(pcp_layout(2, 2, 1, 1), 512, 64 << 20);
    with_spec.speculative = Some(spec);
    let (got, stats) = run_stats(&model, with_spec, &prompts, 12).await;
    assert!(
        stats.speculation.num_drafts > 0,
        "no drafts verified: {stats:?}"
    );
    assert_same(&base, &got, "tp=2 pcp=2 with a draft model");
}

// ---------------------------------------------------------------------------------------
// KV placement: a pcp prefill stores each token where the DCP placement says
// ---------------------------------------------------------------------------------------

/// Runs `ids` through every rank of `layout` in prefill chunks of `chunk` (block table
/// 0, 1, 2, ... on every rank) and returns each rank's K/V cache.
fn prefill_every_rank(
    files: &ModelFiles,
    layout: Layout,
    ids: &[u32],
    chunk: usize,
) -> Vec<KvCache> {
    let world = layout.world();
    // The groups, as the collective actor lays them out.
    let mut tp_comms: Vec<Option<InProcessComm>> = (0..world).map(|_| None).collect();
    for p in 0..layout.pcp() {
        for (r, c) in layout
            .tp_group_ranks(p)
            .zip(InProcessComm::group(layout.tp()))
        {
            tp_comms[r] = Some(c);
        }
    }
    let mut cp_comms: Vec<Option<InProcessComm>> = (0..world).map(|_| None).collect();
    for g in 0..layout.num_dcp_groups() {
        let ranks = layout.cp_group_ranks(g);
        for (&r, c) in ranks.iter().zip(InProcessComm::group(ranks.len())) {
            cp_comms[r] = Some(c);
        }
    }
    let comms: Vec<RankComms> = (0..world)
        .map(|r| RankComms {
            world: Arc::new(HostCollectives::new(Arc::new(tp_comms[r].take().unwrap()))),
            dcp: Arc::new(HostCollectives::new(Arc::new(cp_comms[r].take().unwrap()))),
            dcp_merge: Default::default(),
            split: layout.prefill_split(r),
        })
        .collect();
    let vbs = layout.virtual_block_size();
    let blocks = ids.len().div_ceil(vbs);
    let table: Vec<u32> = (0..blocks as u32).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                let table = &table;
                s.spawn(move || {
                    let shard = TpShard {
                        rank: layout.tp_rank(rank),
                        size: layout.tp(),
                    };
                    let dev = CpuBackend::new(1);
                    let model = DecoderModel::load_shard(
                        dev,
                        files.config.clone(),
                        files.tensors.as_ref(),
                        WeightPrecision::F32,
                        shard,
                    )
                    .unwrap();
                    let mut cache = model
                        .new_kv_cache(blocks, layout.block_size(), KvCacheDType::F32)
                        .unwrap();
                    let placement = layout.placement(rank);
                    let tables = [table.as_slice()];
                    for start in (0..ids.len()).step_by(chunk) {
                        let end = (start + chunk).min(ids.len());
                        let batch = StepBatch {
                            tokens: ids[start..end].to_vec(),
                            positions: (start..end).collect(),
                            token_seq: vec![0; end - start],
                            block_tables: vec![table.clone()],
                            logits_for: vec![end - start - 1],
                            ..Default::default()
                        };
                        let local = LocalBatch::new(&batch, &placement);
                        let input = local.input(&batch, &tables);
                        model
                            .forward(&c, &input, &mut cache, &Default::default())
                            .unwrap();
                    }
                    cache
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// After a prefill of 3,100 tokens with tp=2 pcp=2 (interleave 1 and 16), every rank's
/// K/V cache holds exactly what the rank of the same KV head and context-parallel rank
/// holds after a dcp-only prefill (tp=4 dcp=2): the same tokens at the same slots
/// (values within float32 summation order), and nothing anywhere else.
#[test]
fn pcp_prefill_stores_kv_where_the_dcp_placement_puts_it() {
    let files = ModelFiles::open(fixture("tiny-llama")).unwrap();
    let ids: Vec<u32> = (0..3100).map(|j| (j * 131 % 381) as u32 + 3).collect();
    for i in [1, 16] {
        let pcp = Layout::new(2, 1, i, 16, 1).unwrap().with_pcp(2).unwrap();
        let dcp = Layout::new(4, 2, i, 16, 1).unwrap();
        assert_eq!(pcp.virtual_block_size(), dcp.virtual_block_size());
        let with_pcp = prefill_every_rank(&files, pcp, &ids, 512);
        let with_dcp = prefill_every_rank(&files, dcp, &ids, 512);
        let dev = CpuBackend::new(1);
        for (r, cache) in with_pcp.iter().enumerate() {
            // KV head g = TP rank (tp=2, 2 KV heads); the dcp-only rank holding head g at
            // the same context-parallel rank is TP rank 2g + cp_rank.
            let (g, c) = (pcp.tp_rank(r), pcp.cp_rank(r));
            let twin = 2 * g + c;
            assert_eq!(dcp.cp_rank(twin), c);
            let mut stored = 0;
            for layer in 0..cache.num_layers() {
                let (k, v) = cache.download_layer(&dev, layer).unwrap();
                let (k2, v2) = with_dcp[twin].download_layer(&dev, layer).unwrap();
                assert_eq!(k.len(), k2.len());
                for (a, b) in k.iter().zip(&k2).chain(v.iter().zip(&v2)) {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "I={i} rank {r} layer {layer}: {a} vs {b}"
                    );
                }
                let row = cache.head_dim;
                stored = k
                    .chunks(row)
                    .filter(|x| x.iter().any(|&y| y != 0.0))
                    .count();
            }
            // Exactly the positions the placement gives this rank hold values.
            let want = pcp.placement(r).local_len(ids.len());
            assert_eq!(stored, want, "I={i} rank {r}: stored rows");
            assert!(want > 0 && want < ids.len());
        }
    }
}

/// A pcp engine answers through the facade like any other (the world is tp × pcp) and
/// states its layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_engine_reports_its_world() {
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(cfg(pcp_layout(2, 2, 1, 1), 256, 64 << 20))
        .build()
        .await
        .unwrap();
    let l = engine.layout();
    assert_eq!((l.tp(), l.pcp(), l.world(), l.cp_size()), (2, 2, 4, 2));
    let out = engine
        .complete(Prompt::Tokens(vec![5, 6, 7]), greedy(3))
        .await
        .unwrap();
    assert_eq!(out.token_ids.len(), 3);
}
