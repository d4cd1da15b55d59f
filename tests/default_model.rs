//! The default model (SmolLM2-135M-Instruct, GGUF Q4_1) against Hugging Face
//! transformers' float32 logits on the same GGUF (fixtures/smollm2, made by
//! scripts/make_references.py).

mod common;

use common::prefill::{prompt_logprobs, prompt_logprobs_in, prompt_logprobs_stepped};
use common::*;
use dcpserve::{ChatMessage, DType, Engine, EngineConfig, Prompt};
use dcpserve_kernels::{CpuBackend, CpuMatmul, KvCacheDType};
use dcpserve_model::arch::{DecoderModel, WeightPrecision};
use dcpserve_model::ModelFiles;

const TOL: f32 = 5e-3;

/// Max |Δ logprob| of `lps` against the reference's top tokens and next tokens of
/// `prompt`, and the positions whose top-1 differs.
fn distance_to_reference(prompt: &serde_json::Value, lps: &[Vec<f32>]) -> (f32, Vec<usize>) {
    let ids = ids(&prompt["ids"]);
    let n = ids.len();
    let mut worst = 0.0f32;
    let mut top1_differs = Vec::new();
    for (pos, lp) in lps.iter().enumerate() {
        let top_ids = ids_of(&prompt["top_ids"][pos]);
        let top_lp = floats(&prompt["top_logprobs"][pos]);
        if dcpserve_kernels::argmax(lp) != top_ids[0] {
            top1_differs.push(pos);
        }
        for (&t, &want) in top_ids.iter().zip(&top_lp) {
            worst = worst.max((lp[t as usize] - want).abs());
        }
        if pos + 1 < n {
            let want = prompt["next_logprob"][pos].as_f64().unwrap() as f32;
            worst = worst.max((lp[ids[pos + 1] as usize] - want).abs());
        }
    }
    (worst, top1_differs)
}

#[test]
fn logits_match_transformers() {
    let files = ModelFiles::open(default_model()).expect("open default model");
    // f32 weights: `--cpu-matmul` does not apply, the products are f32 like the
    // reference's.
    let model = DecoderModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .expect("load weights");
    let reference = read_json(fixture("smollm2/logits.json"));
    for prompt in reference["prompts"].as_array().unwrap() {
        let lps = prompt_logprobs(&model, &ids(&prompt["ids"]));
        let (worst, top1_differs) = distance_to_reference(prompt, &lps);
        assert!(
            top1_differs.is_empty(),
            "{}: top-1 differs at positions {top1_differs:?}",
            prompt["name"]
        );
        assert!(
            worst <= TOL,
            "{}: max |Δ logprob| = {worst}",
            prompt["name"]
        );
    }
}

/// The f32 model with a bfloat16 / FP8 KV cache against the same float32 reference
/// (FP8 with its power-of-two scale per cached row). Measured on 2026-12-05 over the
/// reference prompts (139 positions): bf16 moves logprobs by up to 0.104 and changes no
/// top-1 token; E4M3 by up to 2.47 with 9 top-1 changes; E5M2 by up to 4.62 with 19.
/// (With the former per-tensor scale of 1.0, 2026-12-01: E4M3 3.24 with 11 changes,
/// E5M2 4.53 with 17.) E4M3 still deviates ~24× as much as bf16, near the 16× of the
/// mantissa widths (2⁻⁴ against 2⁻⁸): the row scales removed what the range cost, the
/// rest is FP8's precision. The bounds are those measurements with 1.5× room: bf16 must
/// keep every top-1 token; the FP8 bounds catch a broken cache or lost scales (garbage
/// disagrees almost everywhere; scale 1.0 gave 3.24), not a slightly worse one.
#[test]
fn logits_with_a_compressed_kv_cache_stay_near_transformers() {
    let files = ModelFiles::open(default_model()).expect("open default model");
    let model = DecoderModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .expect("load weights");
    let reference = read_json(fixture("smollm2/logits.json"));
    for (dt, tol, max_flips) in [
        (KvCacheDType::BF16, 0.16, 0),
        (KvCacheDType::Fp8E4M3, 3.7, 13),
        (KvCacheDType::Fp8E5M2, 6.9, 28),
    ] {
        let mut overall = 0.0f32;
        let mut flips = 0;
        for prompt in reference["prompts"].as_array().unwrap() {
            let lps = prompt_logprobs_in(&model, &ids(&prompt["ids"]), dt);
            let (worst, top1_differs) = distance_to_reference(prompt, &lps);
            overall = overall.max(worst);
            flips += top1_differs.len();
        }
        eprintln!(
            "MEASURED default model, {dt} KV cache vs transformers: max |Δ logprob| {overall:.3e}, top-1 differs at {flips} positions"
        );
        assert!(overall <= tol, "{dt}: max |Δ logprob| = {overall} > {tol}");
        assert!(
            flips <= max_flips,
            "{dt}: top-1 differs at {flips} positions"
        );
    }
}

/// What `--cpu-matmul auto` runs at decode sizes (1 to 8 rows per product: decode steps,
/// small batches, speculative verification) on the Q4_1 weights: on the AVX2 level the
/// int16-activation kernels (`dcpserve_kernels::cpu::int16_matmul`), elsewhere the f32
/// path. Scored one, four and eight tokens per forward pass (the one-row, the
/// small-batch and the tiled kernels), every top-1 token must stay but at near ties
/// (reference margin under twice the bound; one here, 8.3e-4). Measured 2026-12-07 on
/// the 139 positions: the f32 path moves logprobs by up to 4.8e-5, the int16 path by
/// up to 1.03e-2 (9.7e-3 at eight rows; the Q4_1 layers; 1.1e-3
/// with them on f32), against 1.17 for int8 activations and 0.104 for the default bf16
/// KV cache. The bound is that measurement with 2.4× room: it catches a broken kernel
/// (a wrong code or scale moves logprobs by whole units), not a slightly worse one.
const DECODE_SIZED_TOL: f32 = 2.5e-2;

#[test]
fn decode_sized_products_stay_at_transformers() {
    // The f32 path (AVX-512 level, or no AVX2) is held to the prefill's bound.
    let tol =
        if dcpserve_kernels::cpu::int16_matmul::applies(dcpserve_kernels::WeightFormat::Q4_1, 1) {
            DECODE_SIZED_TOL
        } else {
            TOL
        };
    let files = ModelFiles::open(default_model()).expect("open default model");
    let model = DecoderModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::Auto,
    )
    .expect("load weights");
    let reference = read_json(fixture("smollm2/logits.json"));
    for step in [1, 4, 8] {
        for prompt in reference["prompts"].as_array().unwrap() {
            let ids = ids(&prompt["ids"]);
            let lps = prompt_logprobs_stepped(&model, &ids, KvCacheDType::F32, step);
            let (worst, top1_differs) = distance_to_reference(prompt, &lps);
            println!(
                "MEASURED {} step {step} ({}): max |Δ logprob| {worst:.2e}",
                prompt["name"],
                dcpserve_kernels::cpu::isa().name()
            );
            // A top-1 token may change only where the reference's two best are closer
            // than the logprob bound allows (position 55 of "paragraph": 8.3e-4 apart).
            let near_ties: Vec<usize> = top1_differs
                .iter()
                .copied()
                .filter(|&pos| {
                    let lp = floats(&prompt["top_logprobs"][pos]);
                    lp[0] - lp[1] >= 2.0 * tol
                })
                .collect();
            assert!(
                near_ties.is_empty(),
                "{} step {step}: top-1 differs at {near_ties:?}, not near ties",
                prompt["name"]
            );
            assert!(
                worst <= tol,
                "{} step {step}: max |Δ logprob| = {worst}",
                prompt["name"]
            );
        }
    }
}

/// The Q4_1 weights kept quantized: the f32 path (weights decoded to f32, the default)
/// equals the transformers reference, which runs the same dequantized weights in
/// float32, to `TOL`. The int8-activation path (`--cpu-matmul int8`, llama.cpp's way)
/// rounds every activation by up to 1/254 of its 32-block's largest magnitude; the
/// kernels are checked against exact references in `dcpserve_kernels` (int8_matmul
/// tests), but through 30 layers of this 135M model the rounding moved logprobs by up
/// to 1.17 (measured on these prompts, 2026-12-01, AVX-512 VNNI) and flipped the
/// top-1 token at 5 of 139 positions. That is why `auto` means f32. The bounds below are
/// those measurements with some room, not a derived tolerance: they catch a broken
/// int8 path (errors of whole logprob units everywhere), not a slightly worse one.
#[test]
fn int8_activations_on_the_default_model() {
    const INT8_MAX_DELTA: f32 = 2.0;
    const INT8_MIN_TOP1_AGREEMENT: f64 = 0.9;
    let Some(isa) = dcpserve_kernels::Int8Isa::detect() else {
        println!("int8_activations_on_the_default_model: SKIPPED (no AVX2)");
        return;
    };
    let files = ModelFiles::open(default_model()).expect("open default model");
    let load = |mode| {
        let dev = CpuBackend::new(2).with_cpu_matmul(mode);
        let model = DecoderModel::load(
            dev,
            files.config.clone(),
            files.tensors.as_ref(),
            WeightPrecision::Auto,
        )
        .expect("load weights");
        assert_eq!(model.backend().cpu_matmul(), mode);
        model
    };
    let f32_model = load(CpuMatmul::F32);
    if dcpserve_kernels::cpu::scalar_forced() {
        println!("int8_activations_on_the_default_model: SKIPPED (scalar forced)");
        return;
    }
    let int8_model = load(CpuMatmul::Int8);
    let reference = read_json(fixture("smollm2/logits.json"));
    let (mut positions, mut agree) = (0usize, 0usize);
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids = ids(&prompt["ids"]);
        let a = prompt_logprobs(&f32_model, &ids);
        let b = prompt_logprobs(&int8_model, &ids);
        let (ref_f32, f32_flips) = distance_to_reference(prompt, &a);
        let (ref_int8, flips) = distance_to_reference(prompt, &b);
        println!(
            "{} ({isa:?}): max |Δ logprob| vs transformers: f32 path {ref_f32:.4}, \
             int8 {ref_int8:.4}; int8 top-1 differs at {flips:?} of {}",
            prompt["name"],
            ids.len()
        );
        assert!(
            f32_flips.is_empty() && ref_f32 <= TOL,
            "{}: f32 path",
            prompt["name"]
        );
        assert!(
            ref_int8 <= INT8_MAX_DELTA,
            "{}: int8 {ref_int8}",
            prompt["name"]
        );
        positions += ids.len();
        agree += ids.len() - flips.len();
    }
    let share = agree as f64 / positions as f64;
    println!("int8 top-1 agreement with transformers: {agree}/{positions}");
    assert!(
        share >= INT8_MIN_TOP1_AGREEMENT,
        "int8 top-1 agreement {share}"
    );
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    ids(v)
}

async fn chat_answer(dtype: DType) -> (Vec<u32>, String) {
    let cfg = EngineConfig {
        dtype,
        ..f32_config()
    };
    let engine = Engine::builder(default_model())
        .config(cfg)
        .build()
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

/// With the default `--cpu-matmul auto` (f32 for the prompt; int16 activations for the
/// decode steps on the AVX2 level); with `int8` this 135M model answers something else
/// (see `int8_activations_on_the_default_model`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_paris_with_quantized_weights() {
    let (_, text) = chat_answer(DType::Auto).await;
    assert!(
        text.starts_with("The capital of France is Paris."),
        "got {text:?}"
    );
}
