//! Sampling a step on the device that holds its logits ([`sample_rows`](dcpserve_kernels::SamplingOps::sample_rows)): when
//! every sequence the step samples is drawn from a raw logits row (one token, no
//! drafts, no prompt log-probabilities, no grammar, no penalties, no stop tokens held
//! back), only the chosen tokens and the log-probabilities asked for come to the host,
//! not the vocabulary-sized rows. Tokens, log-probabilities and the random streams come
//! out as the host path ([`SeqStates::sample`]) makes them.

use dcpserve_kernels::row_sampling::{draw_row_on_host, RowDraw, RowDrawn};
use dcpserve_kernels::{Backend, KernelError};

use super::SeqStates;
use crate::plan::{SeqSampled, StepPlan};
use crate::sampler::SeqSampler;

impl SeqStates {
    /// Whether every sequence `plan` samples can be drawn by
    /// [`SeqStates::sample_rows`] (otherwise [`SeqStates::sample`] samples the step
    /// from the logits on the host).
    pub fn rows_drawable(&self, plan: &StepPlan) -> bool {
        plan.seqs.iter().all(|s| {
            let Some(task) = &s.sample else {
                return true;
            };
            task.prompt_rows.is_none()
                && task.draft.is_empty()
                && task.draft_probs.is_none()
                && (task.logits_row.is_none()
                    || self
                        .sampler_of(s.id)
                        .is_some_and(|sm| sm.device_draw().is_some()))
        })
    }

    /// Samples the sequences of `plan` that have a task with `dev.sample_rows` on the
    /// step's `logits` (rows follow `plan.logits_for`), downloading only the rows the
    /// device leaves to the host. Requires [`SeqStates::rows_drawable`].
    pub fn sample_rows<B: Backend>(
        &mut self,
        plan: &StepPlan,
        dev: &B,
        logits: &B::Buffer,
        vocab: usize,
    ) -> Result<Vec<SeqSampled>, String> {
        let view = dev
            .view(logits, 0..dev.len(logits))
            .map_err(|e| format!("step {}: the logits: {e}", plan.step_id))?;
        self.sample_drawn(
            plan,
            |draws| dev.sample_rows(view, vocab, draws),
            |row| {
                let mut host = vec![0.0; vocab];
                let v = dev.view(logits, row * vocab..(row + 1) * vocab)?;
                dev.download(v, &mut host)?;
                Ok(host)
            },
        )
    }

    /// [`SeqStates::sample_rows`] with the device's part given: `draw` answers the
    /// draws, `row` downloads one logits row (for the draws it answers `None`).
    pub(crate) fn sample_drawn(
        &mut self,
        plan: &StepPlan,
        draw: impl FnOnce(&[RowDraw<'_>]) -> Result<Vec<Option<RowDrawn>>, KernelError>,
        mut row: impl FnMut(usize) -> Result<Vec<f32>, KernelError>,
    ) -> Result<Vec<SeqSampled>, String> {
        let step = plan.step_id;
        let missing = |id: u64| {
            format!("step {step}: no sampling state for request {id} on the sampling rank")
        };
        // The sequences with a task, in plan order, and the index of each one's draw.
        let mut tasks: Vec<(u64, Option<usize>)> = Vec::new();
        let answers = {
            let mut draws = Vec::new();
            for s in &plan.seqs {
                let Some(task) = &s.sample else {
                    continue;
                };
                if !task.draft.is_empty() || task.prompt_rows.is_some() {
                    return Err(format!(
                        "step {step}: request {} has drafts or prompt rows, which the \
                         device draw does not score",
                        s.id
                    ));
                }
                let sampler = self.sampler_of(s.id).ok_or_else(|| missing(s.id))?;
                let Some(r) = task.logits_row else {
                    tasks.push((s.id, None));
                    continue;
                };
                let (uniform, top_logprobs) = sampler.device_draw().ok_or_else(|| {
                    format!(
                        "step {step}: request {} needs the host sampler (grammar, penalties \
                         or min_tokens)",
                        s.id
                    )
                })?;
                tasks.push((s.id, Some(draws.len())));
                draws.push(RowDraw {
                    row: r,
                    params: sampler.params(),
                    uniform,
                    top_logprobs,
                });
            }
            let mut answers = draw(&draws).map_err(|e| format!("step {step}: sampling: {e}"))?;
            if answers.len() != draws.len() {
                return Err(format!(
                    "step {step}: {} answers to {} draws",
                    answers.len(),
                    draws.len()
                ));
            }
            // Rows the device does not draw exactly: on the host, from the same number.
            for (a, d) in answers.iter_mut().zip(&draws) {
                if a.is_none() {
                    let logits = row(d.row).map_err(|e| format!("step {step}: a row: {e}"))?;
                    *a = Some(draw_row_on_host(&logits, d));
                }
            }
            answers
        };
        let mut answers: Vec<Option<RowDrawn>> = answers;
        let mut out = Vec::with_capacity(tasks.len());
        for (id, at) in tasks {
            let sampler = self
                .seqs
                .get_mut(&id)
                .and_then(|st| st.sampler.as_mut())
                .ok_or_else(|| missing(id))?;
            let tokens = match at.and_then(|i| answers[i].take()) {
                Some(drawn) => vec![sampler.accept_drawn(drawn)],
                None => Vec::new(),
            };
            out.push(SeqSampled {
                id,
                tokens,
                accepted: 0,
                prompt_logprobs: Vec::new(),
                rng: sampler.rng().clone(),
            });
        }
        Ok(out)
    }

    fn sampler_of(&self, id: u64) -> Option<&SeqSampler> {
        self.seqs.get(&id).and_then(|st| st.sampler.as_ref())
    }
}

#[cfg(test)]
#[path = "row_draws_tests.rs"]
mod tests;
