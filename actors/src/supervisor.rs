//! The per-model supervisor: spawns the scheduler and the rank group, and brings the
//! rank group back when one of its ranks fails (one dead rank breaks the group's
//! collectives, so the whole group restarts; only requests with KV state are lost).

use std::sync::Arc;
use std::time::Duration;

use dcpserve_config::{DType, EngineConfig};
use dcpserve_kernels::dcp::Layout;
use dcpserve_kernels::Device;
use dcpserve_kernels::LinkModel;
use dcpserve_model::arch::{kv_capacity, KvStorage, MtpLayer, WeightPrecision};
use dcpserve_model::{ModelConfig, ModelFiles};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::collective::CollectiveMsg;
use crate::gpu_kv_budget::{kv_budget_per_rank, weights_per_rank, GpuMemory};
use crate::kv_manager_actor::{KvManagerActor, KvManagerArgs, KvManagerMsg};
use crate::rank::{RankMsg, StepReport};
use crate::rank_group::{Executor, RankGroup, RankGroupSpec};
use crate::scheduler::{
    Scheduler, SchedulerArgs, SchedulerConfig, SchedulerMsg, SpeculationLimits,
};
use crate::speculative::{
    DraftActor, DraftModelProposer, DraftModelSpec, DraftMsg, DraftProposer, MtpProposer,
    NgramProposer,
};
use dcpserve_config::{DistributedBackend, ParallelConfig, SpeculativeMethod};
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

/// The executor `--distributed-executor-backend` asks for.
fn executor(backend: DistributedBackend) -> Result<Executor, ActorProcessingErr> {
    match backend {
        DistributedBackend::Mp => Ok(Executor::InProcess),
        #[cfg(feature = "mpi")]
        DistributedBackend::Mpi => match crate::remote::Cluster::global() {
            Some(c) => Ok(Executor::Mpi(c)),
            None => Err("--distributed-executor-backend mpi: this process is not process 0 of an MPI job; launch it with `mpirun -np P dcpserve ... --distributed-executor-backend mpi` (or srun), or call `dcpserve::distributed::init` first when embedding the engine.".into()),
        },
        #[cfg(not(feature = "mpi"))]
        DistributedBackend::Mpi => Err("--distributed-executor-backend mpi: this dcpserve was built without MPI; rebuild with `cargo build --release --features mpi` (needs Open MPI and libclang: `apt-get install libopenmpi-dev openmpi-bin libclang-dev`).".into()),
    }
}

/// KV budget per rank when none is configured: a quarter of available memory, split
/// over the ranks of this process.
fn default_kv_bytes(ranks: usize) -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30);
    (available / 4 / ranks as u64).min(8 << 30)
}

/// KV-cache bytes per CUDA rank: vLLM's `--gpu-memory-utilization` rule on GPU 0 (the
/// device with the most ranks when ranks are placed round-robin), stated in the log.
fn gpu_kv_bytes(
    e: &EngineConfig,
    cfg: &ModelConfig,
    local_ranks: usize,
) -> Result<u64, ActorProcessingErr> {
    let visible = dcpserve_kernels::cuda_device_count()
        .map_err(|err| format!("--device cuda: {err}"))?
        .max(1);
    let total = dcpserve_kernels::cuda_total_memory(0)
        .map_err(|err| format!("--device cuda: {err}"))? as u64;
    let tp = e.parallel.tensor_parallel_size;
    let memory = GpuMemory {
        total,
        utilization: e.gpu_memory_utilization,
        weights_per_rank: weights_per_rank(cfg, tp, e.dtype == DType::Float32),
        ranks: local_ranks.div_ceil(visible),
    };
    let (bytes, text) = kv_budget_per_rank(memory)?;
    tracing::info!("{text}");
    Ok(bytes)
}

/// The draft proposer `--speculative-config` asks for, if any. A draft model gets the
/// same KV budget per rank as the target and the same compute threads (the two never
/// compute at the same time).
async fn draft_proposer(
    args: &SupervisorArgs,
    kv_budget_per_rank: u64,
    threads: usize,
    layout: &Layout,
    supervisor: ActorCell,
) -> Result<Option<Box<dyn DraftProposer>>, ActorProcessingErr> {
    let Some(spec) = &args.engine.speculative else {
        return Ok(None);
    };
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
            let parallel = ParallelConfig {
                tensor_parallel_size: spec.draft_tensor_parallel_size.unwrap_or(1),
                decode_context_parallel_size: spec.draft_decode_context_parallel_size.unwrap_or(1),
                cp_kv_cache_interleave_size: 1,
            };
            let e = &args.engine;
            let cap = kv_capacity(
                &files.config,
                parallel.tensor_parallel_size,
                parallel.decode_context_parallel_size,
                e.block_size,
                kv_budget_per_rank,
                e.kv_cache_dtype(),
            );
            let spec = DraftModelSpec {
                parallel,
                precision: args.precision,
                rank_settings: e.rank_settings.clone(),
                block_size: e.block_size,
                num_blocks: cap.num_blocks,
                kv_cache_dtype: e.kv_cache_dtype(),
                max_step_tokens: e.max_num_batched_tokens,
                threads_per_rank: (threads / parallel.tensor_parallel_size).max(1),
                seed: e.seed,
            };
            Box::new(DraftModelProposer::spawn(files, spec, supervisor).await?)
        }
        SpeculativeMethod::Mtp => {
            let e = &args.engine;
            check_mtp(args)?;
            Box::new(MtpProposer::new(layout.virtual_block_size(), e.seed))
        }
    };
    Ok(Some(proposer))
}

/// Whether the ranks load the MTP layer (speculative method `mtp`).
fn uses_mtp(e: &EngineConfig) -> bool {
    e.speculative
        .as_ref()
        .is_some_and(|s| s.method == SpeculativeMethod::Mtp)
}

/// Refuses `mtp` where it cannot run: a model without MTP weights, or overlapped
/// micro-batches (the MTP step must run between target steps on the same ranks).
fn check_mtp(args: &SupervisorArgs) -> Result<(), ActorProcessingErr> {
    let files = &args.files;
    if !MtpLayer::present(&files.config, files.tensors.as_ref()) {
        return Err(format!(
            "Speculative method `mtp` needs a model with a multi-token-prediction layer (DeepSeek-V3's `num_nextn_predict_layers`, tensors model.layers.{}.*), and {} has none: use `ngram` or `draft_model`.",
            files.config.num_hidden_layers,
            files.path.display()
        )
        .into());
    }
    if args.engine.overlap_micro_batches {
        return Err(
            "Speculative method `mtp` does not combine with overlapped micro-batches: turn `overlap_micro_batches` off."
                .into(),
        );
    }
    Ok(())
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
        let cfg = &args.files.config;
        let e = &args.engine;
        let tp = e.parallel.tensor_parallel_size;
        if let Some(len) = e.max_model_len {
            if len > cfg.max_position_embeddings {
                return Err(format!(
                    "User-specified max_model_len ({len}) is greater than the derived max_model_len (max_position_embeddings={} in the model's config).",
                    cfg.max_position_embeddings
                )
                .into());
            }
        }
        let micro_batches = if e.overlap_micro_batches { 2 } else { 1 };
        let layout = e.parallel.layout(e.block_size, micro_batches)?;
        // Where the ranks run, checked before any weight is read.
        let executor = executor(e.distributed_executor_backend)?;
        let local_ranks = executor.process_map(tp)?.ranks_per_process;
        let budget = match (e.kv_cache_memory_bytes, e.rank_settings.device) {
            (Some(bytes), _) => bytes,
            (None, Device::Cpu) => default_kv_bytes(local_ranks),
            (None, Device::Cuda) => gpu_kv_bytes(e, cfg, local_ranks)?,
        };
        // MLA: one latent row per token per layer on each rank that stores the token;
        // standard attention: K and V of the rank's KV heads.
        // The MTP layer keeps its latents in one more layer of the same cache.
        let mut kv_cfg = cfg.clone();
        if uses_mtp(e) {
            check_mtp(&args)?;
            kv_cfg.num_hidden_layers += 1;
        }
        let kv_dtype = e.kv_cache_dtype();
        let cap = kv_capacity(
            &kv_cfg,
            tp,
            e.parallel.decode_context_parallel_size,
            e.block_size,
            budget,
            kv_dtype,
        );
        let capacity_total = cap.num_blocks * layout.virtual_block_size();
        let max_model_len = match e.max_model_len {
            Some(len) if len > capacity_total => {
                return Err(format!(
                    "The model's max seq len ({len}) is larger than the maximum number of tokens that can be stored in KV cache ({capacity_total}). Try increasing `--kv-cache-memory-bytes` or decreasing `--max-model-len`."
                )
                .into());
            }
            Some(len) => len,
            None if cfg.max_position_embeddings > capacity_total => {
                tracing::warn!(
                    "max_model_len lowered from the model's {} to the KV cache's {capacity_total} tokens",
                    cfg.max_position_embeddings
                );
                capacity_total
            }
            None => cfg.max_position_embeddings,
        };
        let (num_blocks, tokens_per_rank, per_token) = (
            cap.num_blocks,
            cap.tokens_per_rank,
            cap.bytes_per_token_per_rank,
        );
        tracing::info!(
            model = %args.name,
            "KV cache ({kv_dtype}): {tokens_per_rank} tokens per rank, {} tokens total ({} blocks of {} tokens, {} bytes per token per rank)",
            cap.tokens_total,
            num_blocks,
            e.block_size,
            per_token
        );
        let sched_cfg = SchedulerConfig {
            tokens_per_block: layout.virtual_block_size(),
            num_blocks,
            max_num_seqs: e.max_num_seqs,
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_model_len,
            eos_token_ids: cfg.eos_token_ids.clone(),
            seed: e.seed,
            enable_prefix_caching: e.enable_prefix_caching,
            overlap_micro_batches: e.overlap_micro_batches,
            speculation: e.speculative.as_ref().map(|s| SpeculationLimits {
                num_speculative_tokens: s.num_speculative_tokens,
                adaptive: s.is_adaptive(),
            }),
            serialize_plans: e.serialize_plans,
        };
        // The KV-block manager and the scheduler outlive rank-group restarts.
        let (kv, _) = Actor::spawn_linked(
            None,
            KvManagerActor,
            KvManagerArgs {
                num_blocks,
                tokens_per_block: sched_cfg.tokens_per_block,
                enable_prefix_caching: e.enable_prefix_caching,
            },
            myself.get_cell(),
        )
        .await?;
        let threads = e
            .num_threads
            .unwrap_or_else(dcpserve_kernels::available_cores);
        let draft = match draft_proposer(&args, budget, threads, &layout, myself.get_cell()).await?
        {
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
                config: sched_cfg.clone(),
                reports: reports_rx,
                kv: kv.clone(),
                draft: draft.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        let mut state = SupervisorState {
            info: ModelInfo {
                scheduler,
                max_model_len,
                kv_tokens_per_rank: tokens_per_rank,
                kv_tokens_total: layout.tokens_total(tokens_per_rank),
                restarts: 0,
            },
            group_spec: RankGroupSpec {
                files: args.files.clone(),
                precision: args.precision,
                rank_settings: args.engine.rank_settings.clone(),
                layout,
                num_blocks: sched_cfg.num_blocks,
                kv_cache_dtype: kv_dtype,
                max_step_tokens: sched_cfg.max_num_batched_tokens,
                // `num_threads` is the whole model's; without it, each process splits
                // its own host's cores over the ranks it hosts.
                threads_per_rank: match args.engine.num_threads {
                    Some(n) => (n / tp).max(1),
                    None => (threads / local_ranks).max(1),
                },
                explicit_threads: args.engine.num_threads.is_some(),
                link: args.engine.modeled_link.map(|l| LinkModel {
                    latency: Duration::from_secs_f64(l.latency_us * 1e-6),
                    bytes_per_second: l.gigabytes_per_second * 1e9,
                }),
                dcp_merge: args.engine.dcp_merge_exchange,
                mtp: uses_mtp(&args.engine),
                serialize_reports: sched_cfg.serialize_plans,
                executor,
            },
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
