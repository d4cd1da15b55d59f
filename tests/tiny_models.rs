//! Tiny random Llama / Qwen2 / Qwen3 models against Hugging Face transformers' logits
//! (fixtures made by scripts/make_references.py), in float32.

mod common;

use common::*;
use dcpserve::{Engine, Prompt};
use dcpserve_kernels::{log_softmax, ThreadPool};
use dcpserve_model::arch::{BatchInput, DecoderModel, WeightPrecision};
use dcpserve_model::ModelFiles;

const TOL: f32 = 1e-3;

/// Runs `ids` through the model in chunks of `chunk` tokens (chunked prefill over a
/// paged cache with a shuffled block table) and returns log-probs at every position.
fn logprobs_chunked(model: &DecoderModel, ids: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let block = 4;
    let n_blocks = ids.len().div_ceil(block) + 1;
    let mut cache = model.new_kv_cache(n_blocks * 2, block);
    // Shuffled, non-contiguous physical blocks.
    let table: Vec<u32> = (0..n_blocks as u32)
        .map(|b| (b * 7 + 3) % (n_blocks as u32 * 2))
        .collect();
    let pool = ThreadPool::new(2);
    let mut rows = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        let end = (start + chunk).min(ids.len());
        let positions: Vec<usize> = (start..end).collect();
        let slots: Vec<usize> = positions
            .iter()
            .map(|&p| table[p / block] as usize * block + p % block)
            .collect();
        let kv_lens: Vec<u32> = positions.iter().map(|&p| p as u32 + 1).collect();
        let token_seq = vec![0u32; end - start];
        let tables = [table.as_slice()];
        let logits_for: Vec<usize> = (0..end - start).collect();
        let out = model
            .forward(
                &pool,
                &BatchInput {
                    tokens: &ids[start..end],
                    positions: &positions,
                    token_seq: &token_seq,
                    slots: &slots,
                    kv_lens: &kv_lens,
                    block_tables: &tables,
                    logits_for: &logits_for,
                },
                &mut cache,
            )
            .expect("forward");
        for r in 0..end - start {
            rows.push(log_softmax(
                &out.logits[r * out.vocab_size..(r + 1) * out.vocab_size],
            ));
        }
        start = end;
    }
    rows
}

fn check_logprobs(name: &str) {
    let dir = fixture(name);
    let reference = read_json(dir.join("reference.json"));
    let files = ModelFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = DecoderModel::load(
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids = ids(&prompt["ids"]);
        let positions: Vec<usize> = prompt["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as usize)
            .collect();
        for chunk in [ids.len(), 5] {
            let ours = logprobs_chunked(&model, &ids, chunk);
            let mut worst = 0.0f32;
            for (row, &pos) in prompt["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .zip(&positions)
            {
                for (a, b) in floats(row).iter().zip(&ours[pos]) {
                    worst = worst.max((a - b).abs());
                }
            }
            assert!(
                worst <= TOL,
                "{name}, prompt {} (len {}), chunk {chunk}: max |Δ logprob| = {worst}",
                prompt["name"],
                ids.len()
            );
        }
    }
}

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
