//! Speculative decoding with DeepSeek-V3's multi-token-prediction layer (method `mtp`,
//! fixtures/tiny-deepseek-mtp): greedy output equals plain decoding — same tokens,
//! log-probabilities within the layout tolerance — across tp / dcp / interleave layouts,
//! with a long prompt prefilled in chunks, chained drafts and preemption; and `mtp` is
//! refused where it cannot run. The MTP layer itself is checked against the torch
//! reference in tests/mtp_model.rs.

mod common;

use common::equivalence::{
    assert_same, assert_sampled_completions, cfg, layout, pcp_layout, preemption_prompts, prompts,
    run_stats, Run,
};
use common::*;
use dcpserve::{EngineConfig, SpeculativeConfig};
use dcpserve_actors::SchedulerStats;

const MODEL: &str = "tiny-deepseek-mtp";
const N: usize = 24;
const KV: u64 = 32 << 20;

/// `mtp` with `k` tokens; adaptation off so that every decoding step drafts (the random
/// MTP head rarely agrees with the target, and adaptation would pause it).
fn mtp(k: usize) -> SpeculativeConfig {
    let mut s = SpeculativeConfig::from_json(&format!(
        r#"{{"method": "mtp", "num_speculative_tokens": {k}}}"#
    ))
    .unwrap();
    s.adaptive = Some(false);
    s
}

fn with_spec(mut c: EngineConfig, spec: SpeculativeConfig) -> EngineConfig {
    c.speculative = Some(spec);
    c
}

/// Drafts were verified, at most `k` per verification, and the histogram counts each.
fn assert_drafted(stats: &SchedulerStats, k: usize, what: &str) {
    let s = &stats.speculation;
    assert!(s.num_drafts > 0, "{what}: no drafts were verified");
    assert!(s.num_draft_tokens <= s.num_drafts * k as u64, "{what}");
    assert!(s.num_accepted_tokens <= s.num_draft_tokens, "{what}");
    assert_eq!(
        s.accepted_histogram.iter().sum::<u64>(),
        s.num_drafts,
        "{what}: histogram"
    );
    eprintln!(
        "{what}: {} verifications, {} drafted, {} accepted, histogram {:?}",
        s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.accepted_histogram
    );
}

async fn plain(prompts: &[Vec<u32>], c: EngineConfig) -> Run {
    run_stats(&fixture(MODEL), c, prompts, N).await.0
}

/// tp ∈ {1, 2, 4}, dcp ∈ {1, 2, 4}, interleave 1, 2 and the block size (16), with one and
/// two (chained) drafts, on prompts of 1, 7, 40 and 3,000 tokens (the long one prefilled
/// in chunks of 512).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_greedy_equals_plain_decoding_across_layouts() {
    let prompts = prompts(384, 3000);
    let base = plain(&prompts, cfg(layout(1, 1, 1), 512, KV)).await;
    let cases = [
        (1, 1, 1, 1),
        (1, 1, 1, 2),
        (2, 1, 1, 1),
        (2, 2, 1, 2),
        (4, 2, 2, 1),
        (4, 4, 1, 2),
        (4, 4, 16, 2),
    ];
    for (tp, dcp, i, k) in cases {
        let c = with_spec(cfg(layout(tp, dcp, i), 512, KV), mtp(k));
        let (got, stats) = run_stats(&fixture(MODEL), c, &prompts, N).await;
        let what = format!("mtp k={k} tp={tp} dcp={dcp} I={i}");
        assert_same(&base, &got, &what);
        assert_drafted(&stats, k, &what);
    }
    // Prefill context parallelism: the MTP layer drafts from hidden states gathered from
    // the copies that computed them, its own latents placed over pcp·dcp ranks.
    for (tp, pcp, dcp, k) in [(2, 2, 2, 2), (1, 2, 1, 1)] {
        let c = with_spec(cfg(pcp_layout(tp, pcp, dcp, 1), 512, KV), mtp(k));
        let (got, stats) = run_stats(&fixture(MODEL), c, &prompts, N).await;
        let what = format!("mtp k={k} tp={tp} pcp={pcp} dcp={dcp}");
        assert_same(&base, &got, &what);
        assert_drafted(&stats, k, &what);
    }
}

/// Preemption by recompute under DCP, with chained drafts: prompts that fit together but
/// whose growth does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_greedy_equals_plain_decoding_under_preemption() {
    let prompts = preemption_prompts();
    let n = 40;
    let base = run_stats(&fixture(MODEL), cfg(layout(1, 1, 1), 256, KV), &prompts, n)
        .await
        .0;
    // Per rank: (3 layers + the MTP layer) × (32 + 8) latent values × 4 bytes = 640 bytes
    // per token; 20 blocks of 16 tokens per rank hold 640 tokens under dcp=2.
    let tight = 640 * 16 * 20;
    let c = with_spec(cfg(layout(4, 2, 2), 256, tight), mtp(2));
    let (got, stats) = run_stats(&fixture(MODEL), c, &prompts, n).await;
    assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
    assert_same(&base, &got, "mtp with preemption");
    assert_drafted(&stats, 2, "mtp with preemption");
}

/// Which input the rewired MTP layer of [`echo_model`] passes through.
#[derive(Debug, Clone, Copy)]
enum Echo {
    /// `eh_proj = [0 | I]`: the previous hidden state.
    Hidden,
    /// `eh_proj = [I | 0]` and `shared_head.head` = the embedding: the token.
    Token,
}

/// tiny-deepseek-mtp with its MTP layer rewired to echo: `hnorm`, `enorm` and
/// `shared_head.norm` weights 1, the decoder layer's `o_proj` and every MLP `down_proj`
/// zero (the layer adds nothing), and `eh_proj` selecting one half of its input.
/// - [`Echo::Hidden`]: the draft logits at position `i` are `lm_head(h_i / rms(h_i))`, a
///   positive multiple of the target's logits there, so the draft is the target's own
///   choice at `i = L - 2`: the last token.
/// - [`Echo::Token`]: the draft logits are `E · e / rms(e)` for the embedding `e` of the
///   token fed at `i` (`t_{L-1}`), whose maximum is that token itself (checked).
///
/// Either way every draft (chained ones too) repeats the last token and is accepted
/// exactly when greedy decoding repeats a token — which holds only if the engine feeds
/// the final-normed hidden state of the right position and the right token.
fn echo_model(kind: Echo, tag: &str) -> std::path::PathBuf {
    use safetensors::{serialize_to_file, Dtype, SafeTensors};
    let src = fixture(MODEL);
    let dir = std::env::temp_dir().join(format!(
        "dcpserve-mtp-echo-{kind:?}-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let embed = st
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .data()
        .to_vec();
    if let Echo::Token = kind {
        assert_self_argmax(
            &embed,
            st.tensor("model.embed_tokens.weight").unwrap().shape(),
        );
    }
    let p = "model.layers.3.";
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "{name}");
        let shape = view.shape().to_vec();
        let n: usize = shape.iter().product();
        let mut data = view.data().to_vec();
        let fill = |data: &mut Vec<u8>, f: &dyn Fn(usize) -> f32| {
            *data = (0..n).flat_map(|i| f(i).to_le_bytes()).collect();
        };
        if let Some(rest) = name.strip_prefix(p) {
            if rest == "eh_proj.weight" {
                let (h, w) = (shape[0], shape[1]);
                let offset = match kind {
                    Echo::Hidden => h,
                    Echo::Token => 0,
                };
                fill(&mut data, &|i| f32::from(i % w == offset + i / w));
            } else if rest == "shared_head.head.weight" && matches!(kind, Echo::Token) {
                data = embed.clone();
            } else if rest.ends_with("norm.weight") && !rest.contains("self_attn") {
                fill(&mut data, &|_| 1.0);
            } else if rest == "self_attn.o_proj.weight" || rest.ends_with("down_proj.weight") {
                fill(&mut data, &|_| 0.0);
            }
        }
        out.push((name, shape, data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, s, d)| {
            let v = safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), d).unwrap();
            (n.clone(), v)
        })
        .collect();
    serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// Every token's embedding has its largest dot product with itself.
fn assert_self_argmax(embed: &[u8], shape: &[usize]) {
    let (v, h) = (shape[0], shape[1]);
    let e: Vec<f32> = embed
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let dot = |a: usize, b: usize| -> f32 { (0..h).map(|j| e[a * h + j] * e[b * h + j]).sum() };
    for t in 0..v {
        let own = dot(t, t);
        let other = (0..v)
            .filter(|&u| u != t)
            .map(|u| dot(u, t))
            .fold(f32::MIN, f32::max);
        assert!(own > other + 1e-3, "token {t}: {own} vs {other}");
    }
}

/// Verifications and accepted drafts greedy decoding of `out` (N tokens) must show when
/// every draft is `k` copies of the last token (no adaptation): a step after token `i`
/// drafts `min(k, tokens left - 1)` tokens; the leading ones equal to `out[i]` stand.
fn echo_expectation(out: &[u32], k: usize) -> (u64, u64, u64) {
    let (mut verifications, mut drafted, mut accepted) = (0, 0, 0);
    let mut i = 0;
    while i + 1 < out.len() {
        let kk = k.min(out.len() - (i + 1) - 1);
        if kk == 0 {
            i += 1;
            continue;
        }
        let a = (1..=kk).take_while(|&j| out[i + j] == out[i]).count();
        verifications += 1;
        drafted += kk as u64;
        accepted += a as u64;
        i += a + 1;
    }
    (verifications, drafted, accepted)
}

/// With the echoing MTP layer, acceptance is predicted exactly from the greedy output
/// (the tiny target repeats tokens now and then), at one and two drafts, on one rank and
/// under tp=4 dcp=2 I=2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoing_mtp_drafts_the_last_token() {
    for kind in [Echo::Hidden, Echo::Token] {
        echo_case(kind).await;
    }
}

async fn echo_case(kind: Echo) {
    let model = echo_model(kind, "layouts");
    // No prompt length is a multiple of the block size (16): the first chained draft
    // needs the slot of position L - 1, which the scheduler has not allocated yet when a
    // prompt fills its last block exactly (the proposer then drafts one token).
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            (0..5 + 10 * i)
                .map(|j| ((j * 131 + i * 71) % 381) as u32 + 3)
                .collect()
        })
        .collect();
    let base = run_stats(&model, cfg(layout(1, 1, 1), 512, KV), &prompts, N)
        .await
        .0;
    let mut want = (0, 0, 0);
    for out in &base {
        let ids: Vec<u32> = out.iter().map(|t| t.token_id).collect();
        assert_eq!(ids.len(), N);
        let e = echo_expectation(&ids, 1);
        want = (want.0 + e.0, want.1 + e.1, want.2 + e.2);
    }
    assert!(
        want.2 > 0,
        "the greedy outputs never repeat a token: {base:?}"
    );
    for (tp, dcp, i, k) in [(1, 1, 1, 1), (4, 2, 2, 1), (1, 1, 1, 2), (4, 2, 2, 2)] {
        let c = with_spec(cfg(layout(tp, dcp, i), 512, KV), mtp(k));
        let (got, stats) = run_stats(&model, c, &prompts, N).await;
        let what = format!("echo {kind:?} k={k} tp={tp} dcp={dcp} I={i}");
        assert_same(&base, &got, &what);
        let mut want = (0, 0, 0);
        for out in &base {
            let ids: Vec<u32> = out.iter().map(|t| t.token_id).collect();
            let e = echo_expectation(&ids, k);
            want = (want.0 + e.0, want.1 + e.1, want.2 + e.2);
        }
        let s = &stats.speculation;
        assert_eq!(
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens),
            want,
            "{what}: (verifications, drafted, accepted)"
        );
        assert_drafted(&stats, k, &what);
    }
    let _ = std::fs::remove_dir_all(&model);
}

async fn refusal(model: &str, c: EngineConfig) -> String {
    match dcpserve::Engine::builder(fixture(model))
        .config(c)
        .build()
        .await
    {
        Ok(_) => panic!("{model}: mtp accepted"),
        Err(e) => format!("{e:#}"),
    }
}

/// A model without MTP weights (tiny-deepseek's config declares
/// `num_nextn_predict_layers: 1` but its checkpoint has no layer 3; tiny-llama is not
/// DeepSeek at all) and overlapped micro-batches are refused with clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_is_refused_where_it_cannot_run() {
    for model in ["tiny-deepseek", "tiny-llama"] {
        let err = refusal(model, with_spec(f32_config(), mtp(1))).await;
        assert!(
            err.contains("needs a model with a multi-token-prediction layer"),
            "{model}: {err}"
        );
    }
    let mut c = with_spec(f32_config(), mtp(1));
    c.overlap_micro_batches = true;
    let err = refusal(MODEL, c).await;
    assert!(err.contains("overlapped micro-batches"), "{err}");
}

/// A failed rank takes the group down and up again: the in-flight request ends with an
/// error, and afterwards the MTP proposer drafts on the new group (acceptance of the
/// echoing layer again exactly as predicted) with unchanged output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_drafts_again_after_a_rank_group_restart() {
    use dcpserve::{Engine, Prompt};
    use std::time::Duration;
    let model = echo_model(Echo::Hidden, "restart");
    let prompt: Vec<u32> = (0..45)
        .map(|j| ((j * 131 + 3 * 71) % 381) as u32 + 3)
        .collect();
    let base = run_stats(
        &model,
        cfg(layout(1, 1, 1), 512, KV),
        std::slice::from_ref(&prompt),
        N,
    )
    .await
    .0;
    let want: Vec<u32> = base[0].iter().map(|t| t.token_id).collect();
    let engine = Engine::builder(&model)
        .config(with_spec(cfg(layout(2, 2, 1), 512, KV), mtp(1)))
        .build()
        .await
        .unwrap();
    fail_rank_during_generation(&engine, prompt.clone(), 3, 1).await;
    // Wait for the new group with a request that never drafts (one token).
    let mut up = false;
    for _ in 0..200 {
        if engine
            .complete(Prompt::Tokens(vec![5, 6, 7]), greedy(1))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "serving did not resume");
    let before = engine.stats().await.unwrap().speculation;
    let got = engine
        .complete(Prompt::Tokens(prompt.clone()), greedy(N))
        .await
        .unwrap()
        .token_ids;
    assert_eq!(got, want, "output after the restart");
    let after = engine.stats().await.unwrap().speculation;
    let e = echo_expectation(&want, 1);
    assert_eq!(
        (
            after.num_drafts - before.num_drafts,
            after.num_draft_tokens - before.num_draft_tokens,
            after.num_accepted_tokens - before.num_accepted_tokens,
        ),
        e,
        "drafting after the restart"
    );
    let _ = std::fs::remove_dir_all(&model);
}

/// Sampled requests draft from the MTP distribution and verify by rejection sampling:
/// they run to their length with drafts verified (the distribution itself is the
/// scheduler's rejection sampler's business, tested with the other methods).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_run_with_mtp_drafts() {
    use dcpserve::Engine;
    let c = with_spec(cfg(layout(2, 2, 1), 64, KV), mtp(2));
    let engine = Engine::builder(fixture(MODEL))
        .config(c)
        .build()
        .await
        .unwrap();
    assert_sampled_completions(&engine, &prompts(384, 100), 0.8, N).await;
    let stats = engine.stats().await.unwrap();
    assert_drafted(&stats, 2, "sampled mtp");
}
