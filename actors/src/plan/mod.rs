//! What the scheduler sends the ranks for a step, and what comes back: plain data (serde),
//! so the same messages can cross a process boundary (see [`wire`]).
//!
//! As vLLM's `SchedulerOutput`, a plan carries a sequence's state once, when it is
//! (re)admitted ([`NewSeq`]: its block table and, for the rank that samples, its sampling
//! state), and afterwards only the change ([`CachedSeq`]: blocks kept and appended). Ranks
//! keep the per-sequence state keyed by request id (`SeqStates`, built on these messages)
//! and apply each plan in step order; `finished` lists the sequences to forget first. A
//! preempted (recomputed) sequence is sent as new again.
//!
//! Sampling runs on rank 0, which holds the full logits after the vocabulary gather (every
//! rank has them; rank 0 is the one that answers): the scheduler gets token ids and the
//! log-probabilities that were asked for, never vocabulary-sized logits. A plan may ask for
//! the logits instead ([`OutputKind::Logits`]), as the draft model's proposer does, which
//! draws its own drafts.

pub mod wire;

use std::sync::Arc;

use dcpserve_kernels::Rng;
use dcpserve_model::arch::BatchInput;
use serde::{Deserialize, Serialize};

use crate::placement::Placement;
use crate::request::TokenOutput;
pub use crate::sampler::SamplerInit;

/// One decode/prefill step of a micro-batch, as the scheduler sends it to every rank.
/// (Empty and absent fields are left out of the encoding: most are, in a decode step.)
///
/// Positions are global; each rank derives its own KV slots and attention lengths from
/// them and its block tables with its [`Placement`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPlan {
    pub step_id: u64,
    /// Which micro-batch the step belongs to (0, or 1 with two in ping-pong): each runs
    /// on its own compute thread of every rank, with its own communicators and its own
    /// per-sequence state (a sequence is in one micro-batch at a time).
    pub micro_batch: usize,
    /// Sequences that ended or were preempted since this micro-batch's last plan: ranks
    /// forget them before applying `seqs` (in step order, unlike a separate message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finished: Vec<u64>,
    /// Every scheduled sequence, in step order: new ones in full, the others as a diff.
    pub seqs: Vec<ScheduledSeq>,
    /// The step's tokens, their positions, and the index into `seqs` of each one's sequence.
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    pub token_seq: Vec<u32>,
    /// Tokens whose logits the step needs, in order (the rows of the output).
    pub logits_for: Vec<usize>,
    /// What rank 0 answers with.
    pub output: OutputKind,
}

/// What a step's answer carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputKind {
    /// Sampled tokens and the log-probabilities asked for (the scheduler's steps).
    #[default]
    Sampled,
    /// The logits rows of `logits_for` (a proposer that draws its own drafts).
    Logits,
}

/// One sequence of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledSeq {
    pub id: u64,
    pub update: SeqUpdate,
    /// What to sample or score for it in this step, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleTask>,
}

/// A sequence's state for the ranks: whole on its first step, a diff afterwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SeqUpdate {
    New(NewSeq),
    Cached(CachedSeq),
}

/// A sequence the ranks do not know yet (new, preempted, or after a group restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewSeq {
    /// Virtual block table.
    pub block_table: Vec<u32>,
    /// What the sampling rank needs (absent for steps that answer with logits).
    pub sampler: Option<Box<SamplerInit>>,
}

/// A sequence the ranks know: its block table keeps its first `kept_blocks` blocks (fewer
/// when blocks held for rejected drafts were returned) and gains `new_blocks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CachedSeq {
    pub kept_blocks: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_blocks: Vec<u32>,
}

/// What to compute from one sequence's logits rows in a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SampleTask {
    /// Row of the last known token's logits, when this step completes the known tokens:
    /// the next token is sampled from it (and from the rows after it, one per draft).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_row: Option<usize>,
    /// Draft tokens verified in this step (their rows follow `logits_row`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draft: Vec<u32>,
    /// The distribution each draft token was drawn from (one vocabulary-sized row per
    /// draft), for rejection sampling; `None` for deterministic proposers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_probs: Option<Vec<Vec<f32>>>,
    /// Rows whose logits score prompt tokens (`prompt_logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_rows: Option<PromptRows>,
}

/// `rows` logits rows from `first_row`, the first of them at position `first_pos`: row
/// `i` scores prompt token `first_pos + i + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRows {
    pub first_row: usize,
    pub first_pos: usize,
    pub rows: usize,
}

/// What rank 0 answers for a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutput {
    pub step_id: u64,
    pub result: StepResult,
}

/// The answer the plan's [`OutputKind`] asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StepResult {
    /// One entry per sequence that had a [`SampleTask`], in plan order.
    Sampled(Vec<SeqSampled>),
    /// Rows follow `StepPlan::logits_for`.
    Logits { logits: Vec<f32>, vocab_size: usize },
}

/// One sequence's share of a step's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeqSampled {
    pub id: u64,
    /// Tokens decided in order: the drafts that stood, then the target's own token (none
    /// when the step only scored prompt tokens). Sampling stops at a token that ends the
    /// sequence.
    pub tokens: Vec<TokenOutput>,
    /// How many of `tokens` are drafts that stood (they come first).
    pub accepted: usize,
    /// Scores of prompt tokens from `PromptRows::first_pos + 1` on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_logprobs: Vec<TokenOutput>,
    /// The request's random stream after this step (the scheduler resends it if the
    /// sequence is admitted again).
    pub rng: Rng,
}

/// What a rank group tells whoever drives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StepReport {
    Done(Box<StepOutput>),
    /// A rank of group `generation` failed (a group already replaced must not bring the
    /// new one down).
    Failed {
        generation: u64,
        error: String,
    },
}

/// One MTP draft step for the ranks (full, not a diff: the MTP proposer keeps no state
/// on the ranks beyond the hidden states the target's steps leave).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MtpPlan {
    /// The rows: `tokens[j]` is the token *after* position `positions[j]` (whose kept hidden
    /// state is the row's previous hidden state); `seq_ids` and `block_tables` per
    /// sequence; each sequence's rows are consecutive positions.
    pub rows: StepBatch,
    /// A chained draft follows: keep each sequence's last MTP output as the previous hidden
    /// state of the position after it.
    pub chain: bool,
}

/// What rank 0 answers for an MTP step: one logits row per served sequence, in order.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct MtpOutput {
    /// Sequences drafted (those whose hidden states were all kept), in plan order.
    pub served: Vec<u64>,
    pub logits: Vec<f32>,
    pub vocab_size: usize,
}

/// A step with every sequence's full block table: what a rank computes once it has
/// applied a [`StepPlan`] to its per-sequence state (and what an [`MtpPlan`] carries).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepBatch {
    pub step_id: u64,
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    /// Index into `block_tables` of each token's sequence.
    pub token_seq: Vec<u32>,
    /// Virtual block table of each sequence.
    pub block_tables: Vec<Vec<u32>>,
    /// Tokens whose logits are needed, in order.
    pub logits_for: Vec<usize>,
    /// Request id of each block table's sequence.
    pub seq_ids: Vec<u64>,
}

/// A step turned into one rank's forward input (slots and causal lengths local to it).
pub struct LocalBatch {
    pub slots: Vec<usize>,
    pub kv_lens: Vec<u32>,
}

impl LocalBatch {
    pub fn new(batch: &StepBatch, placement: &Placement) -> Self {
        let mut slots = Vec::with_capacity(batch.tokens.len());
        let mut kv_lens = Vec::with_capacity(batch.tokens.len());
        for (&p, &s) in batch.positions.iter().zip(&batch.token_seq) {
            let table = &batch.block_tables[s as usize];
            slots.push(placement.slot(p, table).unwrap_or(usize::MAX));
            kv_lens.push(placement.local_len(p + 1) as u32);
        }
        Self { slots, kv_lens }
    }

    /// Borrows the step and this rank's view as a forward input.
    pub fn input<'a>(&'a self, batch: &'a StepBatch, tables: &'a [&'a [u32]]) -> BatchInput<'a> {
        BatchInput {
            tokens: &batch.tokens,
            positions: &batch.positions,
            token_seq: &batch.token_seq,
            slots: &self.slots,
            kv_lens: &self.kv_lens,
            block_tables: tables,
            logits_for: &batch.logits_for,
        }
    }
}

/// Shared, immutable plan as it travels to the ranks of this process.
pub type SharedPlan = Arc<StepPlan>;

#[cfg(test)]
pub(crate) mod tests;
