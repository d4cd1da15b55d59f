//! Everything the planner computes for each layout.

use dcpserve_config::{resolve, KvSizing, ParallelConfig};
use dcpserve_kernels::dcp::KvCapacity;
use dcpserve_kernels::KvCacheDType;
use dcpserve_model::ModelConfig;

use super::dtype::{KvDtype, WeightDtype};
use super::hardware::Hardware;
use super::layouts::{candidate_layouts, Layout};
use super::model_shape::rank_params;
use super::roofline::{decode_step, RankWeightBytes, StepEstimate, StepInputs};
use super::workload::{kv_fraction_used, max_concurrency, Workload};

/// What the planner plans for, besides the model and the machine.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Format of the MLP and expert weights.
    pub weight_dtype: WeightDtype,
    /// Format of the attention projections.
    pub attention_dtype: WeightDtype,
    /// KV-cache format; `auto` resolves as the engine's ([`PlanOptions::kv_cache_dtype`]).
    pub kv_dtype: KvDtype,
    /// Tokens per KV block on one rank.
    pub block_size: usize,
    /// `cp_kv_cache_interleave_size`.
    pub interleave: usize,
    pub max_num_seqs: usize,
    pub workload: Workload,
    /// Evaluate at this many concurrent requests instead of the most that fit.
    pub concurrency: Option<usize>,
}

impl PlanOptions {
    /// The KV-cache element type the engine would allocate with these weights.
    pub fn kv_cache_dtype(&self) -> KvCacheDType {
        self.kv_dtype.resolve(self.weight_dtype)
    }
}

/// The numbers of one valid layout.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutEstimate {
    pub weight_bytes_per_rank: f64,
    pub kv_budget_per_rank: u64,
    /// The engine's sizing at this budget (tokens per rank, in total, bytes per token).
    pub capacity: KvCapacity,
    /// Requests of the workload that fit at once (at most `max_num_seqs`).
    pub max_concurrency: usize,
    /// Requests the roofline runs: `--concurrency` capped at what fits, else the maximum.
    pub running: usize,
    /// KV fraction the requested concurrency needs (over 1: it does not fit and waits).
    pub kv_fraction: f64,
    pub step: StepEstimate,
}

/// One row of the plan: a layout and its numbers, or why it cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutRow {
    pub layout: Layout,
    /// Data-parallel replicas of this layout on the machine's ranks.
    pub replicas: usize,
    pub outcome: Result<LayoutEstimate, String>,
}

/// Weight bytes of rank 0 of a `tp`-rank group: attention in `attention_dtype`, MLPs and
/// experts in `weight_dtype`, embedding / output head / norms / router in bf16 (f32 when
/// the weights are f32), as quantized checkpoints keep them.
pub fn weight_bytes_per_rank(cfg: &ModelConfig, tp: usize, o: &PlanOptions) -> RankWeightBytes {
    let p = rank_params(cfg, tp);
    let unquantized = if o.weight_dtype == WeightDtype::F32 {
        WeightDtype::F32
    } else {
        WeightDtype::Bf16
    };
    let routed = o.weight_dtype.bytes(p.routed_experts);
    RankWeightBytes {
        total: o.attention_dtype.bytes(p.attention)
            + o.weight_dtype.bytes(p.dense_mlp + p.shared_experts)
            + routed
            + unquantized.bytes(p.unquantized),
        routed_experts: routed,
    }
}

/// The estimate for one layout, or the engine's (vLLM's) message when it rejects it:
/// the layout and its KV cache are resolved as the engine resolves them
/// ([`dcpserve_config::resolve`]).
pub fn estimate_layout(
    cfg: &ModelConfig,
    hw: &Hardware,
    layout: Layout,
    o: &PlanOptions,
) -> Result<LayoutEstimate, String> {
    let weights = weight_bytes_per_rank(cfg, layout.tp, o);
    let budget = hw.kv_budget_per_rank(layout.tp, weights.total);
    let parallel = ParallelConfig {
        tensor_parallel_size: layout.tp,
        decode_context_parallel_size: layout.dcp,
        cp_kv_cache_interleave_size: o.interleave,
        ..Default::default()
    };
    let sizing = KvSizing {
        block_size: o.block_size,
        micro_batches: 1,
        dtype: o.kv_cache_dtype(),
        budget_per_rank: budget,
    };
    let resolved = resolve(&parallel, &cfg.kv_shape(), sizing).map_err(|e| e.to_string())?;
    if budget == 0 {
        return Err(format!(
            "The weights ({:.1} GB per rank) leave no memory for the KV cache.",
            weights.total / 1e9
        ));
    }
    let capacity = resolved.capacity;
    let tokens_per_block = resolved.layout.virtual_block_size();
    let fit = max_concurrency(
        &o.workload,
        capacity.num_blocks,
        tokens_per_block,
        o.max_num_seqs,
    );
    let wanted = o.concurrency.unwrap_or(fit);
    let running = wanted.min(fit);
    let step = decode_step(
        cfg,
        hw,
        weights,
        &StepInputs {
            tp: layout.tp,
            dcp: layout.dcp,
            batch: running,
            mean_context: o.workload.mean_decode_context(),
            kv_bytes_per_token: capacity.bytes_per_token_per_rank,
        },
    );
    Ok(LayoutEstimate {
        weight_bytes_per_rank: weights.total,
        kv_budget_per_rank: budget,
        capacity,
        max_concurrency: fit,
        running,
        kv_fraction: kv_fraction_used(&o.workload, wanted, capacity.num_blocks, tokens_per_block),
        step,
    })
}

/// Every candidate layout of the machine's ranks with its estimate or its constraint
/// message.
///
/// ```
/// use dcpserve_tools::planner::{plan_layouts, load_model_config, Hardware, HardwareOverrides,
///     HardwarePreset, KvDtype, PlanOptions, WeightDtype, Workload};
/// // Doc tests run in this crate's folder, one below the workspace root.
/// let cfg = load_model_config("../fixtures/tiny-llama/config.json".as_ref()).unwrap();
/// let hw = Hardware::new(HardwarePreset::Cpu, &HardwareOverrides {
///     ranks: Some(4),
///     kv_cache_memory_bytes: Some(1 << 20),
///     ..Default::default()
/// });
/// let opts = PlanOptions {
///     weight_dtype: WeightDtype::F32,
///     attention_dtype: WeightDtype::F32,
///     kv_dtype: KvDtype::F32,
///     block_size: 16,
///     interleave: 1,
///     max_num_seqs: 256,
///     workload: Workload::fixed(1000, 24),
///     concurrency: None,
/// };
/// let rows = plan_layouts(&cfg, &hw, &opts);
/// // tiny-llama has 2 KV heads: DCP needs tp > 2, so tp=4 dcp=2 runs and tp=2 dcp=2 does not.
/// let find = |tp, dcp| rows.iter().find(|r| r.layout.tp == tp && r.layout.dcp == dcp).unwrap();
/// assert!(find(4, 2).outcome.is_ok());
/// assert!(find(2, 2).outcome.as_ref().unwrap_err().contains("greater than the model's total number of KV heads"));
/// ```
pub fn plan_layouts(cfg: &ModelConfig, hw: &Hardware, o: &PlanOptions) -> Vec<LayoutRow> {
    candidate_layouts(hw.ranks)
        .into_iter()
        .map(|layout| LayoutRow {
            layout,
            replicas: hw.ranks / layout.tp,
            outcome: estimate_layout(cfg, hw, layout, o),
        })
        .collect()
}
