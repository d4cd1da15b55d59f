//! Step plans and the ranks' answers sent as bytes (`serialize_plans`), as they would
//! cross a process boundary: every output equals the in-process run's — greedy and
//! sampled tokens, their log-probabilities and prompt log-probabilities, penalties and
//! `min_tokens` — with DCP, overlapped micro-batches, preemption (recomputed sequences
//! are sent whole again) and speculative decoding with a sampled draft model (draft
//! distributions travel in the plan).

mod common;

use common::equivalence::{cfg, layout, preemption_prompts, TOL};
use common::*;
use dcpserve::TokenOutput;
use dcpserve::{Engine, EngineConfig, GenerationEvent, Prompt, SamplingParams, SpeculativeConfig};
use futures::StreamExt;

/// Every request of a run: each prompt with its own settings.
fn requests(prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, SamplingParams)> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut params = greedy(40);
            params.logprobs = Some(3);
            match i % 3 {
                0 => {}
                1 => {
                    params.temperature = 0.8;
                    params.top_p = 0.9;
                    params.seed = Some(i as u64);
                    params.presence_penalty = 0.5;
                    params.repetition_penalty = 1.2;
                }
                _ => {
                    params.temperature = 1.1;
                    params.top_k = 20;
                    params.frequency_penalty = 0.3;
                    params.min_tokens = 4;
                    params.ignore_eos = false;
                    params.stop_token_ids = vec![5];
                    params.prompt_logprobs = Some(2);
                }
            }
            (p.clone(), params)
        })
        .collect()
}

/// The tokens each request produced (submitted together so they are batched).
async fn outputs(
    model: &std::path::Path,
    cfg: EngineConfig,
    reqs: &[(Vec<u32>, SamplingParams)],
) -> (Vec<Vec<TokenOutput>>, u64) {
    let engine = Engine::builder(model)
        .config(cfg)
        .build()
        .await
        .expect("engine");
    let streams: Vec<_> = reqs
        .iter()
        .map(|(p, params)| engine.generate(Prompt::Tokens(p.clone()), params.clone()))
        .collect();
    let mut all = Vec::new();
    for s in streams {
        let mut s = s.expect("generate");
        let mut toks = Vec::new();
        while let Some(ev) = s.next().await {
            match ev.expect("event") {
                GenerationEvent::Token { token, .. } => toks.push(token),
                GenerationEvent::Finished { .. } => break,
            }
        }
        all.push(toks);
    }
    let stats = engine.stats().await.expect("stats");
    (all, stats.preemptions)
}

/// Same tokens; log-probabilities equal up to summation order (batches may be composed
/// differently from run to run).
fn assert_same_outputs(a: &[Vec<TokenOutput>], b: &[Vec<TokenOutput>], what: &str) {
    fn close(x: &TokenOutput, y: &TokenOutput, what: &str) {
        assert_eq!(x.token_id, y.token_id, "{what}");
        let (lx, ly) = (x.logprob.unwrap(), y.logprob.unwrap());
        assert!((lx - ly).abs() <= TOL, "{what}: logprob {lx} vs {ly}");
        assert_eq!(x.top_logprobs.len(), y.top_logprobs.len(), "{what}");
        for ((tx, lx), (ty, ly)) in x.top_logprobs.iter().zip(&y.top_logprobs) {
            if tx == ty {
                assert!((lx - ly).abs() <= TOL, "{what}: top {tx}");
            }
        }
        let none = Vec::new();
        let (px, py) = (
            x.prompt_logprobs.as_ref().unwrap_or(&none),
            y.prompt_logprobs.as_ref().unwrap_or(&none),
        );
        assert_eq!(px.len(), py.len(), "{what}: prompt logprobs");
        for (i, (u, v)) in px.iter().zip(py).enumerate() {
            close(u, v, &format!("{what}, prompt token {}", i + 1));
        }
    }
    assert_eq!(a.len(), b.len(), "{what}");
    for (p, (x, y)) in a.iter().zip(b).enumerate() {
        let ids = |t: &[TokenOutput]| t.iter().map(|t| t.token_id).collect::<Vec<_>>();
        assert_eq!(ids(x), ids(y), "{what}: request {p} tokens differ");
        for (i, (u, v)) in x.iter().zip(y).enumerate() {
            close(u, v, &format!("{what}: request {p} token {i}"));
        }
    }
}

fn wired(c: EngineConfig) -> EngineConfig {
    EngineConfig {
        serialize_plans: true,
        ..c
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_through_bytes_give_the_same_outputs() {
    let model = fixture("tiny-llama");
    let reqs = requests(&preemption_prompts());
    // Per rank at tp=4: 128 bytes per token; 20 blocks of 16 tokens under dcp=2 hold 640
    // tokens: six sequences of ~90 prompt tokens growing by 40 do not all fit.
    for (what, c) in [
        ("tp=1", cfg(layout(1, 1, 1), 256, 64 << 20)),
        (
            "tp=4 dcp=2 overlapped, preempting",
            EngineConfig {
                overlap_micro_batches: true,
                ..cfg(layout(4, 2, 2), 256, 128 * 16 * 20)
            },
        ),
    ] {
        let (base, _) = outputs(&model, c.clone(), &reqs).await;
        let (got, preemptions) = outputs(&model, wired(c), &reqs).await;
        assert_same_outputs(&base, &got, what);
        if what.contains("preempting") {
            assert!(preemptions > 0, "{what}: expected preemptions");
        }
        assert!(base.iter().all(|t| !t.is_empty()), "{what}: empty output");
        let prompt_scored = &base[2][0];
        assert!(
            prompt_scored
                .prompt_logprobs
                .as_ref()
                .is_some_and(|p| !p.is_empty()),
            "{what}: prompt logprobs missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_draft_model_through_bytes_gives_the_same_outputs() {
    let model = fixture("tiny-llama");
    let spec = SpeculativeConfig::from_json(&format!(
        r#"{{"method": "draft_model", "model": "{}", "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 2, "draft_decode_context_parallel_size": 1}}"#,
        fixture("tiny-qwen2").display()
    ))
    .unwrap();
    // A step budget that every prompt and every draft fit in together: with a tighter
    // one, how many drafts a request gets depends on which prefill chunks share its step,
    // that is on when the requests arrived, and its sampled tokens with it.
    let c = EngineConfig {
        speculative: Some(spec),
        ..cfg(layout(2, 1, 1), 256, 32 << 20)
    };
    let reqs = requests(&common::equivalence::prompts(384, 120));
    let (base, _) = outputs(&model, c.clone(), &reqs).await;
    let (got, _) = outputs(&model, wired(c), &reqs).await;
    assert_same_outputs(&base, &got, "sampled draft model");
}
