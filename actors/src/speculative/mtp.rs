//! Drafting with DeepSeek-V3's multi-token-prediction layer on the target's own rank group.
//!
//! The MTP layer (see `dcpserve_model::arch::mla::mtp`) drafts the token after next from
//! the target's final hidden state at a position and the token after it. Its latents live
//! in one extra layer of the target's KV cache, at the same slots (it shares the target's
//! block tables), so it needs no blocks of its own.
//!
//! The ranks keep the hidden states of every position they compute. Before drafting for a
//! sequence of `L` tokens, the MTP layer catches up lazily over the positions it has not
//! seen yet, up to `L - 2` (every position below the target's `num_computed`, all computed
//! with the tokens that stood), in one MTP step for all sequences; the logits of the last
//! row give the first draft. Further drafts chain: the MTP output at `L - 2` is the
//! previous hidden state of `L - 1`, whose token is the first draft, and so on. Chained
//! positions are speculative; the next catch-up rewrites them. Drafts only change speed,
//! never output: the target verifies each one.
//!
//! The MTP step runs between target steps (the scheduler waits for the drafts before it
//! sends the next plan), which is why `mtp` does not combine with overlapped micro-batches.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::ActorRef;
use tokio::sync::oneshot;

use super::draft_model::draw;
use super::draft_stream;
use super::{Draft, DraftProposer, DraftRequest};
use crate::plan::{MtpOutput, MtpPlan};
use crate::rank::RankMsg;

/// MTP drafting on the target's rank group.
pub struct MtpProposer {
    ranks: Vec<ActorRef<RankMsg>>,
    /// Per sequence: positions `0..done` have MTP latents computed from real hidden states.
    done: HashMap<u64, usize>,
    /// Tokens per virtual block of the target's cache (block size × dcp).
    virtual_block: usize,
    next_step: u64,
    /// Seeds the draft streams of requests without a seed of their own.
    seed: u64,
}

/// One sequence being drafted: batch index, next position, its token, drafts wanted.
struct Live {
    i: usize,
    pos: usize,
    token: u32,
    k: usize,
}

impl MtpProposer {
    /// A proposer for a target whose virtual blocks hold `virtual_block` tokens; it drafts
    /// once the scheduler hands it the ranks ([`DraftProposer::set_ranks`]).
    pub fn new(virtual_block: usize, seed: u64) -> Self {
        Self {
            ranks: Vec::new(),
            done: HashMap::new(),
            virtual_block: virtual_block.max(1),
            next_step: 0,
            seed: seed ^ 0x3A7B_11E5,
        }
    }

    /// Sends `plan` to every rank and waits for rank 0's answer; `None` when the group
    /// went down (drafting pauses until the next group).
    async fn step(&mut self, mut plan: MtpPlan) -> Option<MtpOutput> {
        plan.rows.step_id = self.next_step;
        self.next_step += 1;
        let plan = Arc::new(plan);
        let (tx, rx) = oneshot::channel();
        let mut tx = Some(tx);
        for r in &self.ranks {
            if r.send_message(RankMsg::Mtp(plan.clone(), tx.take()))
                .is_err()
            {
                self.ranks.clear();
                return None;
            }
        }
        match rx.await {
            Ok(Ok(out)) => Some(out),
            Ok(Err(e)) => {
                tracing::warn!("MTP step failed: {e}");
                self.ranks.clear();
                None
            }
            Err(_) => {
                self.ranks.clear();
                None
            }
        }
    }

    async fn draft(&mut self, batch: &[DraftRequest]) -> Vec<Draft> {
        let mut drafts = Draft::none_for(batch);
        if self.ranks.is_empty() {
            return drafts;
        }
        // Round 0: catch up over positions done..=L-2 and draft from the last.
        let mut plan = MtpPlan::default();
        let mut live = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            let len = r.tokens.len();
            if r.num_tokens == 0 || len < 2 || r.block_table.is_empty() {
                continue;
            }
            let last = len - 2;
            let start = self.done.get(&r.seq).copied().unwrap_or(0).min(last);
            let s = plan.rows.block_tables.len() as u32;
            for p in start..=last {
                plan.rows.tokens.push(r.tokens[p + 1]);
                plan.rows.positions.push(p);
                plan.rows.token_seq.push(s);
            }
            plan.rows.block_tables.push(r.block_table.clone());
            plan.rows.seq_ids.push(r.seq);
            live.push(Live {
                i,
                pos: last,
                token: 0,
                k: r.num_tokens,
            });
        }
        let mut round = 0;
        while !live.is_empty() {
            plan.chain = live.iter().any(|l| l.k > round + 1);
            let Some(out) = self.step(std::mem::take(&mut plan)).await else {
                return drafts;
            };
            let vocab = out.vocab_size;
            let rows: HashMap<u64, usize> = out
                .served
                .iter()
                .enumerate()
                .map(|(j, &s)| (s, j))
                .collect();
            let mut next = Vec::new();
            for mut l in live {
                let r = &batch[l.i];
                let Some(&row) = rows.get(&r.seq) else {
                    continue; // hidden states not kept (e.g. a prefix-cache hit): no draft
                };
                if round == 0 {
                    self.done.insert(r.seq, l.pos + 1);
                }
                let logits = &out.logits[row * vocab..(row + 1) * vocab];
                let mut rng = draft_stream(self.seed, &r.sampling, r.seq, r.tokens.len() + round);
                let (token, probs) = draw(logits, &r.sampling, &mut rng);
                let d = &mut drafts[l.i];
                d.tokens.push(token);
                if let Some(p) = probs {
                    d.probs.get_or_insert_with(Vec::new).push(p);
                }
                // A chained draft at the next position needs its KV slot in the table.
                l.pos += 1;
                l.token = token;
                if l.k > round + 1 && r.block_table.len() * self.virtual_block > l.pos {
                    next.push(l);
                }
            }
            round += 1;
            live = next;
            for (s, l) in live.iter().enumerate() {
                plan.rows.tokens.push(l.token);
                plan.rows.positions.push(l.pos);
                plan.rows.token_seq.push(s as u32);
                plan.rows.block_tables.push(batch[l.i].block_table.clone());
                plan.rows.seq_ids.push(batch[l.i].seq);
            }
        }
        for (d, r) in drafts.iter_mut().zip(batch) {
            if d.probs.as_ref().is_some_and(|p| p.len() != d.tokens.len()) || r.sampling.is_greedy()
            {
                d.probs = None;
            }
        }
        drafts
    }
}

impl DraftProposer for MtpProposer {
    fn propose<'a>(
        &'a mut self,
        batch: &'a [DraftRequest],
    ) -> BoxFuture<'a, Result<Vec<Draft>, String>> {
        Box::pin(async move { Ok(self.draft(batch).await) })
    }

    fn release(&mut self, seq: u64) {
        // The ranks drop their hidden states with the scheduler's next plan.
        self.done.remove(&seq);
    }

    fn set_ranks(&mut self, _generation: u64, ranks: Vec<ActorRef<RankMsg>>) {
        // A new group starts with empty caches and no hidden states.
        self.done.clear();
        self.ranks = ranks;
    }

    fn method(&self) -> &'static str {
        "mtp"
    }
}
