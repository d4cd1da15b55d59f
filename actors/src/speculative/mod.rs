//! Speculative decoding: draft proposers behind one interface, run by a draft actor that
//! the scheduler asks once per step.
//!
//! A proposer suggests up to k tokens per decoding sequence; the scheduler verifies them
//! in one target step through the same paged / DCP attention path as chunked prefill
//! (a multi-token query per sequence), keeps the longest accepted prefix plus one token
//! from the target, and rolls back the KV slots of the rest.
//!
//! ```
//! use dcpserve_actors::speculative::{DraftProposer, DraftRequest, NgramProposer};
//! # futures::executor::block_on(async {
//! let mut ngram = NgramProposer::new(2, 3);
//! let req = DraftRequest { seq: 1, tokens: vec![5, 6, 7, 8, 5, 6], num_tokens: 2, sampling: Default::default(), block_table: vec![] };
//! let drafts = ngram.propose(std::slice::from_ref(&req)).await.unwrap();
//! assert_eq!(drafts[0].tokens, vec![7, 8]);
//! # });
//! ```

mod actor;
mod draft_model;
mod mtp;
pub(crate) mod mtp_rank;
mod ngram;

use dcpserve_kernels::{Rng, SamplingParams};
use futures::future::BoxFuture;

pub use crate::plan::{MtpOutput, MtpPlan};
pub use actor::{DraftActor, DraftMsg};
pub use draft_model::{DraftModelProposer, DraftModelSpec};
pub use mtp::MtpProposer;
pub use ngram::NgramProposer;

/// One sequence that may be drafted for this step.
#[derive(Debug, Clone)]
pub struct DraftRequest {
    pub seq: u64,
    /// Every known token of the sequence (prompt and output so far).
    pub tokens: Vec<u32>,
    /// Most draft tokens wanted.
    pub num_tokens: usize,
    /// The request's sampling: a draft model samples its drafts the same way.
    pub sampling: dcpserve_kernels::SamplingParams,
    /// The sequence's virtual block table in the target's KV cache (covers every
    /// computed position), for proposers that share the target's cache (MTP).
    pub block_table: Vec<u32>,
}

/// Draft tokens for one sequence (possibly none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    pub seq: u64,
    pub tokens: Vec<u32>,
    /// The draft distribution each token was drawn from (one vocabulary-sized row per
    /// token), for rejection sampling; `None` for deterministic proposers.
    pub probs: Option<Vec<Vec<f32>>>,
}

impl Draft {
    /// No draft for each request of `batch`, in order.
    pub fn none_for(batch: &[DraftRequest]) -> Vec<Draft> {
        batch
            .iter()
            .map(|r| Draft {
                seq: r.seq,
                ..Default::default()
            })
            .collect()
    }
}

/// Something that proposes draft tokens: n-gram lookup, a draft model, an MTP module.
pub trait DraftProposer: Send + 'static {
    /// Drafts for each request, in order.
    fn propose<'a>(
        &'a mut self,
        batch: &'a [DraftRequest],
    ) -> BoxFuture<'a, Result<Vec<Draft>, String>>;

    /// The sequence ended or was preempted: drop any state kept for it.
    fn release(&mut self, _seq: u64) {}

    /// The target's rank group (re)started as `generation` with these ranks; proposers
    /// that run on the target's group (MTP) switch to it and drop their state.
    fn set_ranks(&mut self, _generation: u64, _ranks: Vec<ractor::ActorRef<crate::rank::RankMsg>>) {
    }

    /// The method's name as `--speculative-config` spells it.
    fn method(&self) -> &'static str;

    /// Test hook: make rank `n` of the proposer's own rank group (if it has one) fail on
    /// its next step.
    #[cfg(feature = "test-hooks")]
    fn inject_fault(&mut self, _n: usize) {}
}

/// The random stream a sampled draft token at `position` of sequence `seq` is drawn from:
/// a function of the request's seed (else the proposer's `seed` and the sequence) and the
/// position only, so the drafts, and through them the accepted tokens, do not depend on
/// which requests shared the proposer's steps. A position drawn again after a rejection
/// reuses its stream; that is sound, as the drafts past a rejection were never judged.
pub(crate) fn draft_stream(seed: u64, params: &SamplingParams, seq: u64, position: usize) -> Rng {
    let base = params
        .seed
        .unwrap_or(seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    Rng::new(
        base ^ 0xD4AF_7E11_u64.rotate_left(32)
            ^ (position as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}
