//! One prefill of a whole prompt on a single-rank decoder, straight through the model:
//! the log-probabilities every reference test compares.

use dcpserve_kernels::{log_softmax, CpuBackend, KvCacheDType};
use dcpserve_model::arch::{BatchInput, DecoderModel, ForwardOptions, RankComms};

/// Log-probabilities of every position of `ids` (one prefill), one row per position.
pub fn prompt_logprobs(model: &DecoderModel<CpuBackend>, ids: &[u32]) -> Vec<Vec<f32>> {
    prompt_logprobs_in(model, ids, KvCacheDType::F32)
}

/// [`prompt_logprobs`] with a KV cache of `dtype`.
pub fn prompt_logprobs_in(
    model: &DecoderModel<CpuBackend>,
    ids: &[u32],
    dtype: KvCacheDType,
) -> Vec<Vec<f32>> {
    prompt_logprobs_stepped(model, ids, dtype, ids.len())
}

/// [`prompt_logprobs_in`] with `step` tokens per forward pass (1 to 4: the decode-size
/// kernels, as decode steps and speculative verification run them).
pub fn prompt_logprobs_stepped(
    model: &DecoderModel<CpuBackend>,
    ids: &[u32],
    dtype: KvCacheDType,
    step: usize,
) -> Vec<Vec<f32>> {
    let n = ids.len();
    let block = 16;
    let mut cache = model
        .new_kv_cache(n.div_ceil(block), block, dtype)
        .expect("KV cache");
    let table: Vec<u32> = (0..n.div_ceil(block) as u32).rev().collect();
    let positions: Vec<usize> = (0..n).collect();
    let slots: Vec<usize> = positions
        .iter()
        .map(|&p| table[p / block] as usize * block + p % block)
        .collect();
    let kv_lens: Vec<u32> = (1..=n as u32).collect();
    let mut lps = Vec::with_capacity(n);
    for s in (0..n).step_by(step.max(1)) {
        let e = (s + step.max(1)).min(n);
        let out = model
            .forward(
                &RankComms::single(),
                &BatchInput {
                    tokens: &ids[s..e],
                    positions: &positions[s..e],
                    token_seq: &vec![0; e - s],
                    slots: &slots[s..e],
                    kv_lens: &kv_lens[s..e],
                    block_tables: &[table.as_slice()],
                    logits_for: &(0..e - s).collect::<Vec<_>>(),
                },
                &mut cache,
                &ForwardOptions::default(),
            )
            .expect("forward");
        let v = out.vocab_size;
        lps.extend((0..e - s).map(|i| log_softmax(&out.logits[i * v..(i + 1) * v])));
    }
    lps
}
