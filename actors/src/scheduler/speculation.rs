//! Speculative decoding in the scheduler: asking the draft actor for drafts before a
//! step, and taking the verdict when the step comes back.
//!
//! A drafted sequence runs `1 + k` query tokens in the step (its last sampled token and k
//! drafts), with logits at each; the sampling rank decides tokens one by one (greedy: the
//! argmax; sampled: rejection sampling against the draft distribution, which travels in
//! the plan) until the first rejected draft, whose position gets the target's token
//! instead; if all k stand, the last row gives one more token (see
//! [`crate::sampler::SeqSampler::decide`]). KV slots of rejected drafts are overwritten
//! later; blocks held only for them are returned.

use ractor::ActorProcessingErr;

use super::{finish_reason, SchedulerConfig, SchedulerState, Sequence};
use crate::kv_manager_actor::KvOp;
use crate::request::{FinishReason, RequestEvent, TokenOutput};
use crate::speculative::{DraftMsg, DraftRequest};

/// Steps a request waits before drafting again once its draft length fell to zero.
const COOLDOWN_STEPS: u32 = 16;

/// Speculation settings the scheduler works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationLimits {
    /// Most draft tokens per step and request.
    pub num_speculative_tokens: usize,
    /// Adapt each request's draft length to its acceptance.
    pub adaptive: bool,
}

/// One request's speculation state.
#[derive(Debug, Clone, Default)]
pub(super) struct SpecState {
    /// Drafts for the step being planned or in flight.
    pub draft: Vec<u32>,
    pub draft_probs: Option<Vec<Vec<f32>>>,
    /// Current draft length.
    pub k: usize,
    /// Steps left before drafting again.
    pub cooldown: u32,
}

impl SpecState {
    pub fn new(limits: Option<&SpeculationLimits>) -> Self {
        Self {
            k: limits.map_or(0, |l| l.num_speculative_tokens),
            ..Default::default()
        }
    }

    /// Adapts the draft length after `accepted` of `drafted` tokens stood: grow after a
    /// full acceptance, shrink to what was accepted plus one, halve after none, and pause
    /// when nothing is left, so that drafts that never stand cost (almost) nothing.
    fn adapt(&mut self, drafted: usize, accepted: usize, max: usize) {
        if drafted == 0 {
            return;
        }
        self.k = if accepted == drafted {
            (self.k + 1).min(max)
        } else if accepted == 0 {
            self.k / 2
        } else {
            (accepted + 1).min(max)
        };
        if self.k == 0 {
            self.k = 1;
            self.cooldown = COOLDOWN_STEPS;
        }
    }

    pub fn clear_draft(&mut self) {
        self.truncate_draft(0);
    }

    pub fn truncate_draft(&mut self, keep: usize) {
        self.draft.truncate(keep);
        if let Some(p) = &mut self.draft_probs {
            p.truncate(keep);
        }
        if self.draft.is_empty() {
            self.draft_probs = None;
        }
    }
}

/// Speculation counters, per model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    /// Verification steps that had at least one draft token.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// `accepted_histogram[a]`: drafts of which exactly `a` tokens stood.
    pub accepted_histogram: Vec<u64>,
}

impl SchedulerState {
    /// Asks the draft actor for drafts for the decoding sequences of micro-batch `mb`,
    /// within `budget` tokens for the whole step.
    pub(super) async fn propose_drafts(
        &mut self,
        mb: usize,
        budget: usize,
    ) -> Result<(), ActorProcessingErr> {
        let (Some(actor), Some(limits)) = (self.draft.clone(), self.cfg.speculation) else {
            return Ok(());
        };
        let base: usize = self
            .running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.micro_batch == mb)
            .map(|s| s.tokens.len() - s.num_computed)
            .sum();
        let mut spare = budget.saturating_sub(base);
        let mut batch = Vec::new();
        for &id in &self.running {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            if seq.micro_batch != mb {
                continue; // the other micro-batch may have drafts in flight
            }
            seq.spec.clear_draft();
            let decoding =
                seq.tokens.len() == seq.num_computed + 1 && seq.tokens.len() > seq.prompt_len;
            if !decoding || spare == 0 {
                continue;
            }
            if seq.spec.cooldown > 0 {
                seq.spec.cooldown -= 1;
                continue;
            }
            let p = &seq.request.params;
            let k = seq
                .spec
                .k
                .min(p.max_tokens.saturating_sub(seq.output_len() + 1))
                .min(self.cfg.max_model_len.saturating_sub(seq.tokens.len() + 1))
                .min(spare)
                .min(limits.num_speculative_tokens);
            if k == 0 {
                continue;
            }
            spare -= k;
            batch.push(DraftRequest {
                seq: id,
                tokens: seq.tokens.clone(),
                num_tokens: k,
                sampling: p.clone(),
                block_table: seq.table.clone(),
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        let wanted: Vec<usize> = batch.iter().map(|r| r.num_tokens).collect();
        let drafts = ractor::call!(actor, DraftMsg::Propose, batch)?;
        for (d, k) in drafts.into_iter().zip(wanted) {
            if let Some(seq) = self.seqs.get_mut(&d.seq) {
                let mut tokens = d.tokens;
                tokens.truncate(k);
                let probs = d.probs.map(|mut p| {
                    p.truncate(tokens.len());
                    p
                });
                seq.spec.draft_probs = probs.filter(|p| p.len() == tokens.len());
                seq.spec.draft = tokens;
            }
        }
        Ok(())
    }

    /// Tells the draft actor that `id` no longer needs draft state (the ranks learn it
    /// with the next plan of its micro-batch).
    pub(super) fn release_draft(&mut self, id: u64) {
        if let Some(d) = &self.draft {
            let _ = d.send_message(DraftMsg::Release(id));
        }
    }

    /// Takes the tokens the sampling rank decided for one sequence (`stood` of them are
    /// drafts that stood, first), sends them, and returns how many drafts stood and how
    /// the sequence ended, if it did.
    pub(super) fn accept_tokens(
        seq: &mut Sequence,
        tokens: Vec<TokenOutput>,
        stood: usize,
        cfg: &SchedulerConfig,
    ) -> (usize, Option<FinishReason>) {
        seq.spec.clear_draft();
        let mut accepted = 0;
        for (i, mut output) in tokens.into_iter().enumerate() {
            let token = output.token_id;
            let was_draft = i < stood;
            let reason = finish_reason(seq, token, cfg);
            seq.tokens.push(token);
            // Prompt scores travel once, with the first token.
            output.prompt_logprobs = seq.prompt_logprobs.take();
            if seq.events.send(RequestEvent::Token(output)).is_err() {
                return (accepted, Some(FinishReason::Abort));
            }
            if reason.is_some() {
                return (accepted + was_draft as usize, reason);
            }
            if !was_draft {
                break;
            }
            accepted += 1;
        }
        (accepted, None)
    }

    /// Records a verification and adapts the request's draft length; queues the release
    /// of blocks held only for rejected drafts.
    pub(super) fn record_verification(&mut self, id: u64, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let st = &mut self.stats.speculation;
        st.num_drafts += 1;
        st.num_draft_tokens += drafted as u64;
        st.num_accepted_tokens += accepted as u64;
        if st.accepted_histogram.len() <= accepted {
            st.accepted_histogram.resize(accepted + 1, 0);
        }
        st.accepted_histogram[accepted] += 1;
        let Some(limits) = self.cfg.speculation else {
            return;
        };
        if let Some(seq) = self.seqs.get_mut(&id) {
            if limits.adaptive {
                seq.spec
                    .adapt(drafted, accepted, limits.num_speculative_tokens);
            }
            if accepted < drafted {
                self.pending_kv.push(KvOp::Truncate {
                    seq: id,
                    num_tokens: seq.tokens.len(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_adapts_to_acceptance() {
        let mut s = SpecState::new(Some(&SpeculationLimits {
            num_speculative_tokens: 4,
            adaptive: true,
        }));
        assert_eq!(s.k, 4);
        s.adapt(4, 4, 4);
        assert_eq!(s.k, 4); // capped
        s.adapt(4, 1, 4);
        assert_eq!(s.k, 2);
        s.adapt(2, 0, 4);
        assert_eq!(s.k, 1);
        assert_eq!(s.cooldown, 0);
        s.adapt(1, 0, 4);
        assert_eq!((s.k, s.cooldown), (1, COOLDOWN_STEPS));
        s.adapt(0, 0, 4); // no draft: nothing learned
        assert_eq!(s.k, 1);
        s.adapt(1, 1, 4);
        assert_eq!(s.k, 2);
    }
}
