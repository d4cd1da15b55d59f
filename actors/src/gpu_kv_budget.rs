//! The KV-cache budget of a CUDA rank, by vLLM's rule: `--gpu-memory-utilization` of
//! the device's memory, minus the weights of the ranks on that device and an
//! activation reserve, shared by those ranks. The planner (`dcpserve plan`) computes it
//! with the same [`KvBudgetRule`] and the same 4 GiB reserve, so its capacity and the
//! engine's log agree.

use dcpserve_config::{KvBudgetRule, SharedMemory, ACTIVATION_RESERVE_BYTES};
use dcpserve_model::source::expected_tensors;
use dcpserve_model::ModelConfig;

const GIB: f64 = (1u64 << 30) as f64;

/// What a GPU's KV budget is computed from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuMemory {
    /// The device's memory in bytes.
    pub total: u64,
    /// `--gpu-memory-utilization`.
    pub utilization: f64,
    /// Weight bytes of one rank on the device.
    pub weights_per_rank: u64,
    /// Ranks sharing the device.
    pub ranks: usize,
}

/// Weight bytes of one of `tp` ranks once on the device: every tensor of the model in
/// bf16 (GGUF quantized weights are dequantized to bf16 at load), or f32 with
/// `float32`, split over the ranks.
pub(crate) fn weights_per_rank(cfg: &ModelConfig, tp: usize, f32_weights: bool) -> u64 {
    let params: u64 = expected_tensors(cfg)
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>() as u64)
        .sum();
    let bytes = if f32_weights { 4 } else { 2 };
    params * bytes / tp.max(1) as u64
}

/// KV-cache bytes per rank, with the log line that states the computation, or why
/// nothing is left.
pub(crate) fn kv_budget_per_rank(m: GpuMemory) -> Result<(u64, String), String> {
    if !(m.utilization > 0.0 && m.utilization <= 1.0) {
        return Err(format!(
            "--gpu-memory-utilization must be in (0, 1], got {}",
            m.utilization
        ));
    }
    let weights = m.weights_per_rank * m.ranks as u64;
    let reserve_bytes = ACTIVATION_RESERVE_BYTES as f64;
    let shared = SharedMemory {
        memory_bytes: m.total as f64,
        ranks: m.ranks,
        weights_per_rank: m.weights_per_rank as f64,
    };
    let left = KvBudgetRule::left_on_device(m.utilization, reserve_bytes, shared);
    let per_rank = KvBudgetRule::MemoryUtilization {
        utilization: m.utilization,
        reserve_bytes,
    }
    .per_rank(shared);
    let text = format!(
        "KV cache budget on each GPU: {:.2} × {:.1} GiB − weights {:.2} GiB ({} rank(s) × {:.2} GiB) \
         − activations {:.1} GiB = {:.2} GiB, {:.2} GiB per rank",
        m.utilization,
        m.total as f64 / GIB,
        weights as f64 / GIB,
        m.ranks,
        m.weights_per_rank as f64 / GIB,
        ACTIVATION_RESERVE_BYTES as f64 / GIB,
        left as f64 / GIB,
        per_rank as f64 / GIB,
    );
    if per_rank == 0 {
        return Err(format!(
            "no GPU memory is left for the KV cache: {text}; raise --gpu-memory-utilization, \
             use more GPUs (--tensor-parallel-size) or set --kv-cache-memory-bytes"
        ));
    }
    Ok((per_rank, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_vllms_rule_shared_by_the_ranks_on_a_gpu() {
        let m = GpuMemory {
            total: 100 << 30,
            utilization: 0.9,
            weights_per_rank: 10 << 30,
            ranks: 2,
        };
        let (per_rank, text) = kv_budget_per_rank(m).unwrap();
        // 90 − 20 − 4 = 66 GiB for two ranks.
        assert_eq!(per_rank, 33 << 30);
        assert!(text.contains("= 66.00 GiB, 33.00 GiB per rank"), "{text}");
        let full = GpuMemory {
            weights_per_rank: 50 << 30,
            ..m
        };
        assert!(kv_budget_per_rank(full)
            .unwrap_err()
            .contains("no GPU memory is left"));
        let bad = GpuMemory {
            utilization: 1.5,
            ..m
        };
        assert!(kv_budget_per_rank(bad).unwrap_err().contains("(0, 1]"));
    }
}
