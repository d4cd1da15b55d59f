//! Drafting with a smaller model that shares the target's tokenizer. The draft model has
//! its own rank group (its own tp / dcp), its own KV cache and block manager; per step it
//! catches each sequence's draft KV up with the tokens accepted since, then decodes k
//! tokens autoregressively.

use std::collections::HashMap;
use std::sync::Arc;

use dcpserve_config::ParallelConfig;
use dcpserve_kernels::spec_sampling::{target_probs, TargetProbs};
use dcpserve_kernels::{sample, Rng, SamplingParams};
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::ModelFiles;
use futures::future::BoxFuture;
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;

use super::{Draft, DraftProposer, DraftRequest};
use crate::block_manager::{KvBlockManager, PrefixHit, SeqBlocks};
use crate::collective::{CollectiveActor, CollectiveArgs, CollectiveMsg};
use crate::plan::{NewSeq, OutputKind, ScheduledSeq, SeqUpdate, StepPlan, StepResult};
use crate::rank::{RankActor, RankArgs, RankMsg, StepReport, StepSink};

/// How the draft model's group is laid out and sized.
#[derive(Debug, Clone)]
pub struct DraftModelSpec {
    pub parallel: ParallelConfig,
    pub precision: WeightPrecision,
    pub block_size: usize,
    /// KV blocks per draft rank.
    pub num_blocks: usize,
    /// Compute threads per draft rank.
    pub threads_per_rank: usize,
    pub seed: u64,
}

/// One sequence's state in the draft model.
#[derive(Default)]
struct DraftSeq {
    blocks: SeqBlocks,
    /// Tokens whose KV the draft cache holds (a prefix of the sequence, plus drafts that
    /// may since have been rejected: the next request's tokens say which still stand).
    cached: Vec<u32>,
}

/// A draft model on its own rank group.
pub struct DraftModelProposer {
    ranks: Vec<ActorRef<RankMsg>>,
    collective: ActorRef<CollectiveMsg>,
    reports: mpsc::UnboundedReceiver<StepReport>,
    blocks: KvBlockManager,
    seqs: HashMap<u64, DraftSeq>,
    next_step: u64,
    /// Sequences released since the last step: the ranks forget them with the next plan.
    forgotten: Vec<u64>,
    rng: Rng,
}

impl DraftModelProposer {
    /// Brings up the draft model's collective actor and rank actors.
    pub async fn spawn(files: Arc<ModelFiles>, spec: DraftModelSpec) -> Result<Self, String> {
        let layout = spec
            .parallel
            .layout(spec.block_size, 1)
            .map_err(|e| format!("draft model: {e}"))?;
        let tp = layout.tp();
        let (collective, _) = Actor::spawn(None, CollectiveActor, CollectiveArgs::new(layout))
            .await
            .map_err(|e| format!("draft model: {e}"))?;
        let (tx, reports) = mpsc::unbounded_channel();
        let mut ranks = Vec::with_capacity(tp);
        for rank in 0..tp {
            let comms = ractor::call!(collective, CollectiveMsg::Comms, rank)
                .map_err(|e| format!("draft model: {e}"))?
                .connect()
                .map_err(|e| format!("draft model: {e}"))?;
            let args = RankArgs {
                rank,
                tp_size: tp,
                generation: 0,
                comms,
                files: files.clone(),
                precision: spec.precision,
                placement: layout.placement(rank),
                num_blocks: spec.num_blocks,
                threads: spec.threads_per_rank,
                reports: StepSink::new(tx.clone(), false),
                mtp: false,
            };
            match Actor::spawn(None, RankActor, args).await {
                Ok((r, _)) => ranks.push(r),
                Err(e) => {
                    ranks.iter().for_each(|r| r.stop(None));
                    collective.stop(None);
                    return Err(format!("draft model rank {rank}: {e}"));
                }
            }
        }
        Ok(Self {
            ranks,
            collective,
            reports,
            blocks: KvBlockManager::new(spec.num_blocks, layout.virtual_block_size(), false),
            seqs: HashMap::new(),
            next_step: 0,
            forgotten: Vec::new(),
            rng: Rng::new(spec.seed ^ 0xD4AF_7E11),
        })
    }

    /// Runs one step on the draft group and waits for its logits (and the vocabulary size).
    async fn step(&mut self, mut plan: StepPlan) -> Result<(Vec<f32>, usize), String> {
        plan.step_id = self.next_step;
        self.next_step += 1;
        plan.finished = std::mem::take(&mut self.forgotten);
        let plan = Arc::new(plan);
        for r in &self.ranks {
            r.send_message(RankMsg::Execute(plan.clone()))
                .map_err(|_| "a draft model rank stopped".to_string())?;
        }
        loop {
            match self.reports.recv().await {
                Some(StepReport::Done(out)) if out.step_id == plan.step_id => {
                    return match out.result {
                        StepResult::Logits { logits, vocab_size } => Ok((logits, vocab_size)),
                        StepResult::Sampled(_) => {
                            Err("draft model ranks answered a logits step with tokens".into())
                        }
                    }
                }
                Some(StepReport::Done(_)) => continue,
                Some(StepReport::Failed { error, .. }) => {
                    return Err(format!("draft model failed: {error}"))
                }
                None => return Err("draft model ranks are gone".into()),
            }
        }
    }

    /// Makes room for `needed` tokens of `seq`, releasing idle sequences' draft KV when
    /// memory runs short. False when even that is not enough.
    fn reserve(&mut self, seq: u64, needed: usize, active: &[u64]) -> bool {
        loop {
            let st = self.seqs.entry(seq).or_default();
            if self
                .blocks
                .allocate(&mut st.blocks, &PrefixHit::none(), needed)
            {
                return true;
            }
            let idle = self.seqs.keys().copied().find(|s| !active.contains(s));
            match idle {
                Some(s) => self.release(s),
                None => return false,
            }
        }
    }

    async fn draft(&mut self, batch: &[DraftRequest]) -> Result<Vec<Draft>, String> {
        let mut drafts = Draft::none_for(batch);
        // Sequences drafted this step: (batch index, tokens to feed, first position, k).
        let mut live: Vec<(usize, Vec<u32>, usize, usize)> = Vec::new();
        let active: Vec<u64> = batch.iter().map(|r| r.seq).collect();
        for (i, r) in batch.iter().enumerate() {
            if r.num_tokens == 0 || r.tokens.is_empty() {
                continue;
            }
            let st = self.seqs.entry(r.seq).or_default();
            // Drafts rejected since the last step are overwritten: keep the common prefix,
            // and always recompute the last known token (its logits start the draft).
            let common = st
                .cached
                .iter()
                .zip(&r.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(r.tokens.len() - 1);
            st.cached.truncate(common);
            // KV for every known token and all but the last draft.
            if !self.reserve(r.seq, r.tokens.len() + r.num_tokens - 1, &active) {
                self.release(r.seq);
                continue;
            }
            live.push((i, r.tokens[common..].to_vec(), common, r.num_tokens));
        }
        for round in 0.. {
            live.retain(|l| round < l.3);
            if live.is_empty() {
                break;
            }
            // Every sequence in full each round: the draft's own block manager is the
            // source of truth, and the ranks answer with logits (drafts are drawn here).
            let mut plan = StepPlan {
                output: OutputKind::Logits,
                ..Default::default()
            };
            for (s_idx, (i, feed, start, _)) in live.iter().enumerate() {
                for (j, &t) in feed.iter().enumerate() {
                    plan.tokens.push(t);
                    plan.positions.push(start + j);
                    plan.token_seq.push(s_idx as u32);
                }
                plan.logits_for.push(plan.tokens.len() - 1);
                let seq = batch[*i].seq;
                plan.seqs.push(ScheduledSeq {
                    id: seq,
                    update: SeqUpdate::New(NewSeq {
                        block_table: self.seqs[&seq].blocks.table().to_vec(),
                        sampler: None,
                    }),
                    sample: None,
                });
            }
            let (logits, vocab) = self.step(plan).await?;
            for (row, (i, feed, start, _)) in live.iter_mut().enumerate() {
                let r = &batch[*i];
                let logits = &logits[row * vocab..(row + 1) * vocab];
                let (token, probs) = draw(logits, &r.sampling, &mut self.rng);
                let d = &mut drafts[*i];
                d.tokens.push(token);
                if let Some(p) = probs {
                    d.probs.get_or_insert_with(Vec::new).push(p);
                }
                let st = self.seqs.get_mut(&r.seq).expect("reserved");
                st.cached.extend_from_slice(feed);
                *start += feed.len();
                *feed = vec![token];
            }
        }
        // Deterministic rows for greedy requests are not needed by the verifier, but a
        // mix of greedy and sampled tokens in one draft would misalign the rows.
        for (d, r) in drafts.iter_mut().zip(batch) {
            if d.probs.as_ref().is_some_and(|p| p.len() != d.tokens.len()) || r.sampling.is_greedy()
            {
                d.probs = None;
            }
        }
        Ok(drafts)
    }
}

/// A draft token and, for sampled requests, the distribution it was drawn from.
pub(super) fn draw(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut Rng,
) -> (u32, Option<Vec<f32>>) {
    match target_probs(logits, params) {
        TargetProbs::Greedy(t) => (t, None),
        TargetProbs::Dense(p) => {
            let q: Vec<f32> = p.iter().map(|&x| x as f32).collect();
            let t = sample(logits, params, rng);
            (t, Some(q))
        }
    }
}

impl DraftProposer for DraftModelProposer {
    fn propose<'a>(
        &'a mut self,
        batch: &'a [DraftRequest],
    ) -> BoxFuture<'a, Result<Vec<Draft>, String>> {
        Box::pin(self.draft(batch))
    }

    fn release(&mut self, seq: u64) {
        if let Some(mut st) = self.seqs.remove(&seq) {
            self.blocks.release(&mut st.blocks);
            self.forgotten.push(seq);
        }
    }

    fn method(&self) -> &'static str {
        "draft_model"
    }
}

impl Drop for DraftModelProposer {
    fn drop(&mut self) {
        for r in &self.ranks {
            r.stop(Some("draft model shut down".into()));
        }
        self.collective.stop(Some("draft model shut down".into()));
    }
}
