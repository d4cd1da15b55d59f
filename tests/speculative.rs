//! Speculative decoding: greedy output with drafts (n-gram lookup, a draft model) equals
//! plain decoding — same tokens, log-probabilities within the layout tolerance — across
//! tp / dcp / interleave layouts, GQA and MLA models, chunked prefill and preemption.

mod common;

use common::equivalence::{assert_same, assert_sampled_completions, cfg, layout, run_stats, Run};
use common::*;
use dcpserve::{EngineConfig, SpeculativeConfig};
use dcpserve_actors::SchedulerStats;

/// Prompts whose tails repeat earlier stretches, so that n-gram lookup finds drafts, and
/// one long prompt that is prefilled in chunks.
fn repetitive_prompts(vocab: u32, long: usize) -> Vec<Vec<u32>> {
    let tok = |j: usize, salt: usize| ((j * 131 + salt * 71) as u32 % (vocab - 3)) + 3;
    let motif = |salt: usize, len: usize| (0..len).map(move |j| tok(j, salt));
    vec![
        motif(1, 12).cycle().take(60).collect(),
        motif(2, 5).cycle().take(23).collect(),
        (0..long).map(|j| tok(j % 97, 3)).collect(),
        vec![7],
    ]
}

fn ngram(k: usize) -> SpeculativeConfig {
    SpeculativeConfig::from_json(&format!(
        r#"{{"method": "ngram", "num_speculative_tokens": {k}, "prompt_lookup_min": 1, "prompt_lookup_max": 3}}"#
    ))
    .unwrap()
}

fn with_spec(mut c: EngineConfig, spec: SpeculativeConfig) -> EngineConfig {
    c.speculative = Some(spec);
    c
}

/// Speculation really ran: drafts were verified and some stood; the histogram counts
/// every verification.
fn assert_speculated(stats: &SchedulerStats, what: &str) {
    let s = &stats.speculation;
    assert!(s.num_drafts > 0, "{what}: no drafts were verified");
    assert!(
        s.num_accepted_tokens > 0,
        "{what}: no draft token was accepted ({} drafted)",
        s.num_draft_tokens
    );
    assert!(s.num_accepted_tokens <= s.num_draft_tokens, "{what}");
    assert_eq!(
        s.accepted_histogram.iter().sum::<u64>(),
        s.num_drafts,
        "{what}: histogram"
    );
}

const N: usize = 40;
const KV: u64 = 32 << 20;

async fn plain(model: &str, prompts: &[Vec<u32>]) -> Run {
    run_stats(&fixture(model), cfg(layout(1, 1, 1), 64, KV), prompts, N)
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_greedy_equals_plain_decoding_on_gqa_layouts() {
    let prompts = repetitive_prompts(384, 700);
    let base = plain("tiny-llama", &prompts).await;
    // tiny-llama: 8 query / 2 KV heads, block size 16.
    for (tp, dcp, i) in [(1, 1, 1), (2, 1, 1), (4, 2, 1), (4, 2, 16), (8, 4, 2)] {
        let c = with_spec(cfg(layout(tp, dcp, i), 64, KV), ngram(4));
        let (got, stats) = run_stats(&fixture("tiny-llama"), c, &prompts, N).await;
        let what = format!("ngram tp={tp} dcp={dcp} I={i}");
        assert_same(&base, &got, &what);
        assert_speculated(&stats, &what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_greedy_equals_plain_decoding_under_preemption() {
    let prompts = repetitive_prompts(384, 700);
    let base = plain("tiny-llama", &prompts).await;
    // tiny-llama at tp=4 dcp=2: 2 layers × 1 KV head × 8 dims × 2 (K, V) × 4 bytes =
    // 128 bytes per token per rank; 24 blocks of 16 tokens per rank (768 tokens in all)
    // cannot hold every sequence at once.
    let c = with_spec(cfg(layout(4, 2, 1), 64, 128 * 16 * 24), ngram(4));
    let (got, stats) = run_stats(&fixture("tiny-llama"), c, &prompts, N).await;
    assert_same(&base, &got, "ngram with preemption");
    assert!(stats.preemptions > 0, "no preemption happened");
    assert_speculated(&stats, "ngram with preemption");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_greedy_equals_plain_decoding_on_mla() {
    let prompts = repetitive_prompts(384, 400);
    let base = plain("tiny-deepseek", &prompts).await;
    for (tp, dcp, i) in [(1, 1, 1), (2, 2, 1), (4, 2, 16)] {
        let c = with_spec(cfg(layout(tp, dcp, i), 64, KV), ngram(4));
        let (got, stats) = run_stats(&fixture("tiny-deepseek"), c, &prompts, N).await;
        let what = format!("MLA ngram tp={tp} dcp={dcp} I={i}");
        assert_same(&base, &got, &what);
        assert_speculated(&stats, &what);
    }
}

fn draft_model(model: &str, k: usize, tp: usize, dcp: usize) -> SpeculativeConfig {
    SpeculativeConfig::from_json(&format!(
        r#"{{"method": "draft_model", "model": "{}", "num_speculative_tokens": {k},
            "draft_tensor_parallel_size": {tp}, "draft_decode_context_parallel_size": {dcp}}}"#,
        fixture(model).display()
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_greedy_equals_plain_decoding() {
    let prompts = repetitive_prompts(384, 300);
    let base = plain("tiny-llama", &prompts).await;

    // The target drafting for itself: every greedy draft stands (adaptation off, so the
    // draft length stays at k).
    let mut same = draft_model("tiny-llama", 3, 1, 1);
    same.adaptive = Some(false);
    let c = with_spec(cfg(layout(2, 1, 1), 64, KV), same);
    let (got, stats) = run_stats(&fixture("tiny-llama"), c, &prompts, N).await;
    assert_same(&base, &got, "self-draft");
    assert_speculated(&stats, "self-draft");
    let s = &stats.speculation;
    assert_eq!(
        s.num_accepted_tokens, s.num_draft_tokens,
        "self-draft rejected tokens"
    );

    // A different model with the same vocabulary, on its own tp=4 dcp=2 group, for a
    // target at tp=4 dcp=2 I=16: most drafts fail, the output must not change.
    let c = with_spec(
        cfg(layout(4, 2, 16), 64, KV),
        draft_model("tiny-qwen2", 3, 4, 2),
    );
    let (got, stats) = run_stats(&fixture("tiny-llama"), c, &prompts, N).await;
    assert_same(&base, &got, "tiny-qwen2 drafting for tiny-llama");
    assert!(stats.speculation.num_drafts > 0, "no drafts verified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_greedy_equals_plain_decoding_on_mla() {
    let prompts = repetitive_prompts(384, 300);
    let base = plain("tiny-deepseek", &prompts).await;
    // The MLA target at tp=4 dcp=4 I=2, drafted by the other tiny DeepSeek (plain q_proj)
    // on its own tp=2 dcp=2 group.
    let c = with_spec(
        cfg(layout(4, 4, 2), 64, KV),
        draft_model("tiny-deepseek-noq", 3, 2, 2),
    );
    let (got, stats) = run_stats(&fixture("tiny-deepseek"), c, &prompts, N).await;
    assert_same(&base, &got, "tiny-deepseek-noq drafting for tiny-deepseek");
    assert!(stats.speculation.num_drafts > 0, "no drafts verified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_greedy_equals_plain_decoding_on_the_default_model() {
    use dcpserve::{Engine, Prompt};
    let model = default_model();
    let text = "Copy this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, \
                figs, dates, melons. Again: apples, pears, plums, cherries, grapes, lemons,";
    let run = |c: EngineConfig| {
        let model = model.clone();
        async move {
            let engine = Engine::builder(&model)
                .config(c)
                .build()
                .await
                .expect("engine");
            let mut p = greedy(32);
            p.logprobs = Some(1);
            let out = engine
                .complete(Prompt::Text(text.into()), p)
                .await
                .expect("completion");
            (out, engine.stats().await.expect("stats"))
        }
    };
    let (base, _) = run(f32_config()).await;
    for (tp, dcp) in [(1, 1), (9, 3)] {
        let c = EngineConfig {
            parallel: layout(tp, dcp, 1),
            ..with_spec(f32_config(), ngram(4))
        };
        let (got, stats) = run(c).await;
        let what = format!("default model tp={tp} dcp={dcp}");
        assert_eq!(base.token_ids, got.token_ids, "{what}");
        assert_speculated(&stats, &what);
    }
    // The default model drafting for itself (tp=3), the draft on one rank: every greedy
    // draft stands.
    let mut own = SpeculativeConfig::from_json(&format!(
        r#"{{"method": "draft_model", "model": "{}", "num_speculative_tokens": 3}}"#,
        model.display()
    ))
    .unwrap();
    own.adaptive = Some(false);
    let c = EngineConfig {
        parallel: layout(3, 1, 1),
        ..with_spec(f32_config(), own)
    };
    let (got, stats) = run(c).await;
    assert_eq!(base.token_ids, got.token_ids, "default model, draft_model");
    assert_speculated(&stats, "default model, draft_model");
    let s = &stats.speculation;
    assert_eq!(
        s.num_accepted_tokens, s.num_draft_tokens,
        "self-draft rejected tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_run_with_drafts() {
    use dcpserve::Engine;
    let c = with_spec(cfg(layout(4, 2, 1), 64, KV), ngram(4));
    let engine = Engine::builder(fixture("tiny-llama"))
        .config(c)
        .build()
        .await
        .unwrap();
    assert_sampled_completions(&engine, &repetitive_prompts(384, 50), 0.7, N).await;
    assert!(engine.stats().await.unwrap().speculation.num_drafts > 0);
}

/// A draft-model rank that fails mid-generation takes down only the draft model's rank
/// group: its proposer tears the group down and starts a new one, that step decodes
/// without drafts, the output does not change, and drafting resumes on the new group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_draft_rank_restarts_only_the_draft_group() {
    use futures::StreamExt;
    let prompt = repetitive_prompts(384, 300).swap_remove(0);
    let n = 60;
    let base = run_stats(
        &fixture("tiny-llama"),
        cfg(layout(1, 1, 1), 64, KV),
        std::slice::from_ref(&prompt),
        n,
    )
    .await
    .0;
    // The target drafting for itself on a tp=2 group: every greedy draft stands.
    let mut same = draft_model("tiny-llama", 3, 2, 1);
    same.adaptive = Some(false);
    let c = with_spec(cfg(layout(1, 1, 1), 64, KV), same);
    let engine = dcpserve::Engine::builder(fixture("tiny-llama"))
        .config(c)
        .build()
        .await
        .expect("engine");
    let mut params = greedy(n);
    params.logprobs = Some(5);
    let mut s = engine
        .generate(dcpserve::Prompt::Tokens(prompt), params)
        .expect("generate");
    let mut got = Vec::new();
    let mut before = None;
    while let Some(ev) = tokio::time::timeout(std::time::Duration::from_secs(60), s.next())
        .await
        .expect("the request must not hang")
    {
        // A restart of the target's group would end the request with an error.
        match ev.expect("no error reaches the request") {
            dcpserve::GenerationEvent::Token { token, .. } => got.push(token),
            dcpserve::GenerationEvent::Finished { .. } => break,
        }
        if got.len() == 12 && before.is_none() {
            before = Some(engine.stats().await.expect("stats").speculation);
            engine.inject_draft_rank_fault(1).unwrap();
        }
    }
    assert_same(&base, &vec![got], "draft rank failure");
    let before = before.expect("the fault was injected");
    let after = engine.stats().await.expect("stats");
    assert!(
        after.speculation.num_accepted_tokens > before.num_accepted_tokens,
        "drafting must resume on the new draft group ({before:?} -> {:?})",
        after.speculation
    );
}
