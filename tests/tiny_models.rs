//! Tiny random Llama / Qwen2 / Qwen3 models against Hugging Face transformers' logits
//! (fixtures made by scripts/make_references.py), in float32.

mod common;

use common::reference::check_logprobs;
use common::*;
use dcpserve::{Engine, Prompt};

#[test]
fn tiny_llama_matches_transformers() {
    check_logprobs("tiny-llama");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_logprobs("tiny-qwen2");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_logprobs("tiny-qwen3");
}

/// Greedy continuations of all prompts, served concurrently through the actor path,
/// equal transformers' up to the first near-tie in the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_models_greedy_through_the_engine() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3"] {
        let reference = read_json(fixture(name).join("reference.json"));
        let engine = Engine::from_path(fixture(name), f32_config())
            .await
            .expect(name);
        let prompts = reference["prompts"].as_array().unwrap();
        let mut streams = Vec::new();
        for p in prompts {
            let want = ids(&p["greedy"]);
            let fut = engine.complete(Prompt::Tokens(ids(&p["ids"])), greedy(want.len()));
            streams.push(fut);
        }
        let outs = futures::future::join_all(streams).await;
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
