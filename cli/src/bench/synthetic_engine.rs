//! The engine every `bench-dcp` section builds on its synthetic model, and its prompts:
//! one home for the settings the sections share.

use dcpserve::{DType, EngineConfig, ParallelConfig, SamplingParams};
use dcpserve_kernels::KvCacheDType;
use dcpserve_tools::synthetic::SYNTHETIC_VOCAB;

/// `n` token ids of the synthetic vocabulary (`salt` picks which).
pub(crate) fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 131) % (SYNTHETIC_VOCAB - 3) + 3) as u32)
        .collect()
}

/// Greedy, `max_tokens` tokens, never stopping early.
pub(crate) fn params(max_tokens: usize) -> SamplingParams {
    let mut p = SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    p.temperature = 0.0;
    p
}

/// A float32 engine at tp, dcp with `kv_bytes` of KV cache per rank, `threads` compute
/// threads in all, chunks of 4,096 tokens, no prefix caching.
pub(crate) fn engine_config(
    tp: usize,
    dcp: usize,
    kv_bytes: u64,
    threads: usize,
    kv: KvCacheDType,
) -> EngineConfig {
    EngineConfig {
        kv_cache_dtype: Some(kv),
        parallel: ParallelConfig {
            tensor_parallel_size: tp,
            decode_context_parallel_size: dcp,
            cp_kv_cache_interleave_size: 1,
            ..Default::default()
        },
        dtype: DType::Float32,
        kv_cache_memory_bytes: Some(kv_bytes),
        max_num_batched_tokens: 4096,
        num_threads: Some(threads),
        enable_prefix_caching: false,
        ..Default::default()
    }
}
