//! The (tp, dcp) layouts a number of ranks allows, and vLLM's verdict on each.

use dcpserve_config::ParallelConfig;
use dcpserve_model::ModelConfig;

/// One tensor-parallel group with its decode-context-parallel size. `ranks / tp` such
/// groups serve as data-parallel replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub tp: usize,
    pub dcp: usize,
}

/// Every layout worth printing for `ranks` ranks: tp dividing the ranks; dcp dividing
/// tp, plus powers of two up to tp that do not (so their rejection shows).
pub fn candidate_layouts(ranks: usize) -> Vec<Layout> {
    let divisors = |n: usize| (1..=n).filter(move |d| n.is_multiple_of(*d));
    let mut out = Vec::new();
    for tp in divisors(ranks.max(1)) {
        let mut dcps: Vec<usize> = divisors(tp).collect();
        dcps.extend((0..).map(|k| 1usize << k).take_while(|&p| p <= tp));
        dcps.sort_unstable();
        dcps.dedup();
        out.extend(dcps.into_iter().map(|dcp| Layout { tp, dcp }));
    }
    out
}

/// The engine's layout check (vLLM's rules and messages); `Err` holds the message.
pub fn check_layout(
    cfg: &ModelConfig,
    layout: Layout,
    interleave: usize,
    block_size: usize,
) -> Result<(), String> {
    ParallelConfig {
        tensor_parallel_size: layout.tp,
        decode_context_parallel_size: layout.dcp,
        cp_kv_cache_interleave_size: interleave,
        ..Default::default()
    }
    .validate(cfg.attention_kind(), block_size)
    .map_err(|e| e.to_string())
}
