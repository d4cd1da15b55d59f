//! The per-step plan the scheduler broadcasts to every rank, and what comes back.

use std::sync::Arc;

use dcpserve_model::arch::BatchInput;

use crate::placement::Placement;

/// One decode/prefill step: the new tokens of every scheduled sequence.
///
/// Positions and block tables are global; each rank derives its own KV slots and
/// attention lengths from them with its [`Placement`].
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    pub step_id: u64,
    /// Which micro-batch the step belongs to (0, or 1 with two in ping-pong): each runs
    /// on its own compute thread of every rank, with its own communicators.
    pub micro_batch: usize,
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    /// Index into `block_tables` of each token's sequence.
    pub token_seq: Vec<u32>,
    /// Virtual block table of each scheduled sequence.
    pub block_tables: Vec<Vec<u32>>,
    /// Tokens whose logits the scheduler needs, in order.
    pub logits_for: Vec<usize>,
    /// Request id of each block table's sequence (ranks with an MTP layer keep hidden
    /// states per sequence; empty when no rank needs them).
    pub seq_ids: Vec<u64>,
    /// Sequences that ended or were preempted since the last plan: ranks drop what they
    /// kept for them before running this plan (in step order, unlike a separate message).
    pub released: Vec<u64>,
}

/// The step's logits (rows follow `StepPlan::logits_for`).
#[derive(Debug)]
pub struct StepOutput {
    pub step_id: u64,
    pub logits: Vec<f32>,
    pub vocab_size: usize,
}

/// A plan turned into one rank's forward input (slots and causal lengths local to it).
pub struct LocalBatch {
    pub slots: Vec<usize>,
    pub kv_lens: Vec<u32>,
}

impl LocalBatch {
    pub fn new(plan: &StepPlan, placement: &Placement) -> Self {
        let mut slots = Vec::with_capacity(plan.tokens.len());
        let mut kv_lens = Vec::with_capacity(plan.tokens.len());
        for (&p, &s) in plan.positions.iter().zip(&plan.token_seq) {
            let table = &plan.block_tables[s as usize];
            slots.push(placement.slot(p, table).unwrap_or(usize::MAX));
            kv_lens.push(placement.local_len(p + 1) as u32);
        }
        Self { slots, kv_lens }
    }

    /// Borrows the plan and this rank's view as a forward input.
    pub fn input<'a>(&'a self, plan: &'a StepPlan, tables: &'a [&'a [u32]]) -> BatchInput<'a> {
        BatchInput {
            tokens: &plan.tokens,
            positions: &plan.positions,
            token_seq: &plan.token_seq,
            slots: &self.slots,
            kv_lens: &self.kv_lens,
            block_tables: tables,
            logits_for: &plan.logits_for,
        }
    }
}

/// Shared, immutable plan as it travels to ranks.
pub type SharedPlan = Arc<StepPlan>;
