//! The scheduler actor: continuous batching under a token budget, chunked prefill,
//! prefix-cache hits, preemption by recompute, and the tokens each step decides.
//!
//! Plans go to the ranks as diffs (see [`crate::plan`]); rank 0 samples and answers with
//! token ids and the log-probabilities asked for, through a channel whose receiving end a
//! task of the scheduler forwards into its mailbox.
//!
//! With `overlap_micro_batches`, sequences run in two micro-batches in ping-pong: up to
//! two steps are in flight, each on its own compute thread of every rank (one computes
//! while the other waits in a collective), and while the ranks compute one, the other's
//! tokens are taken and its next plan sent. Otherwise one step is in flight at a time.
//! KV blocks are owned by the KV-block-manager actor, asked once per step.

mod batching;
mod speculation;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use dcpserve_kernels::Rng;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::kv_manager_actor::{KvManagerMsg, KvOp};
use crate::plan::{SeqSampled, StepOutput, StepReport, StepResult};
use crate::rank::RankMsg;
use crate::request::{FinishReason, GenerationRequest, RequestEvent, TokenOutput};
use crate::speculative::DraftMsg;
use speculation::SpecState;
pub use speculation::{SpecStats, SpeculationLimits};

/// Limits the scheduler works within.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens per virtual block (block size × dcp).
    pub tokens_per_block: usize,
    pub num_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub eos_token_ids: Vec<u32>,
    pub seed: u64,
    pub enable_prefix_caching: bool,
    /// Two micro-batches in ping-pong (two steps in flight) instead of one step at a time.
    pub overlap_micro_batches: bool,
    /// Speculative decoding, when a draft actor proposes tokens.
    pub speculation: Option<SpeculationLimits>,
    /// Send every plan to the ranks as bytes (and their answers back through bytes), as
    /// across a process boundary: a check that the messages carry everything.
    pub serialize_plans: bool,
}

/// Counters others may read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// Why the model cannot serve, when its rank group is lost for good.
    pub unavailable: Option<String>,
    pub running: usize,
    pub waiting: usize,
    pub free_blocks: usize,
    pub total_blocks: usize,
    pub preemptions: u64,
    pub steps: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Drafted and accepted tokens (all zero without speculative decoding).
    pub speculation: SpecStats,
    /// Tokens generated (sampled and accepted) since start, over all sequences.
    pub generated_tokens: u64,
}

/// One sequence the scheduler holds, as [`SchedulerMsg::Sequences`] reports it: what its
/// KV cache holds now. Under DCP each virtual block is allocated on every rank of the
/// DCP group and each rank stores its share of the block's tokens
/// (`dcpserve_kernels::dcp::Placement` says which).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceKv {
    /// The request id.
    pub id: u64,
    /// In the running batch (`false`: waiting, e.g. preempted or not yet admitted).
    pub running: bool,
    pub prompt_tokens: usize,
    /// Tokens generated so far.
    pub output_tokens: usize,
    /// Positions whose KV is computed and stored (the first `kv_tokens` of the sequence).
    pub kv_tokens: usize,
    /// Virtual KV blocks held (each is `tokens_per_block` positions).
    pub kv_blocks: usize,
}

/// How the message begins for requests refused or ended because the model's rank group is
/// lost for good (the engine maps it to "unavailable", HTTP 503).
pub const MODEL_CANNOT_SERVE: &str = "The model cannot serve";
/// How the message begins for running requests ended because their rank group failed.
pub const RANK_GROUP_FAILED: &str = "The model's rank group failed";

/// Messages the scheduler understands.
pub enum SchedulerMsg {
    Submit {
        request: GenerationRequest,
        events: UnboundedSender<RequestEvent>,
    },
    Abort(u64),
    StepDone(Box<StepOutput>),
    StepFailed {
        /// The rank group the failing rank belonged to: a group already replaced (its
        /// survivors fail once the group is poisoned) must not bring the new one down.
        generation: u64,
        error: String,
    },
    /// A (new) rank group is up.
    SetRanks(u64, Vec<ActorRef<RankMsg>>),
    /// The rank group died: end every request that had KV state.
    RanksLost(String),
    /// The rank group cannot be brought back (a rank process of an MPI job was lost):
    /// end every request, refuse new ones with `reason`, and say so in the stats.
    Unavailable(String),
    Stats(RpcReplyPort<SchedulerStats>),
    /// Every sequence held, running ones first: read from the scheduler's own state (no
    /// round trip to the KV-block manager), so a status page costs the decode loop one
    /// short message between steps.
    Sequences(RpcReplyPort<Vec<SequenceKv>>),
}

struct Sequence {
    prompt_len: usize,
    tokens: Vec<u32>,
    num_computed: usize,
    /// Virtual block table, as the KV-block manager last reported it.
    table: Vec<u32>,
    /// Tokens the KV-block manager knows (it hashes full blocks of them).
    committed: usize,
    /// Which of the two ping-pong micro-batches the sequence runs in.
    micro_batch: usize,
    /// The block table the ranks hold for the sequence (`None`: they do not know it, and
    /// its next step sends it whole).
    on_ranks: Option<Vec<u32>>,
    request: GenerationRequest,
    /// The request's random stream as the sampling rank last reported it (it is resent
    /// when the sequence is admitted again).
    rng: Rng,
    events: UnboundedSender<RequestEvent>,
    /// Scores of prompt tokens gathered so far, while the request wants them and its first
    /// token has not been sent (entry `i` scores prompt token `i + 1`).
    prompt_logprobs: Option<Vec<TokenOutput>>,
    spec: SpecState,
}

impl Sequence {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Per-sequence part of the step in flight.
struct Scheduled {
    id: u64,
    n_tokens: usize,
    /// Whether this chunk completes the sequence's known tokens (a token is sampled).
    samples: bool,
    /// Position of the first prompt token scored in this step, when it scores any.
    prompt_first_pos: Option<usize>,
    /// Draft tokens verified in this step.
    draft_len: usize,
}

/// A step the ranks are computing.
struct InFlight {
    step_id: u64,
    micro_batch: usize,
    scheduled: Vec<Scheduled>,
}

pub struct Scheduler;

/// What the scheduler starts with.
pub struct SchedulerArgs {
    pub config: SchedulerConfig,
    /// The receiving end of the ranks' [`crate::rank::StepSink`]s.
    pub reports: UnboundedReceiver<StepReport>,
    pub kv: ActorRef<KvManagerMsg>,
    /// The draft actor, when speculative decoding is on.
    pub draft: Option<ActorRef<DraftMsg>>,
}

pub struct SchedulerState {
    cfg: SchedulerConfig,
    kv: ActorRef<KvManagerMsg>,
    /// Releases and commits for the KV-block manager, sent with the next round trip.
    pending_kv: Vec<KvOp>,
    /// Releases of sequences aborted while a step that writes their KV is in flight
    /// beside another (two micro-batches): their blocks return once that step ends, so
    /// the other micro-batch cannot be handed blocks a rank is still writing.
    deferred_kv: Vec<(u64, KvOp)>,
    /// Per micro-batch: sequences the ranks know that ended or were preempted since that
    /// micro-batch's last plan (see [`crate::plan::StepPlan::finished`]).
    forgotten: [Vec<u64>; 2],
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    seqs: HashMap<u64, Sequence>,
    ranks: Vec<ActorRef<RankMsg>>,
    /// Which rank group `ranks` is (the supervisor counts restarts).
    generation: u64,
    /// Steps sent to the ranks and not yet answered, oldest first (ranks run them in order).
    in_flight: VecDeque<InFlight>,
    next_step: u64,
    stats: SchedulerStats,
    /// The draft actor, when speculative decoding is on.
    draft: Option<ActorRef<DraftMsg>>,
}

impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SchedulerMsg>,
        SchedulerArgs {
            config: cfg,
            reports,
            kv,
            draft,
        }: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        tokio::spawn(forward_reports(reports, myself));
        Ok(SchedulerState {
            draft,
            kv,
            pending_kv: Vec::new(),
            deferred_kv: Vec::new(),
            forgotten: Default::default(),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            seqs: HashMap::new(),
            ranks: Vec::new(),
            generation: 0,
            in_flight: VecDeque::new(),
            next_step: 0,
            stats: SchedulerStats::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        st: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SchedulerMsg::Submit { request, events } => st.submit(request, events),
            SchedulerMsg::Abort(id) => st.finish(id, FinishReason::Abort),
            SchedulerMsg::StepDone(out) => st.step_done(*out),
            SchedulerMsg::StepFailed { generation, .. } if generation != st.generation => {}
            SchedulerMsg::StepFailed { error, .. } | SchedulerMsg::RanksLost(error) => {
                // Nothing more goes to this group until the supervisor installs a new one.
                st.ranks.clear();
                st.fail_all_running(&error);
                // The new group starts with empty KV memory: cached hashes would lie.
                ractor::call!(st.kv, KvManagerMsg::Reset)?;
            }
            SchedulerMsg::Unavailable(reason) => {
                st.ranks.clear();
                st.fail_all_running(&reason);
                for id in std::mem::take(&mut st.waiting) {
                    if let Some(seq) = st.seqs.remove(&id) {
                        let _ = seq.events.send(RequestEvent::Error(format!(
                            "{MODEL_CANNOT_SERVE}: {reason}"
                        )));
                    }
                }
                st.stats.unavailable = Some(reason);
                ractor::call!(st.kv, KvManagerMsg::Reset)?;
            }
            SchedulerMsg::SetRanks(generation, ranks) => {
                st.stats.unavailable = None;
                st.generation = generation;
                // A new group knows no sequence.
                st.forgotten = Default::default();
                for seq in st.seqs.values_mut() {
                    seq.on_ranks = None;
                }
                if let Some(d) = &st.draft {
                    // A proposer on the target's group (MTP) follows it across restarts.
                    d.send_message(DraftMsg::SetRanks(generation, ranks.clone()))?;
                }
                st.ranks = ranks;
            }
            SchedulerMsg::Stats(port) => {
                st.flush_kv().await?;
                let kv = ractor::call!(st.kv, KvManagerMsg::Stats)?;
                let mut s = st.stats.clone();
                s.running = st.running.len();
                s.waiting = st.waiting.len();
                s.free_blocks = kv.num_free;
                s.total_blocks = kv.num_blocks;
                s.prefix_cache_queries = kv.prefix_cache.queries;
                s.prefix_cache_hits = kv.prefix_cache.hits;
                let _ = port.send(s);
            }
            SchedulerMsg::Sequences(port) => {
                let _ = port.send(st.sequences());
            }
        }
        // Keep up to two steps in flight on disjoint micro-batches: while the ranks compute
        // one, the other's results are sampled and its next step is planned and sent.
        let depth = if st.cfg.overlap_micro_batches { 2 } else { 1 };
        for mb in 0..depth {
            if st.ranks.is_empty() || st.in_flight.len() >= depth {
                break;
            }
            if st.in_flight.iter().any(|f| f.micro_batch == mb) {
                continue;
            }
            if let Some(plan) = st.schedule(mb).await? {
                // One copy (or one encoding) of the plan for all ranks.
                let encoded = match st.cfg.serialize_plans {
                    true => Some(Arc::new(crate::plan::wire::encode(&plan)?)),
                    false => None,
                };
                let plan = Arc::new(plan);
                let delivered = st.ranks.iter().all(|r| {
                    let msg = match &encoded {
                        Some(bytes) => RankMsg::ExecuteEncoded(bytes.clone()),
                        None => RankMsg::Execute(plan.clone()),
                    };
                    r.send_message(msg).is_ok()
                });
                if !delivered {
                    // A rank died before its failure reached us: the group is lost either
                    // way; the supervisor installs a new one.
                    st.ranks.clear();
                    st.fail_all_running("a rank stopped");
                    ractor::call!(st.kv, KvManagerMsg::Reset)?;
                }
            }
        }
        // Releases (finished, aborted) take effect now, not at the next step.
        st.flush_kv().await?;
        Ok(())
    }
}

impl SchedulerState {
    /// What [`SchedulerMsg::Sequences`] answers.
    fn sequences(&self) -> Vec<SequenceKv> {
        let running = self.running.iter().map(|id| (id, true));
        let waiting = self.waiting.iter().map(|id| (id, false));
        running
            .chain(waiting)
            .filter_map(|(&id, running)| {
                let seq = self.seqs.get(&id)?;
                Some(SequenceKv {
                    id,
                    running,
                    prompt_tokens: seq.prompt_len,
                    output_tokens: seq.output_len(),
                    kv_tokens: seq.num_computed,
                    kv_blocks: seq.table.len(),
                })
            })
            .collect()
    }

    fn submit(&mut self, request: GenerationRequest, events: UnboundedSender<RequestEvent>) {
        let len = request.prompt_ids.len();
        let reject = if let Some(reason) = &self.stats.unavailable {
            Some(format!("{MODEL_CANNOT_SERVE}: {reason}"))
        } else if len == 0 {
            Some("The prompt is empty.".to_string())
        } else if len >= self.cfg.max_model_len {
            Some(format!(
                "The prompt ({len} tokens) leaves no room to generate within the maximum model length of {} tokens.",
                self.cfg.max_model_len
            ))
        } else if (len + 1).div_ceil(self.cfg.tokens_per_block) > self.cfg.num_blocks {
            Some(format!(
                "The prompt ({len} tokens) can never fit in the KV cache ({} tokens).",
                self.cfg.num_blocks * self.cfg.tokens_per_block
            ))
        } else if (len + request.params.max_tokens)
            .min(self.cfg.max_model_len)
            .div_ceil(self.cfg.tokens_per_block)
            > self.cfg.num_blocks
        {
            // Alone in the cache it would still run out of blocks and preempt itself forever.
            Some(format!(
                "The request needs up to {} tokens of KV cache ({len} in the prompt, {} to generate) but the KV cache holds {} tokens.",
                (len + request.params.max_tokens).min(self.cfg.max_model_len),
                request.params.max_tokens,
                self.cfg.num_blocks * self.cfg.tokens_per_block
            ))
        } else if self.seqs.contains_key(&request.id) {
            Some(format!("Request id {} is already in use.", request.id))
        } else {
            None
        };
        if let Some(e) = reject {
            let _ = events.send(RequestEvent::Error(e));
            return;
        }
        let seed = request
            .params
            .seed
            .unwrap_or(self.cfg.seed ^ request.id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let id = request.id;
        self.seqs.insert(
            id,
            Sequence {
                prompt_len: len,
                tokens: request.prompt_ids.clone(),
                num_computed: 0,
                table: Vec::new(),
                committed: 0,
                micro_batch: 0,
                on_ranks: None,
                rng: Rng::new(seed),
                prompt_logprobs: request.params.prompt_logprobs.map(|_| Vec::new()),
                spec: SpecState::new(self.cfg.speculation.as_ref()),
                request,
                events,
            },
        );
        self.waiting.push_back(id);
    }

    /// Ends a sequence now and frees its blocks: at once, or when the step computing it
    /// ends if another step can run beside that one.
    fn finish(&mut self, id: u64, reason: FinishReason) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        let release = KvOp::Release {
            seq: id,
            forget: true,
        };
        match self.computing(id) {
            Some(step) if self.cfg.overlap_micro_batches => self.deferred_kv.push((step, release)),
            _ => self.pending_kv.push(release),
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        if seq.on_ranks.is_some() {
            self.forgotten[seq.micro_batch].push(id);
        }
        self.release_draft(id);
        let _ = seq.events.send(RequestEvent::Finished {
            reason,
            prompt_tokens: seq.prompt_len,
            completion_tokens: seq.output_len(),
        });
    }

    /// The step in flight that computes sequence `id`, if any.
    fn computing(&self, id: u64) -> Option<u64> {
        self.in_flight
            .iter()
            .find(|f| f.scheduled.iter().any(|s| s.id == id))
            .map(|f| f.step_id)
    }

    fn fail_all_running(&mut self, error: &str) {
        self.in_flight.clear();
        self.pending_kv.clear();
        self.deferred_kv.clear();
        for id in std::mem::take(&mut self.running) {
            if let Some(seq) = self.seqs.remove(&id) {
                let _ = seq.events.send(RequestEvent::Error(format!(
                    "{RANK_GROUP_FAILED} while serving this request: {error}"
                )));
            }
        }
        // Waiting requests that had started a prefill lost their KV state too: restart them.
        for id in &self.waiting {
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.table.clear();
                seq.num_computed = 0;
                seq.on_ranks = None;
            }
        }
        self.forgotten = Default::default();
    }

    fn step_done(&mut self, out: StepOutput) {
        let Some(idx) = self.in_flight.iter().position(|f| f.step_id == out.step_id) else {
            tracing::warn!(got = out.step_id, "stale step result ignored");
            return;
        };
        let scheduled = self.in_flight.remove(idx).expect("index found").scheduled;
        // Blocks of sequences aborted during the step are free now that it has ended.
        let (ready, later) = std::mem::take(&mut self.deferred_kv)
            .into_iter()
            .partition::<Vec<_>, _>(|(step, _)| *step == out.step_id);
        self.deferred_kv = later;
        self.pending_kv.extend(ready.into_iter().map(|(_, op)| op));
        let mut sampled: HashMap<u64, SeqSampled> = match out.result {
            StepResult::Sampled(v) => v.into_iter().map(|s| (s.id, s)).collect(),
            StepResult::Logits { .. } => {
                tracing::error!(step = out.step_id, "the ranks answered a step with logits");
                HashMap::new()
            }
        };
        for s in scheduled {
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            }; // aborted meanwhile
            seq.num_computed += s.n_tokens;
            let result = sampled.remove(&s.id);
            if (s.samples || s.prompt_first_pos.is_some()) && result.is_none() {
                let _ = seq.events.send(RequestEvent::Error(format!(
                    "Step {} came back without this request's tokens.",
                    out.step_id
                )));
                self.finish(s.id, FinishReason::Abort);
                continue;
            }
            let mut ended = None;
            let mut accepted = 0;
            if let Some(r) = result {
                seq.rng = r.rng;
                if let (Some(pos0), Some(acc)) = (s.prompt_first_pos, seq.prompt_logprobs.as_mut())
                {
                    for (i, lp) in r.prompt_logprobs.into_iter().enumerate() {
                        // A preempted prefill is recomputed: keep the scores already gathered.
                        if pos0 + i == acc.len() {
                            acc.push(lp);
                        }
                    }
                }
                if s.samples {
                    let before = seq.tokens.len();
                    (accepted, ended) =
                        SchedulerState::accept_tokens(seq, r.tokens, r.accepted, &self.cfg);
                    self.stats.generated_tokens += (seq.tokens.len() - before) as u64;
                    // Only accepted drafts keep their KV.
                    seq.num_computed -= s.draft_len - accepted;
                }
            }
            // Let the KV-block manager hash the blocks this step filled.
            self.pending_kv.push(KvOp::Commit {
                seq: s.id,
                append: seq.tokens[seq.committed..].to_vec(),
                num_computed: seq.num_computed,
            });
            seq.committed = seq.tokens.len();
            self.record_verification(s.id, s.draft_len, accepted);
            if let Some(reason) = ended {
                self.finish(s.id, reason);
            }
        }
    }
}

/// Forwards the ranks' reports into the scheduler's mailbox until either side is gone.
async fn forward_reports(
    mut reports: UnboundedReceiver<StepReport>,
    scheduler: ActorRef<SchedulerMsg>,
) {
    while let Some(report) = reports.recv().await {
        let msg = match report {
            StepReport::Done(out) => SchedulerMsg::StepDone(out),
            StepReport::Failed { generation, error } => {
                SchedulerMsg::StepFailed { generation, error }
            }
        };
        if scheduler.send_message(msg).is_err() {
            return;
        }
    }
}

/// Why a sequence ends with `token` appended (the sampling rank stops at the same token).
fn finish_reason(seq: &Sequence, token: u32, cfg: &SchedulerConfig) -> Option<FinishReason> {
    let p = &seq.request.params;
    let is_stop =
        (!p.ignore_eos && cfg.eos_token_ids.contains(&token)) || p.stop_token_ids.contains(&token);
    if is_stop {
        Some(FinishReason::Stop)
    } else if seq.output_len() + 1 >= p.max_tokens || seq.tokens.len() + 1 >= cfg.max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
