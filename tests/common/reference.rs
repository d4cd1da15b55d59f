//! Single-rank logits against the fixtures' Hugging Face references.

use dcpserve_kernels::{log_softmax, CpuBackend, KvCacheDType};
use dcpserve_model::arch::{BatchInput, ForwardOptions, RankComms, RankModel, WeightPrecision};
use dcpserve_model::ModelFiles;

use super::{fixture, floats, ids, read_json};

/// Runs `ids` in chunks of `chunk` tokens over a paged KV cache of `dtype` with a
/// shuffled block table and returns log-probs at every position.
pub fn logprobs_chunked(
    model: &RankModel,
    ids: &[u32],
    chunk: usize,
    dtype: KvCacheDType,
) -> Vec<Vec<f32>> {
    let block = 4;
    let n_blocks = ids.len().div_ceil(block) + 1;
    let cache = model
        .new_kv_cache_typed(n_blocks * 2, block, dtype)
        .expect("KV cache");
    let table: Vec<u32> = (0..n_blocks as u32)
        .map(|b| (b * 7 + 3) % (n_blocks as u32 * 2))
        .collect();
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
        let input = BatchInput {
            tokens: &ids[start..end],
            positions: &positions,
            token_seq: &token_seq,
            slots: &slots,
            kv_lens: &kv_lens,
            block_tables: &tables,
            logits_for: &logits_for,
        };
        let single = RankComms::single();
        let out =
            (model.forward(&single, &input, &cache, &ForwardOptions::default())).expect("forward");
        for r in 0..end - start {
            rows.push(log_softmax(
                &out.logits[r * out.vocab_size..(r + 1) * out.vocab_size],
            ));
        }
        start = end;
    }
    rows
}

/// Compares the model's log-probabilities with the fixture's transformers reference
/// (within 1e-3), over the whole prompt at once and in chunks of 5 tokens.
pub fn check_logprobs(name: &str) {
    check_logprobs_of(name, &fixture(name));
}

/// [`check_logprobs`] for the weights at `model` (e.g. a GGUF copy of fixture `name`);
/// returns the largest |Δ logprob| seen.
pub fn check_logprobs_of(name: &str, model: &std::path::Path) -> f32 {
    check_logprobs_with(name, model, KvCacheDType::F32, 1e-3)
}

/// [`check_logprobs_of`] with a KV cache of `dtype`, within `tol`; returns the largest
/// |Δ logprob| seen.
pub fn check_logprobs_with(
    name: &str,
    model: &std::path::Path,
    dtype: KvCacheDType,
    tol: f32,
) -> f32 {
    let reference = read_json(fixture(name).join("reference.json"));
    let files = ModelFiles::open(model).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = RankModel::load(
        CpuBackend::new(2),
        files.config.clone(),
        files.tensors.as_ref(),
        WeightPrecision::F32,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut overall = 0.0f32;
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids = ids(&prompt["ids"]);
        let positions: Vec<usize> = prompt["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as usize)
            .collect();
        for chunk in [ids.len(), 5] {
            let ours = logprobs_chunked(&model, &ids, chunk, dtype);
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
            eprintln!(
                "{name} {} chunk {chunk} ({dtype} KV cache): max |Δ logprob| {worst:.2e}",
                prompt["name"]
            );
            assert!(
                worst <= tol,
                "{name}, prompt {} (len {}), chunk {chunk}, {dtype} KV cache: max |Δ logprob| = {worst} > {tol}",
                prompt["name"],
                ids.len()
            );
            overall = overall.max(worst);
        }
    }
    overall
}
