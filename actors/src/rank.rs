//! A rank actor: owns the compute thread(s) of its weight shard and KV shard.
//!
//! The actor is the mailbox; compute runs on a dedicated OS thread (kernels block for
//! milliseconds) that answers through the group's [`StepSink`] channel directly, so a
//! step costs one message hop in and one out, never one per layer. Each compute thread
//! keeps its micro-batch's sequences ([`SeqStates`]) and applies every plan's diff before
//! running it; rank 0 then samples from the step's logits and answers with token ids.
//! With two micro-batches the rank has one compute thread per micro-batch, sharing the
//! weights, the KV cache and a compute baton: while one waits in a collective the other
//! computes (see `dcpserve_kernels::overlap`). On a GPU each micro-batch thread binds
//! its own stream instead ([`bind_micro_batch`](dcpserve_kernels::StepQueues::bind_micro_batch)): no baton, the two
//! micro-batches' kernels and collectives overlap on the device.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use dcpserve_config::RankSettings;
use dcpserve_kernels::{Backend, CpuBackend, Device, KvCacheDType, ThreadPool};
use dcpserve_model::arch::{
    ForwardOptions, ForwardOutput, KvStorage, RankCache, RankComms, RankModel, TpShard, TurnPoints,
    WeightPrecision,
};
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::collective::{RankChannels, RankCommSpecs};
use crate::host_buffers::into_host;
use crate::placement::Placement;
pub use crate::plan::StepReport;
use crate::plan::{
    wire, LocalBatch, MtpOutput, MtpPlan, OutputKind, SharedPlan, StepOutput, StepPlan, StepResult,
};
use crate::rank_turns::BatonTurns;
use crate::seq_states::SeqStates;
use crate::speculative::mtp_rank::{HiddenStore, MtpContext};

/// Messages a rank actor understands.
pub enum RankMsg {
    /// Run one step.
    Execute(SharedPlan),
    /// Run one step whose plan arrives as bytes ([`wire`]), as from another process.
    ExecuteEncoded(Arc<Vec<u8>>),
    /// Run one MTP draft step (ranks that loaded the MTP layer); rank 0 answers on the port.
    Mtp(Arc<MtpPlan>, Option<MtpReply>),
    /// The compute thread died; the actor fails so its supervisor restarts the group.
    ComputeFailed(String),
    /// Test hook: make the compute thread panic on its next step.
    #[cfg(feature = "test-hooks")]
    InjectFault,
    /// Diagnostic: what this rank's KV cache has stored, answered after the steps already
    /// queued have run (those of the first micro-batch, when there are two).
    KvStorage(RpcReplyPort<KvStorage>),
}

/// Everything a rank needs to come up.
pub struct RankArgs {
    pub rank: usize,
    pub tp_size: usize,
    /// Which rank group this rank belongs to (restarts so far).
    pub generation: u64,
    /// The plain specs of the rank's communicator groups (one set per micro-batch): the
    /// rank connects to them itself when it starts, through the bootstrap, as a rank in
    /// another process would.
    pub comm_specs: RankCommSpecs,
    pub files: Arc<ModelFiles>,
    pub precision: WeightPrecision,
    /// What the rank builds its backend from: the device (CPU, or the GPU
    /// `rank mod visible` for CUDA) and how that backend computes.
    pub rank_settings: RankSettings,
    pub placement: Placement,
    pub num_blocks: usize,
    /// How the rank's KV cache stores values.
    pub kv_cache_dtype: KvCacheDType,
    /// The most tokens one step (one micro-batch) computes: each compute thread's
    /// workspace is reserved for it when the rank starts (larger steps grow it).
    pub max_step_tokens: usize,
    pub threads: usize,
    /// Where rank 0 sends step results and every rank its failures.
    pub reports: StepSink,
    /// Load the model's multi-token-prediction layer (speculative method `mtp`) and keep
    /// each step's final hidden states for it.
    pub mtp: bool,
}

/// Where rank 0 answers an MTP step.
pub type MtpReply = oneshot::Sender<Result<MtpOutput, String>>;

/// Where a rank group's answers go: a channel whose receiver is the model's scheduler (or
/// a draft proposer that drives its own group). Rank 0 sends each step's output, every
/// rank its failure. In-process today; a rank in another process would send the same
/// [`StepReport`]s as bytes.
#[derive(Clone)]
pub struct StepSink {
    tx: tokio::sync::mpsc::UnboundedSender<StepReport>,
    /// Send every report through bytes first ([`wire`]), as across a process boundary.
    encode: bool,
}

impl StepSink {
    /// A sink into `tx`; with `encode`, every report is encoded and decoded on the way.
    pub fn new(tx: tokio::sync::mpsc::UnboundedSender<StepReport>, encode: bool) -> Self {
        Self { tx, encode }
    }

    /// Sends `report`; with `encode`, fails if it does not survive the trip through bytes.
    pub(crate) fn send(&self, report: StepReport) -> Result<(), String> {
        let report = if self.encode {
            wire::round_trip(&report)?
        } else {
            report
        };
        // The receiver is gone only when the model shuts down: nothing left to tell.
        let _ = self.tx.send(report);
        Ok(())
    }
}

pub struct RankActor;

pub struct RankState {
    /// One job queue per micro-batch thread; the first also takes the other jobs.
    jobs: Vec<flume::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
}

enum Job {
    Step(SharedPlan),
    Mtp(Arc<MtpPlan>, Option<MtpReply>),
    #[cfg(feature = "test-hooks")]
    Fault,
    Storage(RpcReplyPort<KvStorage>),
}

impl Actor for RankActor {
    type Msg = RankMsg;
    type State = RankState;
    type Arguments = RankArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RankMsg>,
        args: RankArgs,
    ) -> Result<RankState, ActorProcessingErr> {
        let rank = args.rank;
        let comms = args
            .comm_specs
            .connect()
            .map_err(|e| format!("rank {rank}: connecting its communicators: {e}"))?;
        let (jobs_tx, jobs_rx): (Vec<_>, Vec<_>) = (0..comms.micro_batches.len())
            .map(|_| flume::unbounded::<Job>())
            .unzip();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name(format!("dcpserve-rank-{rank}"))
            .spawn(move || compute_thread(args, comms, jobs_rx, ready_tx, myself))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(RankState {
                jobs: jobs_tx,
                thread: Some(thread),
                rank,
            }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(format!("rank {rank}: compute thread exited while loading").into()),
        }
    }

    async fn handle(
        &self,
        _myself: ActorRef<RankMsg>,
        msg: RankMsg,
        state: &mut RankState,
    ) -> Result<(), ActorProcessingErr> {
        let jobs = state.jobs.first().ok_or("rank is shutting down")?;
        match msg {
            RankMsg::Execute(plan) => state.jobs[plan.micro_batch % state.jobs.len()]
                .send(Job::Step(plan))
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
            RankMsg::ExecuteEncoded(bytes) => {
                let plan: StepPlan =
                    wire::decode(&bytes).map_err(|e| format!("rank {}: {e}", state.rank))?;
                state.jobs[plan.micro_batch % state.jobs.len()]
                    .send(Job::Step(Arc::new(plan)))
                    .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?
            }
            RankMsg::Mtp(plan, reply) => jobs
                .send(Job::Mtp(plan, reply))
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
            #[cfg(feature = "test-hooks")]
            RankMsg::InjectFault => jobs
                .send(Job::Fault)
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
            RankMsg::ComputeFailed(e) => return Err(format!("rank {}: {e}", state.rank).into()),
            RankMsg::KvStorage(reply) => jobs
                .send(Job::Storage(reply))
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<RankMsg>,
        state: &mut RankState,
    ) -> Result<(), ActorProcessingErr> {
        // Closing the job channels ends the threads after their current step.
        state.jobs.clear();
        if let Some(t) = state.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(())
    }
}

/// The rank's compute thread: builds the rank's backend for its device, then loads and
/// serves on it ([`run_rank`], generic over the backend).
fn compute_thread(
    args: RankArgs,
    comms: RankChannels,
    jobs: Vec<flume::Receiver<Job>>,
    ready: oneshot::Sender<Result<(), String>>,
    myself: ActorRef<RankMsg>,
) {
    match args.rank_settings.device {
        Device::Cpu => {
            let settings = &args.rank_settings;
            let threads = args.threads.max(1);
            let pool = match settings.cpu_spin_us {
                Some(us) => ThreadPool::with_spin(threads, Duration::from_micros(us.into())),
                None => ThreadPool::new(threads),
            };
            let backend =
                CpuBackend::with_pool(Arc::new(pool)).with_cpu_matmul(settings.cpu_matmul);
            run_rank(args, backend, comms, jobs, ready, myself)
        }
        Device::Cuda => {
            match crate::rank_cuda::cuda_rank_backend(
                args.rank,
                &args.comm_specs,
                &args.rank_settings,
            ) {
                Ok((backend, gpu_comms)) => run_rank(args, backend, gpu_comms, jobs, ready, myself),
                Err(e) => {
                    let _ = ready.send(Err(format!("rank {}: {e}", args.rank)));
                }
            }
        }
    }
}

/// Loads the rank's shard onto `backend` and serves its micro-batches until their job
/// queues close.
fn run_rank<B: Backend>(
    args: RankArgs,
    backend: B,
    comms: RankChannels<B>,
    jobs: Vec<flume::Receiver<Job>>,
    ready: oneshot::Sender<Result<(), String>>,
    myself: ActorRef<RankMsg>,
) where
    B::Buffer: 'static,
{
    let model = match load_model(&args, backend) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let cache = match model.new_kv_cache_typed(
        args.num_blocks,
        args.placement.block_size,
        args.kv_cache_dtype,
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("rank {}: KV cache: {e}", args.rank)));
            return;
        }
    };
    // One workspace per micro-batch thread, reserved now so no step allocates
    // activations (on the CPU its pages are only touched as steps use them). Each is
    // allocated on its micro-batch's queue (a GPU stream) and kept for it.
    for mb in 0..jobs.len() {
        let reserved = model
            .backend()
            .bind_micro_batch(mb)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                model
                    .reserve_workspace(args.max_step_tokens)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = reserved {
            let _ = ready.send(Err(format!("rank {}: workspace: {e}", args.rank)));
            return;
        }
    }
    let _ = ready.send(Ok(()));
    let rank = RankCompute {
        args: &args,
        comms: &comms,
        model: &model,
        cache: &cache,
        myself: &myself,
    };
    // The first micro-batch runs on this thread, a second one on a scoped thread: both
    // end when their job queue closes or their step fails.
    std::thread::scope(|s| {
        let mut queues = jobs.into_iter().enumerate();
        let first = queues.next();
        for (mb, queue) in queues {
            let rank = &rank;
            let spawned = std::thread::Builder::new()
                .name(format!("dcpserve-rank-{}-mb{mb}", args.rank))
                .spawn_scoped(s, move || rank.serve(mb, queue));
            if let Err(e) = spawned {
                fail(&args, &myself, format!("micro-batch thread: {e}"));
                return;
            }
        }
        if let Some((mb, queue)) = first {
            rank.serve(mb, queue);
        }
    });
}

/// Loads this rank's shard (and its MTP layer when asked), turning panics into errors.
fn load_model<B: Backend>(args: &RankArgs, backend: B) -> Result<RankModel<B>, String> {
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        let mut m = RankModel::load_shard(
            backend,
            args.files.config.clone(),
            args.files.tensors.as_ref(),
            args.precision,
            TpShard {
                // Every prefill-context-parallel copy holds the whole model in TP shards.
                rank: args.rank % args.tp_size,
                size: args.tp_size,
            },
        )?;
        if args.mtp {
            m.load_mtp(args.files.tensors.as_ref(), args.precision)?;
        }
        Ok::<_, dcpserve_model::ModelError>(m)
    }));
    match loaded {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(format!("rank {}: {e}", args.rank)),
        Err(p) => Err(format!(
            "rank {}: panic while loading: {}",
            args.rank,
            panic_text(&p)
        )),
    }
}

/// What a rank's compute threads share.
struct RankCompute<'a, B: Backend> {
    args: &'a RankArgs,
    /// Communicators per micro-batch (one compute thread each), and the baton they share.
    comms: &'a RankChannels<B>,
    model: &'a RankModel<B>,
    cache: &'a RankCache<B>,
    myself: &'a ActorRef<RankMsg>,
}

/// What one micro-batch thread keeps between its jobs.
struct MicroBatch<'a, B: Backend> {
    index: usize,
    comms: &'a RankComms<B>,
    /// Hidden states for the MTP layer (only with one micro-batch).
    hidden: HiddenStore,
    /// This micro-batch's sequences: block tables, and samplers on the answering rank.
    seqs: SeqStates,
}

impl<B: Backend> RankCompute<'_, B>
where
    B::Buffer: 'static,
{
    /// Runs micro-batch `mb`'s jobs until the queue closes or a job fails; a failure
    /// fails the rank.
    fn serve(&self, mb: usize, jobs: flume::Receiver<Job>) {
        let served = self.bind_thread(mb).and_then(|mut state| {
            while let Ok(job) = jobs.recv() {
                self.run_job(&mut state, job)?;
            }
            Ok(())
        });
        if let Err(error) = served {
            fail(self.args, self.myself, error);
        }
    }

    /// Pins this thread and binds it to micro-batch `mb`'s queue (a GPU rank's stream
    /// `mb`), and makes the micro-batch's state.
    fn bind_thread(&self, mb: usize) -> Result<MicroBatch<'_, B>, String> {
        let args = self.args;
        if self.comms.baton.is_some() {
            pin_micro_batch_thread(args);
        }
        self.model
            .backend()
            .bind_micro_batch(mb)
            .map_err(|e| format!("micro-batch {mb}: {e}"))?;
        let files = args.files.clone();
        Ok(MicroBatch {
            index: mb,
            comms: &self.comms.micro_batches[mb],
            hidden: HiddenStore::default(),
            seqs: SeqStates::new(args.rank == 0).with_grammar(Arc::new(move || files.grammar())),
        })
    }

    /// One job; an error ends the thread (and the rank).
    fn run_job(&self, state: &mut MicroBatch<'_, B>, job: Job) -> Result<(), String> {
        match job {
            Job::Step(plan) => self.step(state, &plan).inspect_err(|error| {
                tracing::error!(rank = self.args.rank, "{error}");
            }),
            Job::Mtp(plan, reply) => self.mtp_step(state, &plan, reply),
            #[cfg(feature = "test-hooks")]
            Job::Fault => Err("injected fault".to_string()),
            Job::Storage(reply) => {
                let _ = reply.send(self.cache.storage());
                Ok(())
            }
        }
    }

    /// One MTP draft step; its outcome, success or error, goes to `reply`.
    fn mtp_step(
        &self,
        state: &mut MicroBatch<'_, B>,
        plan: &MtpPlan,
        reply: Option<MtpReply>,
    ) -> Result<(), String> {
        let ctx = MtpContext {
            model: self.model,
            comms: state.comms,
            placement: &self.args.placement,
        };
        let result = guarded(
            || {
                self.model.backend().begin_step()?;
                ctx.run(plan, self.cache, &mut state.hidden)
            },
            |e| format!("MTP step: {e}"),
            |p| format!("panic in an MTP step: {p}"),
        );
        let error = match result {
            Ok(out) => {
                if let Some(r) = reply {
                    let _ = r.send(Ok(out));
                }
                return Ok(());
            }
            Err(error) => error,
        };
        if let Some(r) = reply {
            let _ = r.send(Err(error.clone()));
        }
        tracing::error!(rank = self.args.rank, "{error}");
        Err(error)
    }

    /// One step of the plan: the forward pass while holding the rank's compute baton,
    /// then (rank 0) the answer.
    fn step(&self, state: &mut MicroBatch<'_, B>, plan: &StepPlan) -> Result<(), String> {
        let panicked = |p: String| format!("panic in step {}: {p}", plan.step_id);
        // Compute only while holding the rank's baton (lent out inside collectives).
        let turn = (self.comms.baton.as_ref()).map(|b| BatonTurns(b.hold(state.index)));
        let out = guarded(|| self.forward(state, plan, turn.as_ref()), |e| e, panicked)?;
        drop(turn);
        guarded(|| self.answer(state, plan, out), |e| e, panicked)
    }

    /// Applies the plan's diff and runs the forward pass; the grammar masks of
    /// constrained sequences are computed on a helper thread meanwhile (off the critical
    /// path).
    fn forward(
        &self,
        state: &mut MicroBatch<'_, B>,
        plan: &StepPlan,
        turn: Option<&BatonTurns>,
    ) -> Result<ForwardOutput<B>, String> {
        let args = self.args;
        // Recycles the step metadata staged two steps ago (GPU staging arena).
        self.model
            .backend()
            .begin_step()
            .map_err(|e| e.to_string())?;
        let MicroBatch {
            comms,
            hidden,
            seqs,
            ..
        } = state;
        let batch = seqs.apply(plan)?;
        let local = LocalBatch::new(&batch, &args.placement);
        let tables: Vec<&[u32]> = batch.block_tables.iter().map(|t| t.as_slice()).collect();
        let input = local.input(&batch, &tables);
        let masks_needed =
            args.rank == 0 && matches!(plan.output, OutputKind::Sampled) && seqs.needs_masks(plan);
        let out = std::thread::scope(|s| {
            let masks = masks_needed.then(|| {
                std::thread::Builder::new()
                    .name(format!("dcpserve-rank-{}-grammar", args.rank))
                    .spawn_scoped(s, || seqs.prepare_masks(plan))
            });
            let out = if !self.model.has_mtp() {
                let opts = ForwardOptions {
                    turns: turn.map(|t| t as &dyn TurnPoints),
                    ..Default::default()
                };
                self.model.forward(comms, &input, self.cache, &opts)
            } else {
                // The MTP layer drafts from the final hidden states of every token.
                hidden.release(&plan.finished);
                let all: Vec<usize> = (0..batch.tokens.len()).collect();
                let opts = ForwardOptions {
                    hidden_for: &all,
                    ..Default::default()
                };
                (self.model.forward(comms, &input, self.cache, &opts)).and_then(|mut out| {
                    if let Some(h) = out.hidden.take() {
                        hidden.keep(&batch, &into_host(self.model.backend(), h)?);
                    }
                    Ok(out)
                })
            };
            match masks {
                // Not spawned: `decide` computes the masks itself.
                None | Some(Err(_)) => {}
                Some(Ok(h)) => {
                    if let Err(p) = h.join() {
                        std::panic::resume_unwind(p);
                    }
                }
            }
            out
        });
        out.map_err(|e| e.to_string())
    }

    /// Rank 0 answers: it samples from the step's logits (every rank has them all) and
    /// reports the result; the other ranks have nothing to do.
    fn answer(
        &self,
        state: &mut MicroBatch<'_, B>,
        plan: &StepPlan,
        out: ForwardOutput<B>,
    ) -> Result<(), String> {
        if self.args.rank != 0 {
            return Ok(());
        }
        let seqs = &mut state.seqs;
        let dev = self.model.backend();
        let result = match plan.output {
            // Drawn where the logits are: only the tokens (and the log-probabilities
            // asked for) come to the host.
            OutputKind::Sampled if seqs.rows_drawable(plan) => {
                StepResult::Sampled(seqs.sample_rows(plan, dev, &out.logits, out.vocab_size)?)
            }
            output => {
                // Only the answering rank brings the logits to the host.
                let logits =
                    into_host(dev, out.logits).map_err(|e| format!("logits to the host: {e}"))?;
                match output {
                    OutputKind::Sampled => {
                        StepResult::Sampled(seqs.sample(plan, &logits, out.vocab_size)?)
                    }
                    OutputKind::Logits => StepResult::Logits {
                        logits,
                        vocab_size: out.vocab_size,
                    },
                }
            }
        };
        self.args
            .reports
            .send(StepReport::Done(Box::new(StepOutput {
                step_id: plan.step_id,
                result,
            })))
    }
}

/// Runs `f`, naming its error with `error` and a panic (turned into an error) with
/// `panicked`: a step that panics fails its rank, never the process.
fn guarded<T, E>(
    f: impl FnOnce() -> Result<T, E>,
    error: impl FnOnce(E) -> String,
    panicked: impl FnOnce(String) -> String,
) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(error),
        Err(p) => Err(panicked(panic_text(&p))),
    }
}

/// Pins a micro-batch thread to its rank's cores (`threads` cores per rank, in rank
/// order) when every rank has cores of its own. The two micro-batch threads of a rank
/// take turns through the baton; pinned, the one woken from a collective waits for its
/// own rank's core instead of preempting another rank's compute.
fn pin_micro_batch_thread(args: &RankArgs) {
    let per_rank = args.threads.max(1);
    let first = args.rank * per_rank;
    if first + per_rank <= dcpserve_kernels::available_cores() {
        dcpserve_kernels::pin_current_thread(first..first + per_rank);
    }
}

/// Reports a failed step to whoever drives the group and fails this rank's actor (its
/// supervisor restarts the group).
fn fail(args: &RankArgs, myself: &ActorRef<RankMsg>, error: String) {
    let _ = args.reports.send(StepReport::Failed {
        generation: args.generation,
        error: error.clone(),
    });
    let _ = myself.send_message(RankMsg::ComputeFailed(error));
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
