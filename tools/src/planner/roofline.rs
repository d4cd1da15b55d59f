//! A roofline estimate of one decode step on one rank.
//!
//! The model: every step each rank reads its weights (for a MoE model, only the experts
//! the batch touches) and its shard of every running sequence's KV cache, does
//! `2 × active parameters` FLOPs per token plus attention, and then waits for its
//! collectives, which are not overlapped with compute:
//!
//! ```text
//! step = max(compute / peak FLOP/s, (weight bytes + KV bytes) / memory bandwidth)
//!        + collective bytes / link bandwidth + collectives × latency
//! tok/s per rank = batch / step / tp        (the tp ranks of a group share the batch)
//! ```
//!
//! Collectives per step: with tp > 1, two all-reduces of the hidden state per layer
//! (after attention and after the MLP) and one all-gather of the logits; with dcp > 1,
//! per layer, the all-gather of the queries and one all-to-all that sends every peer the
//! partial outputs of its heads with their f32 log-sum-exps (the engine's default
//! `MergeExchange::AllToAll`; ring algorithms: an all-reduce moves `2(n−1)/n` of its data
//! through each rank, an all-gather `(n−1)` contributions, an all-to-all `(n−1)` chunks).

use dcpserve_model::ModelConfig;

use super::hardware::Hardware;
use super::model_shape::{rank_params, routed_fraction_per_token, routed_fraction_touched};

/// Weight bytes one rank holds, with the routed experts apart (a step reads only those
/// its batch routes to).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankWeightBytes {
    pub total: f64,
    pub routed_experts: f64,
}

/// One decode step of `batch` sequences of mean context `mean_context` on a rank of a
/// (tp, dcp) layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInputs {
    pub tp: usize,
    pub dcp: usize,
    pub batch: usize,
    pub mean_context: f64,
    /// KV bytes one token costs on a rank that stores it.
    pub kv_bytes_per_token: usize,
}

/// The estimate and its parts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepEstimate {
    /// Weight bytes read per step per rank.
    pub weight_bytes: f64,
    /// KV bytes read per step per rank (its 1/dcp shard of each sequence).
    pub kv_bytes: f64,
    /// Bytes each rank sends (= receives) in collectives per step.
    pub collective_bytes: f64,
    /// Collective operations per step.
    pub collectives: usize,
    /// FLOPs per step per rank.
    pub flops: f64,
    pub memory_s: f64,
    pub compute_s: f64,
    pub collective_s: f64,
    pub step_s: f64,
    /// Generated tokens per second per rank.
    pub tokens_per_s_per_rank: f64,
}

/// Bytes each rank moves in one decode step's collectives, and how many there are.
pub fn collective_traffic(cfg: &ModelConfig, hw: &Hardware, s: &StepInputs) -> (f64, usize) {
    let (tp, dcp, b) = (s.tp as f64, s.dcp as f64, s.batch as f64);
    let layers = cfg.num_hidden_layers as f64;
    let act = hw.activation_bytes as f64;
    let mut bytes = 0.0;
    let mut ops = 0;
    if s.tp > 1 {
        let hidden = b * cfg.hidden_size as f64 * act;
        bytes += layers * 2.0 * 2.0 * (tp - 1.0) / tp * hidden;
        // The output head is split by vocabulary: gather the f32 logits.
        bytes += (tp - 1.0) * b * (cfg.vocab_size as f64 / tp).ceil() * 4.0;
        ops += 2 * cfg.num_hidden_layers + 1;
    }
    if s.dcp > 1 {
        let heads = (cfg.num_attention_heads as f64 / tp).ceil();
        // MLA decodes with absorbed queries over the latent (+ rope) and returns latent
        // outputs; standard attention exchanges head_dim-wide queries and outputs.
        let (q_dim, o_dim) = match &cfg.mla {
            Some(m) => (m.latent_dim() as f64, m.kv_lora_rank as f64),
            None => (cfg.head_dim as f64, cfg.head_dim as f64),
        };
        let gather_q = (dcp - 1.0) * b * heads * q_dim * act;
        // Each peer gets the partials of its `heads` heads and one f32 LSE per head.
        let exchange_partials = (dcp - 1.0) * b * heads * (o_dim * act + 4.0);
        bytes += layers * (gather_q + exchange_partials);
        ops += 2 * cfg.num_hidden_layers;
    }
    (bytes, ops)
}

/// FLOPs one rank does in one decode step.
pub fn step_flops(cfg: &ModelConfig, s: &StepInputs) -> f64 {
    let p = rank_params(cfg, s.tp);
    let active = (p.total() - p.routed_experts) as f64
        + p.routed_experts as f64 * routed_fraction_per_token(cfg);
    let heads = cfg.num_attention_heads.div_ceil(s.tp.max(1)) as f64;
    // Per (query head, cached token): scores over the key width, then the weighted sum
    // over the value width, 2 FLOPs per multiply-add.
    let per_head_token = match &cfg.mla {
        Some(m) => 2.0 * (m.latent_dim() + m.kv_lora_rank) as f64,
        None => 4.0 * cfg.head_dim as f64,
    };
    // DCP: each rank attends for the whole group's heads over its 1/dcp of the tokens.
    let attention = cfg.num_hidden_layers as f64 * heads * per_head_token * s.mean_context;
    s.batch as f64 * (2.0 * active + attention)
}

/// The roofline estimate of one decode step (see the module docs).
pub fn decode_step(
    cfg: &ModelConfig,
    hw: &Hardware,
    weights: RankWeightBytes,
    s: &StepInputs,
) -> StepEstimate {
    if s.batch == 0 {
        return StepEstimate::default();
    }
    let touched = routed_fraction_touched(cfg, s.batch);
    let weight_bytes = weights.total - weights.routed_experts * (1.0 - touched);
    let kv_bytes =
        s.batch as f64 * s.mean_context / s.dcp.max(1) as f64 * s.kv_bytes_per_token as f64;
    let flops = step_flops(cfg, s);
    let (collective_bytes, collectives) = collective_traffic(cfg, hw, s);
    let memory_s = (weight_bytes + kv_bytes) / hw.mem_bw;
    let compute_s = flops / hw.peak_flops;
    let collective_s = collective_bytes / hw.link_bw + collectives as f64 * hw.collective_latency_s;
    let step_s = memory_s.max(compute_s) + collective_s;
    StepEstimate {
        weight_bytes,
        kv_bytes,
        collective_bytes,
        collectives,
        flops,
        memory_s,
        compute_s,
        collective_s,
        step_s,
        tokens_per_s_per_rank: s.batch as f64 / step_s / s.tp.max(1) as f64,
    }
}
