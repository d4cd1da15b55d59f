//! Drafting with a smaller model that shares the target's tokenizer. The draft model has
//! its own rank group (its own tp / dcp), its own KV cache and block manager; per step it
//! catches each sequence's draft KV up with the tokens accepted since, then decodes k
//! tokens autoregressively.

use std::collections::HashMap;
use std::sync::Arc;

use dcpserve_config::{MergeExchange, RankSettings};
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::spec_sampling::{target_probs, TargetProbs};
use dcpserve_kernels::{sample, KvCacheDType, Rng, SamplingParams};

use super::draft_stream;
use dcpserve_model::arch::WeightPrecision;
use dcpserve_model::ModelFiles;
use futures::future::BoxFuture;
use ractor::ActorCell;
use tokio::sync::mpsc;

use super::{Draft, DraftProposer, DraftRequest};
use crate::block_manager::{KvBlockManager, PrefixHit, SeqBlocks};
use crate::plan::{NewSeq, OutputKind, ScheduledSeq, SeqUpdate, StepPlan, StepResult};
use crate::rank::{RankMsg, StepReport};
use crate::rank_group::{RankGroup, RankGroupSpec};

/// How the draft model's group is laid out and sized.
#[derive(Debug, Clone)]
pub struct DraftModelSpec {
    /// The draft group's layout, resolved against the draft model
    /// (`dcpserve_config::resolve`).
    pub layout: Layout,
    pub precision: WeightPrecision,
    /// What the draft ranks build their backends from (the target's settings).
    pub rank_settings: RankSettings,
    /// KV blocks per draft rank.
    pub num_blocks: usize,
    /// How the draft ranks' KV caches store values (the target's type).
    pub kv_cache_dtype: KvCacheDType,
    /// The most tokens one draft step computes (the ranks reserve their workspaces for it).
    pub max_step_tokens: usize,
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

/// A draft model on its own rank group, built and supervised like the target's: when
/// one of its ranks fails, the group is torn down and a new generation started, the
/// drafts of that step are dropped, and drafting resumes from scratch (the new group's
/// KV is empty).
pub struct DraftModelProposer {
    group: Option<RankGroup>,
    group_spec: RankGroupSpec,
    supervisor: ActorCell,
    reports_tx: mpsc::UnboundedSender<StepReport>,
    reports: mpsc::UnboundedReceiver<StepReport>,
    blocks: KvBlockManager,
    seqs: HashMap<u64, DraftSeq>,
    next_step: u64,
    /// Sequences released since the last step: the ranks forget them with the next plan.
    forgotten: Vec<u64>,
    /// Seeds the draft streams of requests without a seed of their own.
    seed: u64,
}

/// Why a draft step produced no logits.
enum DraftStepError {
    /// A rank of the draft group failed: the group must be replaced.
    GroupFailed(String),
    /// Anything else (a malformed answer).
    Other(String),
}

impl DraftModelProposer {
    /// Brings up the draft model's rank group, linked to `supervisor`.
    pub async fn spawn(
        files: Arc<ModelFiles>,
        spec: DraftModelSpec,
        supervisor: ActorCell,
    ) -> Result<Self, String> {
        let layout = spec.layout;
        let group_spec = RankGroupSpec {
            files,
            precision: spec.precision,
            rank_settings: spec.rank_settings,
            layout,
            num_blocks: spec.num_blocks,
            kv_cache_dtype: spec.kv_cache_dtype,
            max_step_tokens: spec.max_step_tokens,
            threads_per_rank: spec.threads_per_rank,
            explicit_threads: false,
            link: None,
            dcp_merge: MergeExchange::default(),
            mtp: false,
            serialize_reports: false,
            // A draft model's ranks stay in process 0, whatever the target's executor.
            executor: Default::default(),
        };
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let group = RankGroup::start(&group_spec, 0, reports_tx.clone(), supervisor.clone())
            .await
            .map_err(|e| format!("draft model: {e}"))?;
        Ok(Self {
            group: Some(group),
            group_spec,
            supervisor,
            reports_tx,
            reports,
            blocks: KvBlockManager::new(spec.num_blocks, layout.virtual_block_size(), false),
            seqs: HashMap::new(),
            next_step: 0,
            forgotten: Vec::new(),
            seed: spec.seed ^ 0xD4AF_7E11,
        })
    }

    /// Runs one step on the draft group and waits for its logits (and the vocabulary size).
    async fn step(&mut self, mut plan: StepPlan) -> Result<(Vec<f32>, usize), DraftStepError> {
        let Some(group) = &self.group else {
            return Err(DraftStepError::GroupFailed(
                "the draft group is down".into(),
            ));
        };
        let generation = group.generation();
        plan.step_id = self.next_step;
        self.next_step += 1;
        plan.finished = std::mem::take(&mut self.forgotten);
        let plan = Arc::new(plan);
        for r in group.ranks() {
            r.send_message(RankMsg::Execute(plan.clone()))
                .map_err(|_| {
                    DraftStepError::GroupFailed("a draft model rank stopped".to_string())
                })?;
        }
        loop {
            match self.reports.recv().await {
                Some(StepReport::Done(out)) if out.step_id == plan.step_id => {
                    return match out.result {
                        StepResult::Logits { logits, vocab_size } => Ok((logits, vocab_size)),
                        StepResult::Sampled(_) => Err(DraftStepError::Other(
                            "draft model ranks answered a logits step with tokens".into(),
                        )),
                    }
                }
                Some(StepReport::Failed {
                    generation: g,
                    error,
                }) if g == generation => return Err(DraftStepError::GroupFailed(error)),
                // Answers of earlier steps, or of a generation already replaced.
                Some(_) => continue,
                None => unreachable!("the proposer holds a sender of its own reports"),
            }
        }
    }

    /// Replaces a failed draft group with a new generation; every sequence starts over.
    async fn restart_group(&mut self, why: &str) -> Result<(), String> {
        let generation = self.group.as_ref().map_or(0, |g| g.generation()) + 1;
        tracing::error!("draft model rank failed: {why}; restarting the draft group");
        if let Some(group) = self.group.take() {
            group.tear_down("draft group restart").await;
        }
        // Dropping the chains gives their blocks back to the block manager.
        self.seqs.clear();
        self.blocks.reclaim_dropped();
        self.forgotten.clear();
        let group = RankGroup::start(
            &self.group_spec,
            generation,
            self.reports_tx.clone(),
            self.supervisor.clone(),
        )
        .await
        .map_err(|e| format!("draft model restart: {e}"))?;
        self.group = Some(group);
        Ok(())
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
            let (logits, vocab) = match self.step(plan).await {
                Ok(answer) => answer,
                Err(DraftStepError::Other(e)) => return Err(e),
                Err(DraftStepError::GroupFailed(e)) => {
                    // This step's drafts are lost; the verifier decodes without them.
                    self.restart_group(&e).await?;
                    return Ok(Draft::none_for(batch));
                }
            };
            for (row, (i, feed, start, _)) in live.iter_mut().enumerate() {
                let r = &batch[*i];
                let logits = &logits[row * vocab..(row + 1) * vocab];
                let mut rng = draft_stream(self.seed, &r.sampling, r.seq, r.tokens.len() + round);
                let (token, probs) = draw(logits, &r.sampling, &mut rng);
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

    #[cfg(feature = "test-hooks")]
    fn inject_fault(&mut self, n: usize) {
        if let Some(r) = self.group.as_ref().and_then(|g| g.ranks().get(n)) {
            let _ = r.send_message(RankMsg::InjectFault);
        }
    }
}

impl Drop for DraftModelProposer {
    fn drop(&mut self) {
        if let Some(group) = &self.group {
            for r in group.ranks() {
                r.stop(Some("draft model shut down".into()));
            }
            group
                .collective()
                .stop(Some("draft model shut down".into()));
        }
    }
}
