//! The scheduler actor: continuous batching under a token budget, chunked prefill,
//! preemption by recompute, and sampling of each step's logits.
//!
//! One step is in flight at a time; when it returns, finished sequences leave, the
//! rest gain a token, and the next plan is broadcast to the ranks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use dcpserve_kernels::sampling::apply_penalties;
use dcpserve_kernels::{log_softmax, sample, Rng};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;

use crate::block_manager::{KvBlockManager, PrefixHit, SeqBlocks};
use crate::plan::{StepOutput, StepPlan};
use crate::rank::RankMsg;
use crate::request::{FinishReason, GenerationRequest, RequestEvent, TokenOutput};

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
}

/// Counters others may read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub free_blocks: usize,
    pub total_blocks: usize,
    pub preemptions: u64,
    pub steps: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
}

/// Messages the scheduler understands.
pub enum SchedulerMsg {
    Submit {
        request: GenerationRequest,
        events: UnboundedSender<RequestEvent>,
    },
    Abort(u64),
    StepDone(Box<StepOutput>),
    StepFailed {
        error: String,
    },
    /// A (new) rank group is up.
    SetRanks(Vec<ActorRef<RankMsg>>),
    /// The rank group died: end every request that had KV state.
    RanksLost(String),
    Stats(RpcReplyPort<SchedulerStats>),
}

struct Sequence {
    prompt_len: usize,
    tokens: Vec<u32>,
    num_computed: usize,
    blocks: SeqBlocks,
    /// Which of the two ping-pong micro-batches the sequence runs in.
    micro_batch: usize,
    request: GenerationRequest,
    rng: Rng,
    events: UnboundedSender<RequestEvent>,
    /// Scores of prompt tokens gathered so far, while the request wants them and its first
    /// token has not been sent (entry `i` scores prompt token `i + 1`).
    prompt_logprobs: Option<Vec<TokenOutput>>,
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
    /// Row in the step's logits, when this chunk completes the sequence's known tokens.
    logits_row: Option<usize>,
    /// Prompt logprobs: (first logits row, position of that row, rows), one row per chunk
    /// position that predicts a prompt token.
    prompt_rows: Option<(usize, usize, usize)>,
}

/// A step the ranks are computing.
struct InFlight {
    step_id: u64,
    micro_batch: usize,
    scheduled: Vec<Scheduled>,
}

pub struct Scheduler;

pub struct SchedulerState {
    cfg: SchedulerConfig,
    blocks: KvBlockManager,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    seqs: HashMap<u64, Sequence>,
    ranks: Vec<ActorRef<RankMsg>>,
    /// Steps sent to the ranks and not yet answered, oldest first (ranks run them in order).
    in_flight: VecDeque<InFlight>,
    next_step: u64,
    stats: SchedulerStats,
}

impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerConfig;

    async fn pre_start(
        &self,
        _myself: ActorRef<SchedulerMsg>,
        cfg: SchedulerConfig,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        Ok(SchedulerState {
            blocks: KvBlockManager::new(
                cfg.num_blocks,
                cfg.tokens_per_block,
                cfg.enable_prefix_caching,
            ),
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            seqs: HashMap::new(),
            ranks: Vec::new(),
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
            SchedulerMsg::StepFailed { error } => {
                // Nothing more goes to this group until the supervisor installs a new one.
                st.ranks.clear();
                st.fail_all_running(&error);
            }
            SchedulerMsg::SetRanks(ranks) => st.ranks = ranks,
            SchedulerMsg::RanksLost(error) => {
                st.ranks.clear();
                st.fail_all_running(&error);
            }
            SchedulerMsg::Stats(port) => {
                let mut s = st.stats.clone();
                s.running = st.running.len();
                s.waiting = st.waiting.len();
                s.free_blocks = st.blocks.num_free();
                s.total_blocks = st.blocks.num_blocks();
                let pc = st.blocks.prefix_cache_stats();
                s.prefix_cache_queries = pc.queries;
                s.prefix_cache_hits = pc.hits;
                let _ = port.send(s);
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
            if let Some(plan) = st.schedule(mb) {
                let plan = Arc::new(plan);
                for r in &st.ranks {
                    r.send_message(RankMsg::Execute(plan.clone()))?;
                }
            }
        }
        Ok(())
    }
}

impl SchedulerState {
    fn submit(&mut self, request: GenerationRequest, events: UnboundedSender<RequestEvent>) {
        let len = request.prompt_ids.len();
        let reject = if len == 0 {
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
                blocks: SeqBlocks::new(),
                micro_batch: 0,
                rng: Rng::new(seed),
                prompt_logprobs: request.params.prompt_logprobs.map(|_| Vec::new()),
                request,
                events,
            },
        );
        self.waiting.push_back(id);
    }

    /// Ends a sequence now and frees its blocks.
    fn finish(&mut self, id: u64, reason: FinishReason) {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return;
        };
        self.blocks.release(&mut seq.blocks);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        let _ = seq.events.send(RequestEvent::Finished {
            reason,
            prompt_tokens: seq.prompt_len,
            completion_tokens: seq.output_len(),
        });
    }

    fn fail_all_running(&mut self, error: &str) {
        self.in_flight.clear();
        for id in std::mem::take(&mut self.running) {
            if let Some(mut seq) = self.seqs.remove(&id) {
                self.blocks.release(&mut seq.blocks);
                let _ = seq.events.send(RequestEvent::Error(format!(
                    "The model's rank group failed while serving this request: {error}"
                )));
            }
        }
        // Waiting requests that had started a prefill lost their KV state too: restart them.
        for id in &self.waiting {
            if let Some(seq) = self.seqs.get_mut(id) {
                self.blocks.release(&mut seq.blocks);
                seq.num_computed = 0;
            }
        }
        // The new rank group starts with empty KV memory: cached hashes would lie.
        let reset = self.blocks.reset_prefix_cache();
        debug_assert!(reset, "every block was released above");
    }

    /// Evicts the most recently admitted running sequence of micro-batch `mb` (never one
    /// in flight); it will be recomputed. Returns the victim.
    fn preempt_last(&mut self, mb: usize) -> Option<u64> {
        let idx = self
            .running
            .iter()
            .rposition(|id| self.seqs.get(id).is_some_and(|s| s.micro_batch == mb))?;
        let id = self.running.remove(idx);
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.blocks.release(&mut seq.blocks);
            seq.num_computed = 0;
        }
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
        Some(id)
    }

    /// Builds the next step of micro-batch `mb`, or `None` when it has nothing to do.
    fn schedule(&mut self, mb: usize) -> Option<StepPlan> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut chosen: Vec<(u64, usize)> = Vec::new();

        // Running sequences first, oldest first; preempt the newest when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = self.seqs.get_mut(&id).expect("running sequence exists");
            let n = (seq.tokens.len() - seq.num_computed).min(budget);
            if n == 0 || seq.micro_batch != mb {
                i += 1;
                continue;
            }
            if self
                .blocks
                .allocate(&mut seq.blocks, &PrefixHit::none(), seq.num_computed + n)
            {
                chosen.push((id, n));
                budget -= n;
                i += 1;
            } else {
                let Some(victim) = self.preempt_last(mb) else {
                    break;
                };
                if let Some(pos) = chosen.iter().position(|&(c, _)| c == victim) {
                    budget += chosen.remove(pos).1;
                }
                if victim == id {
                    continue; // i now points at the next sequence (or past the end)
                }
                // The victim came after `id` in `running` unless it was chosen earlier.
                i = self.running.iter().position(|&r| r == id).unwrap_or(i);
            }
        }
        let members = |st: &Self, m: usize| {
            st.running
                .iter()
                .filter(|id| st.seqs.get(id).is_some_and(|s| s.micro_batch == m))
                .count()
        };
        let overlap = self.cfg.overlap_micro_batches;
        let (mut mine, other) = (
            members(self, mb),
            if overlap { members(self, 1 - mb) } else { 0 },
        );

        // Admit waiting sequences while there is room.
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            // Keep the two micro-batches balanced so both have work to overlap.
            if overlap && mine > other {
                break;
            }
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
            // num_computed is 0 here: waiting sequences hold no blocks.
            // Prompt log-probabilities need every prompt position computed: no cache hit.
            let hit = if seq.prompt_logprobs.is_some() && seq.prompt_len > seq.num_computed {
                PrefixHit::none()
            } else {
                self.blocks.find_cached_prefix(&mut seq.blocks, &seq.tokens)
            };
            let n = (seq.tokens.len() - hit.num_tokens).min(budget);
            if !self
                .blocks
                .allocate(&mut seq.blocks, &hit, hit.num_tokens + n)
            {
                break;
            }
            seq.num_computed = hit.num_tokens;
            seq.micro_batch = mb;
            mine += 1;
            self.waiting.pop_front();
            self.running.push(id);
            chosen.push((id, n));
            budget -= n;
        }

        if chosen.is_empty() {
            return None;
        }
        let step_id = self.next_step;
        self.next_step += 1;
        let mut plan = StepPlan {
            step_id,
            ..Default::default()
        };
        let mut scheduled = Vec::with_capacity(chosen.len());
        for (s_idx, &(id, n)) in chosen.iter().enumerate() {
            let seq = &self.seqs[&id];
            let start = seq.num_computed;
            // Prompt logprobs need the logits of every position that predicts a prompt token.
            let first_prompt_row = plan.logits_for.len();
            let wants_prompt = seq.prompt_logprobs.is_some();
            for p in start..start + n {
                plan.tokens.push(seq.tokens[p]);
                plan.positions.push(p);
                plan.token_seq.push(s_idx as u32);
                if wants_prompt && p + 1 < seq.prompt_len {
                    plan.logits_for.push(plan.tokens.len() - 1);
                }
            }
            let prompt_rows = (plan.logits_for.len() > first_prompt_row).then(|| {
                (
                    first_prompt_row,
                    start,
                    plan.logits_for.len() - first_prompt_row,
                )
            });
            plan.block_tables.push(seq.blocks.table().to_vec());
            let logits_row = if start + n == seq.tokens.len() {
                plan.logits_for.push(plan.tokens.len() - 1);
                Some(plan.logits_for.len() - 1)
            } else {
                None
            };
            scheduled.push(Scheduled {
                id,
                n_tokens: n,
                logits_row,
                prompt_rows,
            });
        }
        self.in_flight.push_back(InFlight {
            step_id,
            micro_batch: mb,
            scheduled,
        });
        self.stats.steps += 1;
        Some(plan)
    }

    fn step_done(&mut self, out: StepOutput) {
        let Some(idx) = self.in_flight.iter().position(|f| f.step_id == out.step_id) else {
            tracing::warn!(got = out.step_id, "stale step result ignored");
            return;
        };
        let scheduled = self.in_flight.remove(idx).expect("index found").scheduled;
        let vocab = out.vocab_size;
        for s in scheduled {
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            }; // aborted meanwhile
            seq.num_computed += s.n_tokens;
            self.blocks
                .commit_full_blocks(&mut seq.blocks, &seq.tokens, seq.num_computed);
            if let (Some((row0, pos0, rows)), Some(acc)) =
                (s.prompt_rows, seq.prompt_logprobs.as_mut())
            {
                let k = seq.request.params.prompt_logprobs.unwrap_or(0);
                for i in 0..rows {
                    // A preempted prefill is recomputed: keep the scores already gathered.
                    if pos0 + i == acc.len() {
                        let l = &out.logits[(row0 + i) * vocab..(row0 + i + 1) * vocab];
                        acc.push(logprobs_of(l, seq.tokens[pos0 + i + 1], k));
                    }
                }
            }
            let Some(row) = s.logits_row else { continue };
            let logits = &out.logits[row * vocab..(row + 1) * vocab];
            let (token, reason) = sample_next(seq, logits, &self.cfg);
            if let Some(t) = token {
                seq.tokens.push(t);
            }
            let alive = token.is_none_or(|t| {
                let output = token_output(seq, logits, t);
                seq.events.send(RequestEvent::Token(output)).is_ok()
            });
            match (alive, reason) {
                (false, _) => self.finish(s.id, FinishReason::Abort),
                (true, Some(r)) => self.finish(s.id, r),
                (true, None) => {}
            }
        }
    }
}

/// Samples the next token and decides whether the sequence ends with it.
fn sample_next(
    seq: &mut Sequence,
    logits: &[f32],
    cfg: &SchedulerConfig,
) -> (Option<u32>, Option<FinishReason>) {
    let p = &seq.request.params;
    let is_stop =
        |t: u32| (!p.ignore_eos && cfg.eos_token_ids.contains(&t)) || p.stop_token_ids.contains(&t);
    let penalized =
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0;
    let mask_stops = seq.output_len() < p.min_tokens;
    let token = if penalized || mask_stops {
        let mut masked = logits.to_vec();
        if penalized {
            let (prompt, output) = seq.tokens.split_at(seq.prompt_len);
            apply_penalties(
                &mut masked,
                prompt,
                output,
                p.presence_penalty,
                p.frequency_penalty,
                p.repetition_penalty,
            );
        }
        if mask_stops {
            for (t, l) in masked.iter_mut().enumerate() {
                if is_stop(t as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        sample(&masked, &p.sampling, &mut seq.rng)
    } else {
        sample(logits, &p.sampling, &mut seq.rng)
    };
    let out_len = seq.output_len() + 1;
    let reason = if is_stop(token) {
        Some(FinishReason::Stop)
    } else if out_len >= p.max_tokens || seq.tokens.len() + 1 >= cfg.max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    };
    (Some(token), reason)
}

fn token_output(seq: &mut Sequence, logits: &[f32], token: u32) -> TokenOutput {
    // Prompt scores travel once, with the first token.
    let prompt_logprobs = seq.prompt_logprobs.take();
    let Some(k) = seq.request.params.logprobs else {
        return TokenOutput {
            token_id: token,
            logprob: None,
            top_logprobs: Vec::new(),
            prompt_logprobs,
        };
    };
    TokenOutput {
        prompt_logprobs,
        ..logprobs_of(logits, token, k)
    }
}

/// The log-probability of `token` under `logits` and the `k` most likely alternatives.
fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenOutput {
    let lp = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i, lp[i as usize])).collect();
    }
    TokenOutput {
        token_id: token,
        logprob: lp.get(token as usize).copied(),
        top_logprobs: top,
        prompt_logprobs: None,
    }
}
