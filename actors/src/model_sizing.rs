//! What a model is brought up with, resolved before the supervisor spawns anything: the
//! checks (limits, the layout against the model with vLLM's messages, `mtp`), where the
//! ranks run, the KV budget and what it holds, and the longest sequence served. The
//! engine facade runs the same layout check earlier, before any weight is read; a
//! supervisor started directly runs it here.

use dcpserve_config::{
    DType, DistributedBackend, EngineConfig, KvBudgetRule, ResolvedLayout, SharedMemory,
    SpeculativeMethod,
};
use dcpserve_kernels::Device;
use dcpserve_model::arch::MtpLayer;
use dcpserve_model::{ModelConfig, ModelFiles};
use ractor::ActorProcessingErr;

use crate::gpu_kv_budget::{kv_budget_per_rank, weights_per_rank, GpuMemory};
use crate::rank_group::Executor;

/// A model's layout, KV cache and limits, resolved.
pub(crate) struct ModelSizing {
    /// The layout, the KV element type, the budget per rank and what it holds.
    pub resolved: ResolvedLayout,
    /// Where the ranks run.
    pub executor: Executor,
    /// Ranks hosted by this process.
    pub local_ranks: usize,
    /// Longest prompt + output served.
    pub max_model_len: usize,
}

impl ModelSizing {
    /// Checks `e` against the model of `files` and resolves everything the model is
    /// brought up with, in the order the errors are reported.
    pub(crate) fn resolve(
        files: &ModelFiles,
        e: &EngineConfig,
    ) -> Result<Self, ActorProcessingErr> {
        let cfg = &files.config;
        e.validate_limits()?;
        // The layout is checked against the model first, as the engine facade does.
        let layout = e.resolve_layout(cfg.attention_kind())?;
        check_max_model_len_fits_model(e, cfg)?;
        // Where the ranks run, checked before any weight is read.
        let executor = executor(e.distributed_executor_backend)?;
        let local_ranks = executor.process_map(layout.world())?.ranks_per_process;
        let budget = kv_budget(e, cfg, local_ranks)?;
        // The MTP layer keeps its latents in one more layer of the same cache.
        let mut kv_shape = cfg.kv_shape();
        if uses_mtp(e) {
            check_mtp(files, e)?;
            kv_shape.num_layers += 1;
        }
        let resolved = e.resolve(&kv_shape, budget)?;
        let max_model_len = max_model_len(
            e,
            cfg,
            resolved.capacity.num_blocks * layout.virtual_block_size(),
        )?;
        Ok(Self {
            resolved,
            executor,
            local_ranks,
            max_model_len,
        })
    }
}

/// A `max_model_len` beyond the model's own context length is refused, as vLLM does.
fn check_max_model_len_fits_model(
    e: &EngineConfig,
    cfg: &ModelConfig,
) -> Result<(), ActorProcessingErr> {
    match e.max_model_len {
        Some(len) if len > cfg.max_position_embeddings => Err(format!(
            "User-specified max_model_len ({len}) is greater than the derived max_model_len (max_position_embeddings={} in the model's config).",
            cfg.max_position_embeddings
        )
        .into()),
        _ => Ok(()),
    }
}

/// The longest sequence served: the configured one if the KV cache holds it, else the
/// model's context length lowered to what the cache holds.
fn max_model_len(
    e: &EngineConfig,
    cfg: &ModelConfig,
    capacity_total: usize,
) -> Result<usize, ActorProcessingErr> {
    Ok(match e.max_model_len {
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
    })
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

/// KV-cache bytes per rank: the configured figure, else the default of the device the
/// ranks compute on (the planner predicts it with the same [`KvBudgetRule`]).
fn kv_budget(
    e: &EngineConfig,
    cfg: &ModelConfig,
    local_ranks: usize,
) -> Result<u64, ActorProcessingErr> {
    Ok(match (e.kv_cache_memory_bytes, e.rank_settings.device) {
        (Some(bytes), _) => bytes,
        // A quarter of available memory, split over the ranks of this process.
        (None, Device::Cpu) => KvBudgetRule::cpu_default().per_rank(SharedMemory {
            memory_bytes: 0.0,
            ranks: local_ranks,
            weights_per_rank: 0.0,
        }),
        (None, Device::Cuda) => gpu_kv_bytes(e, cfg, local_ranks)?,
    })
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

/// Whether the ranks load the MTP layer (speculative method `mtp`).
pub(crate) fn uses_mtp(e: &EngineConfig) -> bool {
    e.speculative
        .as_ref()
        .is_some_and(|s| s.method == SpeculativeMethod::Mtp)
}

/// Refuses `mtp` where it cannot run: a model without MTP weights, or overlapped
/// micro-batches (the MTP step must run between target steps on the same ranks).
pub(crate) fn check_mtp(files: &ModelFiles, e: &EngineConfig) -> Result<(), ActorProcessingErr> {
    if !MtpLayer::present(&files.config, files.tensors.as_ref()) {
        return Err(format!(
            "Speculative method `mtp` needs a model with a multi-token-prediction layer (DeepSeek-V3's `num_nextn_predict_layers`, tensors model.layers.{}.*), and {} has none: use `ngram` or `draft_model`.",
            files.config.num_hidden_layers,
            files.path.display()
        )
        .into());
    }
    if e.overlap_micro_batches {
        return Err(
            "Speculative method `mtp` does not combine with overlapped micro-batches: turn `overlap_micro_batches` off."
                .into(),
        );
    }
    Ok(())
}
