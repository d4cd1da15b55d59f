//! K-quant versions of the default model, made by `dcpserve quantize`'s library
//! function from the shipped Q4_1 file into `target/tmp` at test time. Their prompt
//! logprobs stay close to the Q8_0 version's (same source weights, 8-bit
//! re-quantization: the closest to the source), and the Q5_K_M and Q6_K versions answer
//! the capital-of-France chat with Paris.
//!
//! The Q4_K_M version's greedy answer is printed, not asserted: this 135M model's first
//! answer token ("The" vs "L'") flips under small perturbations of the weights or the
//! arithmetic. Measured on 2026-12-01: our Q4_K_M (mostly Q5_0, since the hidden size
//! 576 is not a multiple of 256) answers in French; so does llama.cpp's own Q4_K_M
//! made by `llama-quantize --allow-requantize` from the same Q4_1 file, run by this
//! engine ("L'Étoile (The City of Light) is the capital of France"); and llama.cpp
//! itself on the shipped Q4_1 file (int8 activations) answers "L'Étoile, la
//! Marseillaise, …". The answer's teacher-forced logprob is compared instead.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use common::prefill::prompt_logprobs;
use common::*;
use dcpserve::{ChatMessage, DType, Engine, EngineConfig, Prompt};
use dcpserve_kernels::{CpuBackend, CpuMatmul, KvCacheDType};
use dcpserve_model::arch::{DecoderModel, WeightPrecision};
use dcpserve_model::gguf::quantize_gguf;
use dcpserve_model::{GgufFile, ModelFiles};

/// Re-quantizes the default model to `target` once per test process.
fn quantized(target: &str) -> PathBuf {
    static DONE: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap();
    let map = done.get_or_insert_with(HashMap::new);
    if let Some(p) = map.get(target) {
        return p.clone();
    }
    let src = GgufFile::open(default_model()).expect("open default model");
    let (bytes, report) = quantize_gguf(&src, target.parse().unwrap()).expect("quantize");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("SmolLM2-135M-Instruct.{target}.gguf"));
    std::fs::write(&path, bytes).expect("write quantized model");
    println!("{target}: {:?}", report.by_type);
    map.insert(target.to_string(), path.clone());
    path
}

fn load(path: &PathBuf) -> DecoderModel<CpuBackend> {
    let files = ModelFiles::open(path).expect("open quantized model");
    DecoderModel::load(
        CpuBackend::new(2).with_cpu_matmul(CpuMatmul::F32),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::Auto,
    )
    .expect("load weights")
}

/// Largest |Δ logprob| over each position's 5 most likely tokens (by `base`) and the
/// prompt's next token, and the share of positions whose top-1 agrees.
fn deviation(base: &[Vec<f32>], other: &[Vec<f32>], ids: &[u32]) -> (f32, usize) {
    let mut worst = 0.0f32;
    let mut agree = 0;
    for (pos, (a, b)) in base.iter().zip(other).enumerate() {
        let mut order: Vec<usize> = (0..a.len()).collect();
        order.select_nth_unstable_by(5, |&i, &j| a[j].total_cmp(&a[i]));
        let mut toks: Vec<usize> = order[..5].to_vec();
        if let Some(&next) = ids.get(pos + 1) {
            toks.push(next as usize);
        }
        for t in toks {
            worst = worst.max((a[t] - b[t]).abs());
        }
        agree += usize::from(dcpserve_kernels::argmax(a) == dcpserve_kernels::argmax(b));
    }
    (worst, agree)
}

/// Prompt logprobs of the K-quant versions against the Q8_0 version's, on the fixture
/// prompts (chat, paragraph, code) and the chat prompt followed by the reference answer
/// "The capital of France is Paris." (176 positions): the largest |Δ logprob| over each
/// position's 5 most likely tokens and the next token, the top-1 agreement, and the
/// answer's total logprob. The bounds are the measured values (printed) with room, per
/// type; a wrong block layout or kernel moves logprobs by whole units everywhere and
/// flips most top-1 choices.
#[test]
fn k_quant_prompt_logprobs_are_close_to_q8_0() {
    let bounds = [
        ("Q6_K", BOUND_Q6_K),
        ("Q5_K_M", BOUND_Q5_K_M),
        ("Q4_K_M", BOUND_Q4_K_M),
    ];
    let base = load(&quantized("Q8_0"));
    let reference = read_json(fixture("smollm2/logits.json"));
    let mut seqs: Vec<Vec<u32>> = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["ids"]))
        .collect();
    let chat = read_json(fixture("smollm2/chat.json"));
    let prompt_len = ids(&chat["prompt_ids"]).len();
    let mut answer = ids(&chat["prompt_ids"]);
    answer.extend(ids(&chat["generated_ids"]));
    seqs.push(answer.clone());
    let answer_logprob = |lps: &[Vec<f32>]| -> f32 {
        (prompt_len - 1..answer.len() - 1)
            .map(|pos| lps[pos][answer[pos + 1] as usize])
            .sum()
    };
    let base_lps: Vec<_> = seqs.iter().map(|p| prompt_logprobs(&base, p)).collect();
    let base_answer = answer_logprob(&base_lps[seqs.len() - 1]);
    println!("Q8_0: answer logprob {base_answer:.4}");
    let mut results = Vec::new();
    for (target, (max_delta, min_agree, max_answer_delta)) in bounds {
        let model = load(&quantized(target));
        let (mut worst, mut agree, mut positions) = (0.0f32, 0, 0);
        let mut answer_lp = 0.0;
        for (p, b) in seqs.iter().zip(&base_lps) {
            let lps = prompt_logprobs(&model, p);
            let (w, a) = deviation(b, &lps, p);
            worst = worst.max(w);
            agree += a;
            positions += p.len();
            if p == &answer {
                answer_lp = answer_logprob(&lps);
            }
        }
        let share = agree as f64 / positions as f64;
        let answer_delta = (answer_lp - base_answer).abs();
        println!(
            "{target} vs Q8_0: max |Δ logprob| {worst:.4}, top-1 agreement {agree}/{positions}, \
             answer logprob {answer_lp:.4} (|Δ| {answer_delta:.4})"
        );
        results.push((
            target,
            worst,
            share,
            answer_delta,
            max_delta,
            min_agree,
            max_answer_delta,
        ));
    }
    for (target, worst, share, answer_delta, max_delta, min_agree, max_answer_delta) in results {
        assert!(
            worst <= max_delta,
            "{target}: max |Δ logprob| {worst} > {max_delta}"
        );
        assert!(
            share >= min_agree,
            "{target}: top-1 agreement {share} < {min_agree}"
        );
        assert!(
            answer_delta <= max_answer_delta,
            "{target}: |Δ answer logprob| {answer_delta} > {max_answer_delta}"
        );
    }
}

/// Bounds for (max |Δ logprob|, top-1 agreement, |Δ answer logprob|): the values
/// measured on 2026-12-01 with about 1.5× room: Q6_K 1.18, 174/184, 0.14; Q5_K_M 1.44,
/// 173/184, 0.03; Q4_K_M 5.45, 158/184, 0.83. Q4_K_M is mostly Q5_0 re-quantized from
/// Q4_1 (4.1% relative RMS weight error against the source, llama-quantize's own
/// Q4_K_M of the same file: 4.4%), hence its larger deviation.
const BOUND_Q6_K: (f32, f64, f32) = (1.8, 0.9, 0.35);
const BOUND_Q5_K_M: (f32, f64, f32) = (2.2, 0.9, 0.35);
const BOUND_Q4_K_M: (f32, f64, f32) = (8.0, 0.8, 1.3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_quant_versions_answer_paris() {
    let mut answers = Vec::new();
    for target in ["Q4_K_M", "Q5_K_M", "Q6_K"] {
        let path = quantized(target);
        // The weights are what is measured here: the KV cache stays float32, as in the
        // logprob comparisons below (the cache dtype has its own tests).
        let cfg = EngineConfig {
            dtype: DType::Auto,
            kv_cache_dtype: Some(KvCacheDType::F32),
            ..f32_config()
        };
        let engine = Engine::builder(path)
            .config(cfg)
            .build()
            .await
            .expect("engine");
        let messages = vec![ChatMessage {
            role: "user".into(),
            content: "What is the capital of France?".into(),
        }];
        let mut params = greedy(20);
        params.ignore_eos = false;
        let out = engine
            .complete(Prompt::Chat(messages), params)
            .await
            .expect("complete");
        println!("{target}: {:?}", out.text);
        answers.push((target, out.text));
    }
    for (target, text) in answers {
        if target == "Q4_K_M" {
            // Not asserted: see the module docs (the greedy answer of this 135M model
            // flips under small perturbations; llama.cpp's own Q4_K_M of the same Q4_1
            // file answers "L'Étoile …" too).
            continue;
        }
        assert!(text.contains("Paris"), "{target}: {text:?}");
    }
}
