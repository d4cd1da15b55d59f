//! The default model (SmolLM2-135M-Instruct, GGUF Q4_1) against Hugging Face
//! transformers' float32 logits on the same GGUF (fixtures/smollm2, made by
//! scripts/make_references.py).

mod common;

use common::*;
use dcpserve::{ChatMessage, DType, Engine, EngineConfig, Prompt};
use dcpserve_kernels::{log_softmax, CpuBackend};
use dcpserve_model::arch::{BatchInput, DecoderModel, WeightPrecision};
use dcpserve_model::ModelFiles;

const TOL: f32 = 5e-3;

#[test]
fn logits_match_transformers() {
    let files = ModelFiles::open(default_model()).expect("open default model");
    let model = DecoderModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .expect("load weights");
    let reference = read_json(fixture("smollm2/logits.json"));
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids = ids(&prompt["ids"]);
        let n = ids.len();
        let block = 16;
        let mut cache = model
            .new_kv_cache(n.div_ceil(block), block)
            .expect("KV cache");
        let table: Vec<u32> = (0..n.div_ceil(block) as u32).rev().collect();
        let positions: Vec<usize> = (0..n).collect();
        let slots: Vec<usize> = positions
            .iter()
            .map(|&p| table[p / block] as usize * block + p % block)
            .collect();
        let kv_lens: Vec<u32> = (1..=n as u32).collect();
        let out = model
            .forward(
                &BatchInput {
                    tokens: &ids,
                    positions: &positions,
                    token_seq: &vec![0; n],
                    slots: &slots,
                    kv_lens: &kv_lens,
                    block_tables: &[table.as_slice()],
                    logits_for: &positions,
                },
                &mut cache,
            )
            .expect("forward");
        let v = out.vocab_size;
        let mut worst = 0.0f32;
        for pos in 0..n {
            let lp = log_softmax(&out.logits[pos * v..(pos + 1) * v]);
            let top_ids = ids_of(&prompt["top_ids"][pos]);
            let top_lp = floats(&prompt["top_logprobs"][pos]);
            let ours_top = dcpserve_kernels::argmax(&lp);
            assert_eq!(
                ours_top, top_ids[0],
                "{}: top-1 differs at position {pos}",
                prompt["name"]
            );
            for (&t, &want) in top_ids.iter().zip(&top_lp) {
                worst = worst.max((lp[t as usize] - want).abs());
            }
            if pos + 1 < n {
                let want = prompt["next_logprob"][pos].as_f64().unwrap() as f32;
                worst = worst.max((lp[ids[pos + 1] as usize] - want).abs());
            }
        }
        assert!(
            worst <= TOL,
            "{}: max |Δ logprob| = {worst}",
            prompt["name"]
        );
    }
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    ids(v)
}

async fn chat_answer(dtype: DType) -> (Vec<u32>, String) {
    let cfg = EngineConfig {
        dtype,
        ..f32_config()
    };
    let engine = Engine::from_path(default_model(), cfg)
        .await
        .expect("engine");
    let messages = vec![ChatMessage {
        role: "user".into(),
        content: "What is the capital of France?".into(),
    }];
    let reference = read_json(fixture("smollm2/chat.json"));
    let prompt_ids = engine
        .encode_prompt(&Prompt::Chat(messages.clone()))
        .expect("template");
    assert_eq!(
        prompt_ids,
        ids(&reference["prompt_ids"]),
        "chat template + tokenizer"
    );
    let mut params = greedy(20);
    params.ignore_eos = false;
    let out = engine
        .complete(Prompt::Chat(messages), params)
        .await
        .expect("complete");
    (out.token_ids, out.text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_paris_in_float32() {
    let reference = read_json(fixture("smollm2/chat.json"));
    let (ids, text) = chat_answer(DType::Float32).await;
    assert!(
        text.starts_with("The capital of France is Paris."),
        "got {text:?}"
    );
    assert_eq!(ids, common::ids(&reference["generated_ids"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_paris_with_quantized_weights() {
    let (_, text) = chat_answer(DType::Auto).await;
    assert!(
        text.starts_with("The capital of France is Paris."),
        "got {text:?}"
    );
}
