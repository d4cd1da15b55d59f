//! Planning one step of a micro-batch: running sequences first (growing their KV),
//! preemption of the newest when blocks run out, then admissions under the token budget.
//! Every block decision goes through the KV-block-manager actor, in one round trip per
//! step unless memory runs short.

use ractor::ActorProcessingErr;

use super::{InFlight, Scheduled, SchedulerState, Sequence};
use crate::kv_manager_actor::{KvManagerMsg, KvOp, KvReply};
use crate::plan::{
    CachedSeq, NewSeq, PromptRows, SampleTask, SamplerInit, ScheduledSeq, SeqUpdate, StepPlan,
};

impl SchedulerState {
    /// Sends `ops` to the KV-block manager and returns its replies, in order.
    pub(super) async fn kv_step(
        &mut self,
        ops: Vec<KvOp>,
    ) -> Result<Vec<KvReply>, ActorProcessingErr> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        Ok(ractor::call!(self.kv, KvManagerMsg::Step, ops)?)
    }

    /// Sends the releases and commits queued since the last round trip.
    pub(super) async fn flush_kv(&mut self) -> Result<(), ActorProcessingErr> {
        let ops = std::mem::take(&mut self.pending_kv);
        self.kv_step(ops).await?;
        Ok(())
    }

    /// Evicts the most recently admitted running sequence of micro-batch `mb` (never one
    /// in flight); it will be recomputed. Its release is queued. Returns the victim.
    fn preempt_last(&mut self, mb: usize) -> Option<u64> {
        let idx = self
            .running
            .iter()
            .rposition(|id| self.seqs.get(id).is_some_and(|s| s.micro_batch == mb))?;
        let id = self.running.remove(idx);
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.table.clear();
            seq.num_computed = 0;
            seq.spec.clear_draft();
            // Recomputed from scratch: the ranks forget it and get it whole again.
            if seq.on_ranks.take().is_some() {
                self.forgotten[mb].push(id);
            }
        }
        self.release_draft(id);
        self.pending_kv.push(KvOp::Release {
            seq: id,
            forget: false,
        });
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
        Some(id)
    }

    /// Preempts the newest sequences of micro-batch `mb` until `id` can grow by `n`
    /// tokens (then it joins `chosen`) or `id` itself is preempted. Tokens of preempted
    /// sequences return to `budget`.
    async fn preempt_for(
        &mut self,
        mb: usize,
        id: u64,
        n: usize,
        budget: &mut usize,
        chosen: &mut Vec<(u64, usize)>,
    ) -> Result<(), ActorProcessingErr> {
        while let Some(victim) = self.preempt_last(mb) {
            if let Some(pos) = chosen.iter().position(|&(c, _)| c == victim) {
                *budget += chosen.remove(pos).1;
            }
            if victim == id {
                *budget += n;
                break;
            }
            if self.try_grow(id, n).await? {
                chosen.push((id, n));
                break;
            }
        }
        Ok(())
    }

    /// Grows running sequence `id` by `n` tokens (sending the queued KV ops first);
    /// false when the blocks are not there.
    async fn try_grow(&mut self, id: u64, n: usize) -> Result<bool, ActorProcessingErr> {
        let mut ops = std::mem::take(&mut self.pending_kv);
        ops.push(KvOp::Grow {
            seq: id,
            num_tokens: self.seqs[&id].num_computed + n,
        });
        if let Some(KvReply::Grown { table }) = self.kv_step(ops).await?.pop() {
            self.seqs.get_mut(&id).expect("running").table = table;
            return Ok(true);
        }
        Ok(false)
    }

    /// Builds the next step of micro-batch `mb`, or `None` when it has nothing to do.
    pub(super) async fn schedule(
        &mut self,
        mb: usize,
    ) -> Result<Option<StepPlan>, ActorProcessingErr> {
        let mut budget = self.cfg.max_num_batched_tokens;
        self.propose_drafts(mb, budget).await?;

        // Running sequences of this micro-batch, oldest first: grow their KV for this step.
        let mut ops = std::mem::take(&mut self.pending_kv);
        let queued = ops.len();
        let mut wanted: Vec<(u64, usize)> = Vec::new();
        for &id in &self.running {
            let seq = self.seqs.get_mut(&id).expect("running");
            if seq.micro_batch != mb {
                continue;
            }
            let want = seq.tokens.len() + seq.spec.draft.len() - seq.num_computed;
            let n = want.min(budget);
            if n < want {
                // Out of budget: verify fewer drafts (or none).
                let keep = (seq.num_computed + n).saturating_sub(seq.tokens.len());
                seq.spec.truncate_draft(keep);
            }
            if n == 0 {
                continue;
            }
            ops.push(KvOp::Grow {
                seq: id,
                num_tokens: seq.num_computed + n,
            });
            wanted.push((id, n));
            budget -= n;
        }
        let replies = self.kv_step(ops).await?;
        let mut chosen: Vec<(u64, usize)> = Vec::new();
        let mut short: Vec<(u64, usize)> = Vec::new();
        for (&(id, n), reply) in wanted.iter().zip(&replies[queued..]) {
            match reply {
                KvReply::Grown { table } => {
                    self.seqs.get_mut(&id).expect("running").table = table.clone();
                    chosen.push((id, n));
                }
                _ => short.push((id, n)),
            }
        }
        // Out of blocks: preempt the newest sequences until the older ones fit.
        for (id, n) in short {
            if !self.running.contains(&id) {
                continue; // preempted already, to make room for an older sequence
            }
            // Drafts are optional: drop them before preempting anyone for them.
            let seq = self.seqs.get_mut(&id).expect("running");
            if !seq.spec.draft.is_empty() {
                let drafted = seq.spec.draft.len();
                seq.spec.clear_draft();
                let n = n - drafted;
                budget += drafted;
                if self.try_grow(id, n).await? {
                    chosen.push((id, n));
                    continue;
                }
                self.preempt_for(mb, id, n, &mut budget, &mut chosen)
                    .await?;
                continue;
            }
            self.preempt_for(mb, id, n, &mut budget, &mut chosen)
                .await?;
        }
        // Keep `chosen` in running order (preemption may have reordered nothing, but
        // retries append at the end).
        chosen.sort_by_key(|&(id, _)| self.running.iter().position(|&r| r == id));

        // Admit waiting sequences while there is room, keeping the micro-batches balanced.
        let members = |st: &Self, m: usize| {
            st.running
                .iter()
                .filter(|id| st.seqs.get(id).is_some_and(|s| s.micro_batch == m))
                .count()
        };
        let overlap = self.cfg.overlap_micro_batches;
        let mut mine = members(self, mb);
        let other = if overlap { members(self, 1 - mb) } else { 0 };
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs && !(overlap && mine > other)
        {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let seq = &self.seqs[&id];
            // Prompt log-probabilities need every prompt position computed: no cache hit.
            let use_prefix_cache =
                seq.prompt_logprobs.is_none() || seq.num_computed >= seq.prompt_len;
            let mut ops = std::mem::take(&mut self.pending_kv);
            ops.push(KvOp::Admit {
                seq: id,
                tokens: seq.tokens.clone(),
                max_new_tokens: budget,
                use_prefix_cache,
            });
            let Some(KvReply::Admitted {
                cached_tokens,
                new_tokens,
                table,
            }) = self.kv_step(ops).await?.pop()
            else {
                break;
            };
            let seq = self.seqs.get_mut(&id).expect("waiting");
            seq.num_computed = cached_tokens;
            seq.committed = seq.tokens.len();
            seq.table = table;
            seq.micro_batch = mb;
            mine += 1;
            self.waiting.pop_front();
            self.running.push(id);
            chosen.push((id, new_tokens));
            budget -= new_tokens;
        }

        if chosen.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.build_plan(mb, &chosen)))
    }

    /// The plan of the chosen `(sequence, new tokens)` pairs; records it as in flight.
    fn build_plan(&mut self, mb: usize, chosen: &[(u64, usize)]) -> StepPlan {
        let step_id = self.next_step;
        self.next_step += 1;
        let mut plan = StepPlan {
            step_id,
            micro_batch: mb,
            finished: std::mem::take(&mut self.forgotten[mb]),
            ..Default::default()
        };
        let mut scheduled = Vec::with_capacity(chosen.len());
        for (s_idx, &(id, n)) in chosen.iter().enumerate() {
            let seq = self.seqs.get_mut(&id).expect("scheduled");
            let start = seq.num_computed;
            // Prompt logprobs need the logits of every position that predicts a prompt token.
            let first_prompt_row = plan.logits_for.len();
            let wants_prompt = seq.prompt_logprobs.is_some();
            let known = seq.tokens.len();
            for p in start..start + n {
                // Past the known tokens come the drafts being verified.
                plan.tokens.push(if p < known {
                    seq.tokens[p]
                } else {
                    seq.spec.draft[p - known]
                });
                plan.positions.push(p);
                plan.token_seq.push(s_idx as u32);
                if wants_prompt && p + 1 < seq.prompt_len {
                    plan.logits_for.push(plan.tokens.len() - 1);
                }
            }
            let prompt_rows = (plan.logits_for.len() > first_prompt_row).then(|| PromptRows {
                first_row: first_prompt_row,
                first_pos: start,
                rows: plan.logits_for.len() - first_prompt_row,
            });
            // Logits of the last known token and of every draft after it.
            let draft_len = (start + n).saturating_sub(known);
            let logits_row = if start + n >= known {
                let first = plan.logits_for.len();
                let last_token = plan.tokens.len() - 1;
                plan.logits_for.extend(last_token - draft_len..=last_token);
                Some(first)
            } else {
                None
            };
            let sample = (logits_row.is_some() || prompt_rows.is_some()).then(|| SampleTask {
                logits_row,
                draft: seq.spec.draft[..draft_len].to_vec(),
                draft_probs: seq
                    .spec
                    .draft_probs
                    .as_ref()
                    .filter(|_| draft_len > 0)
                    .map(|p| p[..draft_len].to_vec()),
                prompt_rows,
            });
            plan.seqs.push(ScheduledSeq {
                id,
                update: seq_update(seq, &self.cfg.eos_token_ids, self.cfg.max_model_len),
                sample,
            });
            scheduled.push(Scheduled {
                id,
                n_tokens: n,
                samples: logits_row.is_some(),
                prompt_first_pos: prompt_rows.map(|p| p.first_pos),
                draft_len,
            });
        }
        self.in_flight.push_back(InFlight {
            step_id,
            micro_batch: mb,
            scheduled,
        });
        self.stats.steps += 1;
        plan
    }
}

/// What the ranks need to learn about `seq` for its next step: all of it when they do not
/// know it, else how its block table changed since they last saw it. Records the table as
/// known to the ranks.
fn seq_update(seq: &mut Sequence, eos_token_ids: &[u32], max_model_len: usize) -> SeqUpdate {
    let update = match &seq.on_ranks {
        None => SeqUpdate::New(NewSeq {
            block_table: seq.table.clone(),
            sampler: Some(Box::new(SamplerInit {
                params: seq.request.params.clone(),
                tokens: seq.tokens.clone(),
                prompt_len: seq.prompt_len,
                rng: seq.rng.clone(),
                eos_token_ids: eos_token_ids.to_vec(),
                max_model_len,
            })),
        }),
        Some(old) => {
            let kept = old
                .iter()
                .zip(&seq.table)
                .take_while(|(a, b)| a == b)
                .count();
            SeqUpdate::Cached(CachedSeq {
                kept_blocks: kept,
                new_blocks: seq.table[kept..].to_vec(),
            })
        }
    };
    seq.on_ranks = Some(seq.table.clone());
    update
}
