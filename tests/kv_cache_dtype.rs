//! KV caches stored in bfloat16 and FP8 (`--kv-cache-dtype`):
//! - the single rank stays within a stated tolerance of the transformers references
//!   (the fixtures' `reference.json`), measured per type and printed;
//! - every TP / DCP layout, preemption, prefix-cache hits and speculation (MTP and a
//!   draft model) give the single rank's outputs with the same cache type: the same
//!   greedy tokens and log-probabilities within a tight tolerance.

mod common;

use common::equivalence::*;
use common::reference::check_logprobs_with;
use common::*;
use dcpserve::{EngineConfig, KvCacheDType, SpeculativeConfig};

const COMPRESSED: [KvCacheDType; 3] = [
    KvCacheDType::BF16,
    KvCacheDType::Fp8E4M3,
    KvCacheDType::Fp8E5M2,
];

fn typed(dt: KvCacheDType, c: EngineConfig) -> EngineConfig {
    EngineConfig {
        kv_cache_dtype: Some(dt),
        ..c
    }
}

/// The largest |Δ logprob| of the chosen tokens between two runs with equal tokens.
fn max_logprob_gap(a: &Run, b: &Run) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y))
        .map(|(x, y)| (x.logprob.unwrap() - y.logprob.unwrap()).abs())
        .fold(0.0, f32::max)
}

/// Log-probabilities of two layouts with the same compressed cache may differ by this
/// much. With an f32 cache the layouts agree to 1e-4 (summation order only); a narrow
/// cache rounds each stored value, so a value that lands within an f32 rounding error of
/// a rounding boundary can round differently on two layouts (one bf16/FP8 step of one
/// element; with FP8's row scales, a row's largest value at a scale boundary can move
/// the whole row to the next binade). Measured on 2026-12-01 (printed by every case): at
/// most 1.6e-4 (FP8 E4M3 under MTP), 1.05e-4 (bf16 under preemption), most cases below
/// 5e-5; on 2026-12-05 with FP8 row scales at most 1.05e-4; the bound is 3× the largest.
const LAYOUT_TOL: f32 = 5e-4;

/// Asserts `got` equals `base` (tokens, log-probabilities within [`LAYOUT_TOL`]) and
/// prints the measured gap.
fn assert_layout_same(base: &Run, got: &Run, what: &str) {
    assert_same_within(base, got, what, LAYOUT_TOL);
    eprintln!("{what}: max |Δ logprob| {:.2e}", max_logprob_gap(base, got));
}

/// The single rank against the transformers references, per cache type, over every
/// fixture prompt, whole and in chunks of 5 (the measured maximum is printed).
///
/// Tolerance: a stored value's relative rounding error is at most ε = 2⁻⁸ (bf16),
/// 2⁻⁴ (E4M3), 2⁻³ (E5M2) (FP8 with its scale per row: every value of a row down to
/// 2⁻¹³ of its largest stays normal), and the log-probabilities move in proportion.
/// Measured on 2026-12-05, max |Δ logprob| / ε was 5–18 on these random fixtures
/// (tiny-qwen3, tiny-deepseek, tiny-llama: bf16 0.020, 0.039, 0.071; E4M3 0.42, 0.74,
/// 0.80; E5M2 0.87, 2.19, 1.53, the same as with the former scale of 1.0 on
/// 2026-12-01: these fixtures' K/V were inside FP8's normal range either way), so the
/// bound is 25·ε, 1.4× the largest.
#[test]
fn single_rank_with_a_compressed_cache_stays_near_transformers() {
    for name in ["tiny-llama", "tiny-qwen3", "tiny-deepseek"] {
        for dt in COMPRESSED {
            let tol = 25.0 * dt.relative_precision();
            let worst = check_logprobs_with(name, &fixture(name), dt, tol);
            eprintln!(
                "MEASURED {name} {dt} KV cache vs transformers: max |Δ logprob| {worst:.3e} = {:.1}·ε (tolerance 25·ε = {tol:.3})",
                worst / dt.relative_precision()
            );
        }
    }
}

/// GQA (tiny-llama, 2 KV heads): tp=2, tp=4 dcp=2, tp=8 dcp=4 I=2 against the single
/// rank, each with the same compressed cache, a long prompt prefilled in chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gqa_layouts_equal_single_rank_with_the_same_cache_type() {
    let model = fixture("tiny-llama");
    let prompts = prompts(384, 1100);
    let big = 64 << 20;
    for dt in COMPRESSED {
        let base = run(
            &model,
            typed(dt, cfg(layout(1, 1, 1), 512, big)),
            &prompts,
            12,
        )
        .await;
        for (tp, dcp, i) in [(2, 1, 1), (4, 2, 1), (8, 4, 2)] {
            let c = typed(dt, cfg(layout(tp, dcp, i), 512, big));
            let got = run(&model, c, &prompts, 12).await;
            assert_layout_same(&base, &got, &format!("{dt} tp={tp} dcp={dcp} I={i}"));
        }
    }
}

/// MLA (tiny-deepseek, one latent row per token): tp=2 dcp=2 and tp=4 dcp=4 I=2, and
/// tp=4 dcp=2 I=2 in a cache small enough to force preemption, each against the single
/// rank with the same compressed latent cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mla_layouts_and_preemption_equal_single_rank_with_the_same_cache_type() {
    let model = fixture("tiny-deepseek");
    let prompts = prompts(384, 700);
    let pre = preemption_prompts();
    let big = 64 << 20;
    for dt in COMPRESSED {
        let base = run(
            &model,
            typed(dt, cfg(layout(1, 1, 1), 256, big)),
            &prompts,
            8,
        )
        .await;
        for (tp, dcp, i) in [(2, 2, 1), (4, 4, 2)] {
            let c = typed(dt, cfg(layout(tp, dcp, i), 256, big));
            let got = run(&model, c, &prompts, 8).await;
            assert_layout_same(&base, &got, &format!("MLA {dt} tp={tp} dcp={dcp} I={i}"));
        }
        // 3 layers × (32 + 8) latent values per token (and FP8's scale byte per row);
        // 20 blocks of 16 tokens per rank.
        let tight = (3 * dt.row_bytes(40) * 16 * 20) as u64;
        let base = run(&model, typed(dt, cfg(layout(1, 1, 1), 256, big)), &pre, 40).await;
        let c = typed(dt, cfg(layout(4, 2, 2), 256, tight));
        let (got, stats) = run_stats(&model, c, &pre, 40).await;
        assert!(
            stats.preemptions > 0,
            "{dt}: expected preemptions: {stats:?}"
        );
        assert_layout_same(&base, &got, &format!("MLA {dt} tp=4 dcp=2 I=2, preempted"));
    }
}

/// Prefix-cache hits on a compressed cache under DCP: requests sharing a 700-token
/// prefix, one after the other, equal the single rank without prefix caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_on_a_compressed_cache_equal_single_rank() {
    let model = fixture("tiny-deepseek");
    let prefix: Vec<u32> = (0..700).map(|j| (j * 37 % 380) as u32 + 3).collect();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend((0..5 + i * 11).map(|j| ((j * 13 + i) % 380) as u32 + 3));
            p
        })
        .collect();
    for dt in [KvCacheDType::BF16, KvCacheDType::Fp8E4M3] {
        let mut no_cache = typed(dt, cfg(layout(1, 1, 1), 256, 64 << 20));
        no_cache.enable_prefix_caching = false;
        let mut base = Vec::new();
        for p in &prompts {
            base.extend(run(&model, no_cache.clone(), std::slice::from_ref(p), 6).await);
        }
        let c = typed(dt, cfg(layout(4, 4, 2), 256, 64 << 20));
        let engine = dcpserve::Engine::builder(&model)
            .config(c)
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
            "{dt}: expected the shared prefix to hit, got {stats:?}"
        );
        assert_layout_same(&base, &got, &format!("{dt} prefix hits tp=4 dcp=4 I=2"));
    }
}

fn speculative(json: &str) -> SpeculativeConfig {
    let mut s = SpeculativeConfig::from_json(json).unwrap();
    s.adaptive = Some(false);
    s
}

/// Speculation on a compressed cache: MTP (its layer's latents in the same cache) at
/// tp=4 dcp=2 I=2 and a draft model (with its own cache of the same type) give plain
/// decoding's output with that cache type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_on_a_compressed_cache_equals_plain_decoding() {
    let mtp_model = fixture("tiny-deepseek-mtp");
    let prompts = prompts(384, 600);
    let kv = 32 << 20;
    for dt in [KvCacheDType::BF16, KvCacheDType::Fp8E4M3] {
        let base = run(
            &mtp_model,
            typed(dt, cfg(layout(1, 1, 1), 512, kv)),
            &prompts,
            24,
        )
        .await;
        let mut c = typed(dt, cfg(layout(4, 2, 2), 512, kv));
        c.speculative = Some(speculative(
            r#"{"method": "mtp", "num_speculative_tokens": 2}"#,
        ));
        let (got, stats) = run_stats(&mtp_model, c, &prompts, 24).await;
        assert!(stats.speculation.num_drafts > 0, "{dt}: no MTP drafts");
        assert_layout_same(&base, &got, &format!("{dt} MTP k=2 tp=4 dcp=2 I=2"));

        // tiny-llama drafting for itself on its own tp=1 group, target at tp=4 dcp=2.
        let llama = fixture("tiny-llama");
        let base = run(
            &llama,
            typed(dt, cfg(layout(1, 1, 1), 64, kv)),
            &prompts,
            24,
        )
        .await;
        let mut c = typed(dt, cfg(layout(4, 2, 1), 64, kv));
        c.speculative = Some(speculative(&format!(
            r#"{{"method": "draft_model", "model": "{}", "num_speculative_tokens": 3}}"#,
            llama.display()
        )));
        let (got, stats) = run_stats(&llama, c, &prompts, 24).await;
        assert!(stats.speculation.num_drafts > 0, "{dt}: no drafts");
        assert_layout_same(&base, &got, &format!("{dt} self-draft, target tp=4 dcp=2"));
    }
}

/// `auto` follows the compute dtype: float32 keeps a float32 cache (so every reference
/// test keeps its meaning), anything else gets bfloat16.
#[test]
fn auto_follows_the_compute_dtype() {
    let f32_cfg = f32_config();
    assert_eq!(f32_cfg.kv_cache_dtype, None);
    assert_eq!(f32_cfg.kv_cache_dtype(), KvCacheDType::F32);
    assert_eq!(EngineConfig::default().kv_cache_dtype(), KvCacheDType::BF16);
    let bf16 = EngineConfig {
        dtype: dcpserve::DType::Bfloat16,
        ..Default::default()
    };
    assert_eq!(bf16.kv_cache_dtype(), KvCacheDType::BF16);
}
