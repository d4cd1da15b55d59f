//! A rank actor: owns one compute thread with its weight shard and KV shard.
//!
//! The actor is the mailbox; compute runs on a dedicated OS thread (kernels block for
//! milliseconds) that answers the scheduler directly, so a step costs one message hop
//! in and one out, never one per layer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use dcpserve_kernels::ThreadPool;
use dcpserve_model::arch::{KvStorage, RankComms, RankModel, TpShard, WeightPrecision};
use dcpserve_model::ModelFiles;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::placement::Placement;
use crate::plan::{LocalBatch, SharedPlan, StepOutput};
use crate::scheduler::SchedulerMsg;
use crate::speculative::mtp_rank::{HiddenStore, MtpContext};
use crate::speculative::{MtpOutput, MtpPlan};

/// Messages a rank actor understands.
pub enum RankMsg {
    /// Run one step.
    Execute(SharedPlan),
    /// Run one MTP draft step (ranks that loaded the MTP layer); rank 0 answers on the port.
    Mtp(Arc<MtpPlan>, Option<MtpReply>),
    /// The compute thread died; the actor fails so its supervisor restarts the group.
    ComputeFailed(String),
    /// Test hook: make the compute thread panic on its next step.
    InjectFault,
    /// Diagnostic: what this rank's KV cache has stored, answered after the steps already
    /// queued have run.
    KvStorage(RpcReplyPort<KvStorage>),
}

/// Everything a rank needs to come up.
pub struct RankArgs {
    pub rank: usize,
    pub tp_size: usize,
    /// Which rank group this rank belongs to (restarts so far).
    pub generation: u64,
    pub comms: RankComms,
    pub files: Arc<ModelFiles>,
    pub precision: WeightPrecision,
    pub placement: Placement,
    pub num_blocks: usize,
    pub threads: usize,
    /// Where rank 0 sends step results and every rank its failures.
    pub reports: StepSink,
    /// Load the model's multi-token-prediction layer (speculative method `mtp`) and keep
    /// each step's final hidden states for it.
    pub mtp: bool,
}

/// Where rank 0 answers an MTP step.
pub type MtpReply = oneshot::Sender<Result<MtpOutput, String>>;

/// What a rank group tells whoever drives it.
pub enum StepReport {
    Done(Box<StepOutput>),
    Failed { generation: u64, error: String },
}

/// Where a rank group's step results go: the model's scheduler, or a draft proposer that
/// drives its own group.
#[derive(Clone)]
pub enum StepSink {
    Scheduler(ActorRef<SchedulerMsg>),
    Channel(tokio::sync::mpsc::UnboundedSender<StepReport>),
}

impl StepSink {
    fn send(&self, report: StepReport) {
        match self {
            StepSink::Scheduler(s) => {
                let _ = s.send_message(match report {
                    StepReport::Done(out) => SchedulerMsg::StepDone(out),
                    StepReport::Failed { generation, error } => {
                        SchedulerMsg::StepFailed { generation, error }
                    }
                });
            }
            StepSink::Channel(tx) => {
                let _ = tx.send(report);
            }
        }
    }
}

pub struct RankActor;

pub struct RankState {
    jobs: Option<flume::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
}

enum Job {
    Step(SharedPlan),
    Mtp(Arc<MtpPlan>, Option<MtpReply>),
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
        let (jobs_tx, jobs_rx) = flume::unbounded::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
        let rank = args.rank;
        let thread = std::thread::Builder::new()
            .name(format!("dcpserve-rank-{rank}"))
            .spawn(move || compute_thread(args, jobs_rx, ready_tx, myself))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(RankState {
                jobs: Some(jobs_tx),
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
        let jobs = state.jobs.as_ref().ok_or("rank is shutting down")?;
        match msg {
            RankMsg::Execute(plan) => jobs
                .send(Job::Step(plan))
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
            RankMsg::Mtp(plan, reply) => jobs
                .send(Job::Mtp(plan, reply))
                .map_err(|_| format!("rank {}: compute thread is gone", state.rank))?,
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
        // Closing the job channel ends the thread after its current step.
        state.jobs.take();
        if let Some(t) = state.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(())
    }
}

fn compute_thread(
    args: RankArgs,
    jobs: flume::Receiver<Job>,
    ready: oneshot::Sender<Result<(), String>>,
    myself: ActorRef<RankMsg>,
) {
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        RankModel::load_shard(
            args.files.config.clone(),
            args.files.tensors.as_ref(),
            args.precision,
            TpShard {
                rank: args.rank,
                size: args.tp_size,
            },
        )
    }));
    let loaded = match loaded {
        Ok(Ok(mut m)) if args.mtp => catch_unwind(AssertUnwindSafe(|| {
            m.load_mtp(args.files.tensors.as_ref(), args.precision)
                .map(|()| m)
        })),
        other => other,
    };
    let model = match loaded {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            let _ = ready.send(Err(format!("rank {}: {e}", args.rank)));
            return;
        }
        Err(p) => {
            let _ = ready.send(Err(format!(
                "rank {}: panic while loading: {}",
                args.rank,
                panic_text(&p)
            )));
            return;
        }
    };
    let pool = ThreadPool::new(args.threads.max(1));
    let mut cache = model.new_kv_cache(args.num_blocks, args.placement.block_size);
    let mut hidden = HiddenStore::default();
    let _ = ready.send(Ok(()));
    while let Ok(job) = jobs.recv() {
        let plan = match job {
            Job::Step(plan) => plan,
            Job::Mtp(plan, reply) => {
                let ctx = MtpContext {
                    model: &model,
                    pool: &pool,
                    comms: &args.comms,
                    placement: &args.placement,
                };
                let result =
                    catch_unwind(AssertUnwindSafe(|| ctx.run(&plan, &mut cache, &mut hidden)));
                let error = match result {
                    Ok(Ok(out)) => {
                        if let Some(r) = reply {
                            let _ = r.send(Ok(out));
                        }
                        continue;
                    }
                    Ok(Err(e)) => format!("MTP step: {e}"),
                    Err(p) => format!("panic in an MTP step: {}", panic_text(&p)),
                };
                if let Some(r) = reply {
                    let _ = r.send(Err(error.clone()));
                }
                tracing::error!(rank = args.rank, "{error}");
                fail(&args, &myself, error);
                return;
            }
            Job::Fault => {
                let err = "injected fault".to_string();
                fail(&args, &myself, err);
                return;
            }
            Job::Storage(reply) => {
                let _ = reply.send(cache.storage());
                continue;
            }
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            let local = LocalBatch::new(&plan, &args.placement);
            let tables: Vec<&[u32]> = plan.block_tables.iter().map(|t| t.as_slice()).collect();
            let input = local.input(&plan, &tables);
            if !model.has_mtp() {
                return model.forward_rank(&pool, &args.comms, &input, &mut cache);
            }
            hidden.release(&plan.released);
            let all: Vec<usize> = (0..plan.tokens.len()).collect();
            let (out, h) =
                model.forward_rank_hidden(&pool, &args.comms, &input, &mut cache, &all)?;
            hidden.keep(&plan, &h);
            Ok(out)
        }));
        let error = match result {
            Ok(Ok(out)) => {
                if args.rank == 0 {
                    args.reports.send(StepReport::Done(Box::new(StepOutput {
                        step_id: plan.step_id,
                        logits: out.logits,
                        vocab_size: out.vocab_size,
                    })));
                }
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(p) => format!("panic in step {}: {}", plan.step_id, panic_text(&p)),
        };
        tracing::error!(rank = args.rank, "{error}");
        fail(&args, &myself, error);
        return;
    }
}

/// Reports a failed step to whoever drives the group and fails this rank's actor (its
/// supervisor restarts the group).
fn fail(args: &RankArgs, myself: &ActorRef<RankMsg>, error: String) {
    args.reports.send(StepReport::Failed {
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
