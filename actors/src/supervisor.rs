//! The per-model supervisor: spawns the scheduler and the rank group, and brings the
//! rank group back when one of its ranks fails (one dead rank breaks the group's
//! collectives, so the whole group restarts; only requests with KV state are lost).

use std::sync::Arc;
use std::time::Duration;

use dcpserve_config::{resolve, EngineConfig, KvSizing, ResolvedLayout};
use dcpserve_kernels::LinkModel;
use dcpserve_model::arch::{KvStorage, WeightPrecision};
use dcpserve_model::{ModelConfig, ModelFiles};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::collective::CollectiveMsg;
use crate::kv_manager_actor::{KvManagerActor, KvManagerArgs, KvManagerMsg};
use crate::model_sizing::{check_mtp, uses_mtp, ModelSizing};
use crate::rank::{RankMsg, StepReport};
use crate::rank_group::{Executor, RankGroup, RankGroupSpec};
use crate::scheduler::{
    Scheduler, SchedulerArgs, SchedulerConfig, SchedulerMsg, SpeculationLimits,
};
use crate::speculative::{
    DraftActor, DraftModelProposer, DraftModelSpec, DraftMsg, DraftProposer, MtpProposer,
    NgramProposer,
};
use dcpserve_config::SpeculativeMethod;
use tokio::sync::mpsc::UnboundedSender;

/// What the supervisor needs to bring a model up.
pub struct SupervisorArgs {
    pub name: String,
    pub files: Arc<ModelFiles>,
    pub engine: EngineConfig,
    pub precision: WeightPrecision,
    /// The draft model's files, for `--speculative-config` with method `draft_model`.
    pub draft: Option<Arc<ModelFiles>>,
}

/// Facts about a running model, for the engine facade.
#[derive(Clone)]
pub struct ModelInfo {
    pub scheduler: ActorRef<SchedulerMsg>,
    pub max_model_len: usize,
    pub kv_tokens_per_rank: usize,
    pub kv_tokens_total: usize,
    pub restarts: u64,
}

/// Messages the supervisor understands.
pub enum SupervisorMsg {
    Info(RpcReplyPort<ModelInfo>),
    /// Seconds each rank of the current group has spent in collectives.
    SecondsInCollectives(RpcReplyPort<Vec<f64>>),
    /// Test hook: make rank `n` fail on its next step.
    #[cfg(feature = "test-hooks")]
    InjectFault(usize),
    /// Test hook: make rank `n` of the draft model's rank group fail on its next step.
    #[cfg(feature = "test-hooks")]
    InjectDraftFault(usize),
    /// Diagnostic: what each rank's KV cache has stored, in rank order.
    KvStorage(RpcReplyPort<Vec<KvStorage>>),
}

pub struct ModelSupervisor;

pub struct SupervisorState {
    args: SupervisorArgs,
    info: ModelInfo,
    /// The draft actor, with speculative decoding (only the draft-fault test hook reads it;
    /// the scheduler holds its own reference).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    draft: Option<ActorRef<DraftMsg>>,
    /// The running rank group (none while it restarts).
    group: Option<RankGroup>,
    /// What every generation of the rank group is built from.
    group_spec: RankGroupSpec,
    kv: ActorRef<KvManagerMsg>,
    /// Where every rank group answers: the scheduler owns the receiving end.
    reports: UnboundedSender<StepReport>,
}

/// The draft proposer `--speculative-config` asks for, if any. A draft model gets the
/// same KV budget per rank as the target and the same compute threads (the two never
/// compute at the same time).
async fn draft_proposer(
    args: &SupervisorArgs,
    sizing: &ModelSizing,
    threads: usize,
    supervisor: ActorCell,
) -> Result<Option<Box<dyn DraftProposer>>, ActorProcessingErr> {
    let Some(spec) = &args.engine.speculative else {
        return Ok(None);
    };
    let e = &args.engine;
    let proposer: Box<dyn DraftProposer> = match spec.method {
        SpeculativeMethod::Ngram => Box::new(NgramProposer::new(
            spec.prompt_lookup_min.unwrap_or(5),
            spec.prompt_lookup_max.unwrap_or(5),
        )),
        SpeculativeMethod::DraftModel => {
            let files = args
                .draft
                .clone()
                .ok_or("the draft_model method needs the draft model's files")?;
            // The draft's own layout, resolved as the target's is, one micro-batch.
            let draft = resolve(
                &spec.draft_parallel(),
                &files.config.kv_shape(),
                KvSizing {
                    block_size: e.block_size,
                    micro_batches: 1,
                    dtype: sizing.resolved.kv_dtype,
                    budget_per_rank: sizing.resolved.budget_per_rank,
                },
            )
            .map_err(|err| format!("draft model: {err}"))?;
            let spec = DraftModelSpec {
                layout: draft.layout,
                precision: args.precision,
                rank_settings: e.rank_settings.clone(),
                num_blocks: draft.capacity.num_blocks,
                kv_cache_dtype: draft.kv_dtype,
                max_step_tokens: e.max_num_batched_tokens,
                threads_per_rank: (threads / draft.layout.tp()).max(1),
                seed: e.seed,
            };
            Box::new(DraftModelProposer::spawn(files, spec, supervisor).await?)
        }
        SpeculativeMethod::Mtp => {
            check_mtp(&args.files, e)?;
            Box::new(MtpProposer::new(
                sizing.resolved.layout.virtual_block_size(),
                e.seed,
            ))
        }
    };
    Ok(Some(proposer))
}

/// The scheduler's settings for a model of `sizing`.
fn scheduler_config(e: &EngineConfig, cfg: &ModelConfig, sizing: &ModelSizing) -> SchedulerConfig {
    SchedulerConfig {
        tokens_per_block: sizing.resolved.layout.virtual_block_size(),
        num_blocks: sizing.resolved.capacity.num_blocks,
        max_num_seqs: e.max_num_seqs,
        max_num_batched_tokens: e.max_num_batched_tokens,
        max_model_len: sizing.max_model_len,
        eos_token_ids: cfg.eos_token_ids.clone(),
        seed: e.seed,
        enable_prefix_caching: e.enable_prefix_caching,
        overlap_micro_batches: e.overlap_micro_batches,
        speculation: e.speculative.as_ref().map(|s| SpeculationLimits {
            num_speculative_tokens: s.num_speculative_tokens,
            adaptive: s.is_adaptive(),
        }),
        serialize_plans: e.serialize_plans,
    }
}

/// What every generation of the model's rank group is built from. `num_threads` is the
/// whole model's; without it, each process splits its own host's `threads` over the
/// ranks it hosts.
fn rank_group_spec(args: &SupervisorArgs, sizing: ModelSizing, threads: usize) -> RankGroupSpec {
    let e = &args.engine;
    let r = sizing.resolved;
    RankGroupSpec {
        files: args.files.clone(),
        precision: args.precision,
        rank_settings: e.rank_settings.clone(),
        layout: r.layout,
        num_blocks: r.capacity.num_blocks,
        kv_cache_dtype: r.kv_dtype,
        max_step_tokens: e.max_num_batched_tokens,
        threads_per_rank: match e.num_threads {
            Some(n) => (n / r.layout.world()).max(1),
            None => (threads / sizing.local_ranks).max(1),
        },
        explicit_threads: e.num_threads.is_some(),
        link: e.modeled_link.map(|l| LinkModel {
            latency: Duration::from_secs_f64(l.latency_us * 1e-6),
            bytes_per_second: l.gigabytes_per_second * 1e9,
        }),
        dcp_merge: e.dcp_merge_exchange,
        mtp: uses_mtp(e),
        serialize_reports: e.serialize_plans,
        executor: sizing.executor,
    }
}

/// States what the KV cache holds.
fn log_kv_cache(name: &str, block_size: usize, r: &ResolvedLayout) {
    let cap = &r.capacity;
    tracing::info!(
        model = %name,
        "KV cache ({}): {} tokens per rank, {} tokens total ({} blocks of {} tokens, {} bytes per token per rank)",
        r.kv_dtype,
        cap.tokens_per_rank,
        cap.tokens_total,
        cap.num_blocks,
        block_size,
        cap.bytes_per_token_per_rank
    );
}

impl Actor for ModelSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let sizing = ModelSizing::resolve(&args.files, &args.engine)?;
        let e = &args.engine;
        log_kv_cache(&args.name, e.block_size, &sizing.resolved);
        let sched_cfg = scheduler_config(e, &args.files.config, &sizing);
        // The KV-block manager and the scheduler outlive rank-group restarts.
        let (kv, _) = Actor::spawn_linked(
            None,
            KvManagerActor,
            KvManagerArgs {
                num_blocks: sched_cfg.num_blocks,
                tokens_per_block: sched_cfg.tokens_per_block,
                enable_prefix_caching: e.enable_prefix_caching,
            },
            myself.get_cell(),
        )
        .await?;
        let threads = e
            .num_threads
            .unwrap_or_else(dcpserve_kernels::available_cores);
        let draft = match draft_proposer(&args, &sizing, threads, myself.get_cell()).await? {
            Some(p) => Some(
                Actor::spawn_linked(None, DraftActor, p, myself.get_cell())
                    .await?
                    .0,
            ),
            None => None,
        };
        let (reports, reports_rx) = tokio::sync::mpsc::unbounded_channel();
        let (scheduler, _) = Actor::spawn_linked(
            None,
            Scheduler,
            SchedulerArgs {
                config: sched_cfg,
                reports: reports_rx,
                kv: kv.clone(),
                draft: draft.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        let capacity = sizing.resolved.capacity;
        let mut state = SupervisorState {
            info: ModelInfo {
                scheduler,
                max_model_len: sizing.max_model_len,
                kv_tokens_per_rank: capacity.tokens_per_rank,
                kv_tokens_total: capacity.tokens_total,
                restarts: 0,
            },
            group_spec: rank_group_spec(&args, sizing, threads),
            group: None,
            draft,
            kv,
            reports,
            args,
        };
        state.start_ranks(myself.get_cell()).await?;
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Info(port) => {
                let _ = port.send(state.info.clone());
            }
            SupervisorMsg::SecondsInCollectives(port) => {
                let secs = match &state.group {
                    Some(g) => ractor::call!(g.collective(), CollectiveMsg::SecondsInCollectives)
                        .unwrap_or_default(),
                    None => Vec::new(),
                };
                let _ = port.send(secs);
            }
            #[cfg(feature = "test-hooks")]
            SupervisorMsg::InjectFault(n) => {
                if let Some(r) = state.group.as_ref().and_then(|g| g.ranks().get(n)) {
                    r.send_message(RankMsg::InjectFault)?;
                }
            }
            #[cfg(feature = "test-hooks")]
            SupervisorMsg::InjectDraftFault(n) => {
                if let Some(d) = &state.draft {
                    d.send_message(DraftMsg::InjectFault(n))?;
                }
            }
            SupervisorMsg::KvStorage(port) => {
                let ranks = state.group.as_ref().map(|g| g.ranks()).unwrap_or_default();
                let mut all = Vec::with_capacity(ranks.len());
                for r in ranks {
                    all.push(ractor::call!(r, RankMsg::KvStorage)?);
                }
                let _ = port.send(all);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (who, why) = match evt {
            SupervisionEvent::ActorFailed(who, err) => (who, err.to_string()),
            SupervisionEvent::ActorTerminated(who, _, reason) => {
                (who, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        if who.get_id() == state.info.scheduler.get_id() || who.get_id() == state.kv.get_id() {
            // Without its scheduler or block manager the model cannot serve; stop and let
            // the owner see it.
            tracing::error!(model = %state.args.name, "scheduler or KV manager ended: {why}");
            myself.stop(Some(format!("scheduler or KV-block manager ended: {why}")));
            return Ok(());
        }
        if !state
            .group
            .as_ref()
            .is_some_and(|g| g.contains(who.get_id()))
        {
            // A member of a group already replaced, or of a draft model's group (its
            // proposer sees the failure in its reports and restarts that group).
            return Ok(());
        }
        tracing::error!(model = %state.args.name, "rank failed: {why}; restarting the rank group");
        state
            .info
            .scheduler
            .send_message(SchedulerMsg::RanksLost(why))?;
        if let Some(group) = state.group.take() {
            group.tear_down("rank group restart").await;
        }
        state.info.restarts += 1;
        if let Err(e) = state.start_ranks(myself.get_cell()).await {
            if matches!(state.group_spec.executor, Executor::InProcess) {
                return Err(e);
            }
            // A lost rank process does not come back in an MPI job: the model stays up
            // to say why (`/health`), and refuses requests until the job is relaunched.
            let why = format!("the rank group cannot be restarted: {e}");
            tracing::error!(model = %state.args.name, "{why}");
            state
                .info
                .scheduler
                .send_message(SchedulerMsg::Unavailable(why))?;
        }
        Ok(())
    }
}

impl SupervisorState {
    /// Brings up the next generation of the rank group and hands it to the scheduler.
    async fn start_ranks(&mut self, supervisor: ActorCell) -> Result<(), ActorProcessingErr> {
        let group = RankGroup::start(
            &self.group_spec,
            self.info.restarts,
            self.reports.clone(),
            supervisor,
        )
        .await?;
        self.info.scheduler.send_message(SchedulerMsg::SetRanks(
            self.info.restarts,
            group.ranks().to_vec(),
        ))?;
        self.group = Some(group);
        Ok(())
    }
}
