//! The ranks' side of plan diffs: each sequence's block table (and, on the sampling rank,
//! its sampler) kept by request id, updated by every plan in step order.

use std::collections::HashMap;

use crate::plan::{SeqSampled, SeqUpdate, StepBatch, StepPlan};
use crate::sampler::{GrammarSource, SeqSampler};

mod row_draws;

/// One compute thread's sequences (one per micro-batch: a sequence runs in one
/// micro-batch at a time, so the two threads never share an entry).
#[derive(Default)]
pub struct SeqStates {
    seqs: HashMap<u64, SeqState>,
    /// Whether this rank samples (keeps the samplers plans bring).
    samples: bool,
    /// The grammar engine of constrained sequences (on the sampling rank).
    grammar: Option<GrammarSource>,
}

struct SeqState {
    table: Vec<u32>,
    sampler: Option<SeqSampler>,
}

impl SeqStates {
    /// Empty state; `samples`: this rank answers the steps and samples their tokens.
    pub fn new(samples: bool) -> Self {
        Self {
            seqs: HashMap::new(),
            samples,
            grammar: None,
        }
    }

    /// Where constrained sequences get their grammar engine.
    pub fn with_grammar(mut self, source: GrammarSource) -> Self {
        self.grammar = Some(source);
        self
    }

    /// Whether a sequence `plan` samples has a grammar constraint (its masks are then
    /// computed by [`SeqStates::prepare_masks`] alongside the forward pass).
    pub fn needs_masks(&self, plan: &StepPlan) -> bool {
        plan.seqs.iter().any(|s| {
            s.sample.as_ref().is_some_and(|t| t.logits_row.is_some())
                && self
                    .seqs
                    .get(&s.id)
                    .and_then(|st| st.sampler.as_ref())
                    .is_some_and(SeqSampler::is_constrained)
        })
    }

    /// Computes the grammar masks of every constrained sequence `plan` samples: the next
    /// token's and one per draft token (until the grammar rejects one). Runs on a helper
    /// thread while the rank computes the step's logits.
    pub fn prepare_masks(&mut self, plan: &StepPlan) {
        for s in &plan.seqs {
            let Some(task) = s.sample.as_ref().filter(|t| t.logits_row.is_some()) else {
                continue;
            };
            if let Some(sampler) = self.seqs.get_mut(&s.id).and_then(|st| st.sampler.as_mut()) {
                sampler.prepare_masks(&task.draft);
            }
        }
    }

    /// How many sequences are kept.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether no sequence is kept.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Forgets `plan.finished`, applies its new sequences and diffs, and returns the step
    /// with every sequence's full block table. A diff for an unknown sequence is an error
    /// (a plan was lost or applied out of order).
    pub fn apply(&mut self, plan: &StepPlan) -> Result<StepBatch, String> {
        for id in &plan.finished {
            self.seqs.remove(id);
        }
        let mut batch = StepBatch {
            step_id: plan.step_id,
            tokens: plan.tokens.clone(),
            positions: plan.positions.clone(),
            token_seq: plan.token_seq.clone(),
            block_tables: Vec::with_capacity(plan.seqs.len()),
            logits_for: plan.logits_for.clone(),
            seq_ids: Vec::with_capacity(plan.seqs.len()),
        };
        for s in &plan.seqs {
            let table = match &s.update {
                SeqUpdate::New(new) => {
                    let sampler = new
                        .sampler
                        .as_ref()
                        .filter(|_| self.samples)
                        .map(|init| SeqSampler::new(init).with_grammar(self.grammar.clone()));
                    let state = SeqState {
                        table: new.block_table.clone(),
                        sampler,
                    };
                    self.seqs.insert(s.id, state);
                    &self.seqs[&s.id].table
                }
                SeqUpdate::Cached(diff) => {
                    let st = self.seqs.get_mut(&s.id).ok_or_else(|| {
                        format!(
                            "step {}: a diff for request {} that this rank does not know",
                            plan.step_id, s.id
                        )
                    })?;
                    if diff.kept_blocks > st.table.len() {
                        return Err(format!(
                            "step {}: request {} keeps {} blocks of {}",
                            plan.step_id,
                            s.id,
                            diff.kept_blocks,
                            st.table.len()
                        ));
                    }
                    st.table.truncate(diff.kept_blocks);
                    st.table.extend_from_slice(&diff.new_blocks);
                    &st.table
                }
            };
            batch.block_tables.push(table.clone());
            batch.seq_ids.push(s.id);
        }
        Ok(batch)
    }

    /// Samples (and scores) the sequences of `plan` that have a task, from the step's
    /// `logits` (rows follow `plan.logits_for`).
    pub fn sample(
        &mut self,
        plan: &StepPlan,
        logits: &[f32],
        vocab: usize,
    ) -> Result<Vec<SeqSampled>, String> {
        let row = |r: usize| &logits[r * vocab..(r + 1) * vocab];
        let mut out = Vec::new();
        for s in &plan.seqs {
            let Some(task) = &s.sample else {
                continue;
            };
            let sampler = self
                .seqs
                .get_mut(&s.id)
                .and_then(|st| st.sampler.as_mut())
                .ok_or_else(|| {
                    format!(
                        "step {}: no sampling state for request {} on the sampling rank",
                        plan.step_id, s.id
                    )
                })?;
            let prompt_logprobs = match task.prompt_rows {
                Some(p) => (0..p.rows)
                    .map(|i| sampler.prompt_logprob(row(p.first_row + i), p.first_pos + i))
                    .collect(),
                None => Vec::new(),
            };
            let (tokens, accepted) = match task.logits_row {
                Some(first) => {
                    let rows: Vec<&[f32]> = (first..=first + task.draft.len()).map(row).collect();
                    sampler.decide(&rows, &task.draft, task.draft_probs.as_deref())
                }
                None => (Vec::new(), 0),
            };
            out.push(SeqSampled {
                id: s.id,
                tokens,
                accepted,
                prompt_logprobs,
                rng: sampler.rng().clone(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{plan, sampler_init};
    use crate::plan::{CachedSeq, NewSeq, SampleTask, ScheduledSeq};

    #[test]
    fn ranks_apply_diffs_in_step_order() {
        let mut states = SeqStates::new(true);
        let first = StepPlan {
            step_id: 0,
            seqs: vec![
                ScheduledSeq {
                    id: 6,
                    update: SeqUpdate::New(NewSeq {
                        block_table: vec![4, 5],
                        sampler: Some(Box::new(sampler_init())),
                    }),
                    sample: None,
                },
                ScheduledSeq {
                    id: 3,
                    update: SeqUpdate::New(NewSeq {
                        block_table: vec![1],
                        sampler: None,
                    }),
                    sample: None,
                },
            ],
            ..Default::default()
        };
        let batch = states.apply(&first).unwrap();
        assert_eq!(batch.block_tables, vec![vec![4, 5], vec![1]]);
        assert_eq!(batch.seq_ids, vec![6, 3]);
        assert_eq!(states.len(), 2);

        // Sequence 6 returned its last block (rejected drafts) and got two others; 3 ended.
        let batch = states.apply(&plan()).unwrap();
        assert_eq!(batch.block_tables, vec![vec![0, 7, 2], vec![4, 11]]);
        assert_eq!(batch.seq_ids, vec![5, 6]);
        assert_eq!(batch.step_id, 12);
        assert_eq!(batch.tokens, plan().tokens);
        assert_eq!(states.len(), 2, "3 forgotten, 5 new");

        // A diff for a sequence the ranks forgot (or never knew) is an error, not a guess.
        let stale = StepPlan {
            step_id: 13,
            finished: vec![6],
            seqs: vec![ScheduledSeq {
                id: 6,
                update: SeqUpdate::Cached(CachedSeq::default()),
                sample: None,
            }],
            ..Default::default()
        };
        let err = states.apply(&stale).unwrap_err();
        assert!(err.contains("request 6"), "{err}");
    }

    #[test]
    fn only_the_sampling_rank_samples() {
        let new_seq = |id| ScheduledSeq {
            id,
            update: SeqUpdate::New(NewSeq {
                block_table: vec![0],
                sampler: Some(Box::new(sampler_init())),
            }),
            sample: Some(SampleTask {
                logits_row: Some(0),
                ..Default::default()
            }),
        };
        let step = StepPlan {
            seqs: vec![new_seq(1)],
            tokens: vec![7],
            positions: vec![4],
            token_seq: vec![0],
            logits_for: vec![0],
            ..Default::default()
        };
        let logits = [0.0f32, 1.0, 9.0, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0];
        let mut sampling = SeqStates::new(true);
        sampling.apply(&step).unwrap();
        let out = sampling.sample(&step, &logits, logits.len()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tokens.len(), 1);
        assert_eq!(out[0].accepted, 0);
        assert_eq!(out[0].tokens[0].top_logprobs.len(), 3);
        assert_ne!(
            out[0].rng,
            sampler_init().rng,
            "the draw advanced the stream"
        );

        let mut other = SeqStates::new(false);
        other.apply(&step).unwrap();
        assert!(other.sample(&step, &logits, logits.len()).is_err());
    }
}
