//! The rank side of MTP drafting: the final hidden states a rank keeps from its target
//! steps, and one MTP step over them.
//!
//! Every rank of the group keeps the same hidden states (they are replicated after the
//! final norm) and sees the same plans in the same order, so every rank serves the same
//! sequences of an MTP plan and their collectives stay in step.

use std::collections::{BTreeMap, HashMap};

use dcpserve_kernels::{Backend, CpuBackend};
use dcpserve_model::arch::{ForwardOptions, RankCache, RankComms, RankModel};
use dcpserve_model::ModelError;

use crate::host_buffers::into_host;
use crate::placement::Placement;
use crate::plan::{LocalBatch, MtpOutput, MtpPlan, StepBatch};

/// Final-normed hidden states per sequence and position, from the latest step that
/// computed the position (a recomputed or re-verified position overwrites its row).
#[derive(Default)]
pub struct HiddenStore {
    seqs: HashMap<u64, BTreeMap<usize, Vec<f32>>>,
}

impl HiddenStore {
    /// Keeps every token's hidden state of `plan` (`hidden`: `[tokens, hidden_size]`).
    pub fn keep(&mut self, plan: &StepBatch, hidden: &[f32]) {
        let n = plan.tokens.len();
        if n == 0 || plan.seq_ids.len() != plan.block_tables.len() {
            return;
        }
        let h = hidden.len() / n;
        for (j, (&pos, &s)) in plan.positions.iter().zip(&plan.token_seq).enumerate() {
            self.seqs
                .entry(plan.seq_ids[s as usize])
                .or_default()
                .insert(pos, hidden[j * h..(j + 1) * h].to_vec());
        }
    }

    /// Forgets the sequences `ids`.
    pub fn release(&mut self, ids: &[u64]) {
        for id in ids {
            self.seqs.remove(id);
        }
    }

    /// The rows of `seq` at `positions`, concatenated; `None` if any is missing.
    fn rows(&self, seq: u64, positions: impl Iterator<Item = usize>) -> Option<Vec<f32>> {
        let kept = self.seqs.get(&seq)?;
        let mut out = Vec::new();
        for p in positions {
            out.extend_from_slice(kept.get(&p)?);
        }
        Some(out)
    }

    fn has(&self, seq: u64, pos: usize) -> bool {
        self.seqs.get(&seq).is_some_and(|k| k.contains_key(&pos))
    }

    /// Drops the rows of `seq` up to and including `pos` (the MTP layer consumed them).
    fn drop_through(&mut self, seq: u64, pos: usize) {
        if let Some(kept) = self.seqs.get_mut(&seq) {
            *kept = kept.split_off(&(pos + 1));
        }
    }

    fn insert(&mut self, seq: u64, pos: usize, row: Vec<f32>) {
        self.seqs.entry(seq).or_default().insert(pos, row);
    }
}

/// What one rank runs an MTP step with.
pub struct MtpContext<'a, B: Backend = CpuBackend> {
    pub model: &'a RankModel<B>,
    pub comms: &'a RankComms<B>,
    pub placement: &'a Placement,
}

impl<B: Backend> MtpContext<'_, B>
where
    B::Buffer: 'static,
{
    /// Runs the MTP layer over the rows of every sequence whose previous hidden states
    /// are all kept (the others are left out, identically on every rank), then drops the
    /// consumed rows and, for a chained plan, keeps each sequence's last MTP output as the
    /// previous hidden state of the position after it.
    pub fn run(
        &self,
        plan: &MtpPlan,
        cache: &RankCache<B>,
        hidden: &mut HiddenStore,
    ) -> Result<MtpOutput, ModelError> {
        let rows = &plan.rows;
        let h = self.model.config().hidden_size;
        let mut by_seq: Vec<Vec<usize>> = vec![Vec::new(); rows.block_tables.len()];
        for (j, &s) in rows.token_seq.iter().enumerate() {
            by_seq[s as usize].push(j);
        }
        let mut sub = StepBatch {
            step_id: rows.step_id,
            ..Default::default()
        };
        let mut prev = Vec::new();
        for (s, idx) in by_seq.iter().enumerate() {
            let seq = rows.seq_ids[s];
            // The rows from the first one after any missing hidden state (positions a
            // prefix-cache hit skipped): earlier MTP latents stay stale, which only costs
            // acceptance.
            let mut first = idx.len();
            while first > 0 && hidden.has(seq, rows.positions[idx[first - 1]]) {
                first -= 1;
            }
            let idx = &idx[first..];
            if idx.is_empty() {
                continue;
            }
            let Some(kept) = hidden.rows(seq, idx.iter().map(|&j| rows.positions[j])) else {
                continue;
            };
            let k = sub.block_tables.len() as u32;
            for &j in idx {
                sub.tokens.push(rows.tokens[j]);
                sub.positions.push(rows.positions[j]);
                sub.token_seq.push(k);
            }
            prev.extend(kept);
            sub.logits_for.push(sub.tokens.len() - 1);
            sub.block_tables.push(rows.block_tables[s].clone());
            sub.seq_ids.push(seq);
        }
        let vocab = self.model.config().vocab_size;
        if sub.tokens.is_empty() {
            return Ok(MtpOutput {
                served: Vec::new(),
                logits: Vec::new(),
                vocab_size: vocab,
            });
        }
        let local = LocalBatch::new(&sub, self.placement);
        let tables: Vec<&[u32]> = sub.block_tables.iter().map(|t| t.as_slice()).collect();
        let dev = self.model.backend();
        let prev = dev.upload(&prev)?;
        let prev = dev.view(&prev, 0..dev.len(&prev))?;
        let opts = ForwardOptions {
            mtp_prev_hidden: Some(prev),
            ..Default::default()
        };
        let input = local.input(&sub, &tables);
        let out = self.model.forward(self.comms, &input, cache, &opts)?;
        let y = into_host(dev, out.hidden.ok_or_else(no_hidden)?)?;
        let logits = into_host(dev, out.logits)?;
        for (k, &seq) in sub.seq_ids.iter().enumerate() {
            let last = sub.logits_for[k];
            let pos = sub.positions[last];
            hidden.drop_through(seq, pos);
            if plan.chain {
                hidden.insert(seq, pos + 1, y[last * h..(last + 1) * h].to_vec());
            }
        }
        Ok(MtpOutput {
            served: sub.seq_ids,
            logits,
            vocab_size: out.vocab_size,
        })
    }
}

/// A model step asked for hidden states that returned none (a broken backend or model).
fn no_hidden() -> ModelError {
    ModelError::Invalid("the step returned no hidden states".into())
}
