//! Engine-wide settings: memory, batching limits, weight precision.

use serde::{Deserialize, Serialize};

use dcpserve_kernels::dcp::MergeExchange;
use dcpserve_kernels::KvCacheDType;

use crate::parallel::{ConfigError, ParallelConfig};
use crate::rank_settings::RankSettings;
use crate::speculative::SpeculativeConfig;

/// Precision in which weights are kept on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// bf16 for floating-point checkpoints; quantized checkpoints stay quantized.
    #[default]
    Auto,
    /// Everything dequantized to f32 (the reference precision).
    Float32,
    /// Everything converted to bf16.
    Bfloat16,
}

impl DType {
    /// The KV-cache element type under this weight precision: `explicit` when set, else
    /// vLLM's `auto`, which follows the compute dtype: float32 for `Float32`, bfloat16
    /// otherwise. The engine and the planner both resolve `auto` here.
    ///
    /// ```
    /// use dcpserve_config::DType;
    /// use dcpserve_kernels::KvCacheDType;
    /// assert_eq!(DType::Float32.kv_cache_dtype(None), KvCacheDType::F32);
    /// assert_eq!(DType::Auto.kv_cache_dtype(None), KvCacheDType::BF16);
    /// assert_eq!(DType::Float32.kv_cache_dtype(Some(KvCacheDType::Fp8E4M3)), KvCacheDType::Fp8E4M3);
    /// ```
    pub fn kv_cache_dtype(self, explicit: Option<KvCacheDType>) -> KvCacheDType {
        explicit.unwrap_or(match self {
            DType::Float32 => KvCacheDType::F32,
            DType::Auto | DType::Bfloat16 => KvCacheDType::BF16,
        })
    }
}

impl std::str::FromStr for DType {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(DType::Auto),
            "float32" | "f32" | "float" => Ok(DType::Float32),
            "bfloat16" | "bf16" => Ok(DType::Bfloat16),
            other => Err(ConfigError(format!(
                "Unknown dtype `{other}`: expected one of auto, float32, bfloat16."
            ))),
        }
    }
}

/// Where a model's rank actors run (vLLM's `--distributed-executor-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistributedBackend {
    /// Every rank is a thread of this process (vLLM's `mp`).
    #[default]
    Mp,
    /// Ranks are split evenly over the processes of an MPI job (`mpirun` / `srun`);
    /// process 0 serves the API and schedules. Needs a build with the `mpi` feature.
    Mpi,
}

impl std::str::FromStr for DistributedBackend {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "mp" => Ok(Self::Mp),
            "mpi" => Ok(Self::Mpi),
            other => Err(ConfigError(format!(
                "Unknown distributed_executor_backend `{other}`: expected mp or mpi."
            ))),
        }
    }
}

/// Everything one served model's engine needs besides the weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    pub parallel: ParallelConfig,
    pub dtype: DType,
    /// What every rank builds its backend from (`--device`, `--cpu-matmul`,
    /// `--gpu-matmul`, `--cuda-graphs`); flattened, so the keys stay at the top level.
    #[serde(flatten)]
    pub rank_settings: RankSettings,
    /// How the KV cache stores values (`--kv-cache-dtype`); `None` is `auto`, which
    /// follows the compute dtype as vLLM's does: see [`EngineConfig::kv_cache_dtype`].
    pub kv_cache_dtype: Option<KvCacheDType>,
    /// Tokens per KV block on one rank (B); a virtual block holds B × dcp tokens.
    pub block_size: usize,
    /// KV-cache bytes per rank; `None` derives it from free memory (CPU) or, on CUDA
    /// devices, from `gpu_memory_utilization` of the device memory.
    pub kv_cache_memory_bytes: Option<u64>,
    /// Share of a GPU's memory the engine may use (weights, activations, KV cache), as
    /// vLLM's `--gpu-memory-utilization`; only with `device = cuda` and no
    /// `kv_cache_memory_bytes`.
    pub gpu_memory_utilization: f64,
    /// Longest prompt + output; `None` uses the model's context length.
    pub max_model_len: Option<usize>,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most tokens (prefill + decode) in one step.
    pub max_num_batched_tokens: usize,
    pub enable_prefix_caching: bool,
    /// Run two micro-batches in ping-pong: each rank computes them on two threads that
    /// take turns, switching whenever one waits in a collective, so one micro-batch's
    /// communication overlaps the other's compute, and the scheduler samples and plans one
    /// while the ranks compute the other.
    pub overlap_micro_batches: bool,
    /// Compute threads for the whole model; split evenly over its ranks. `None` = all cores.
    pub num_threads: Option<usize>,
    /// Default seed for requests that set none.
    pub seed: u64,
    /// Speculative decoding (`--speculative-config`); `None` decodes one token per step.
    pub speculative: Option<SpeculativeConfig>,
    /// For benchmarks: every collective also waits (without using a core) as long as this
    /// link would take, to measure on CPU ranks what a slower interconnect costs.
    pub modeled_link: Option<ModeledLinkConfig>,
    /// How a DCP group exchanges attention partials: one all-to-all (the default), or
    /// the earlier LSE all-gather + reduce-scatter, kept to measure against.
    pub dcp_merge_exchange: MergeExchange,
    /// Send every step plan to the ranks as bytes, and their answers back as bytes, the
    /// way they would cross a process boundary (a check that the messages carry
    /// everything; costs an encoding per step).
    pub serialize_plans: bool,
    /// Where the rank actors run: threads of this process, or the processes of an MPI job.
    pub distributed_executor_backend: DistributedBackend,
}

/// A modeled interconnect: a fixed latency per collective plus bytes over bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeledLinkConfig {
    pub latency_us: f64,
    pub gigabytes_per_second: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            parallel: ParallelConfig::default(),
            dtype: DType::Auto,
            rank_settings: RankSettings::default(),
            kv_cache_dtype: None,
            block_size: 16,
            kv_cache_memory_bytes: None,
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            enable_prefix_caching: true,
            // Pays off only when collectives are slow (see `bench-dcp --section overlap`).
            overlap_micro_batches: false,
            num_threads: None,
            seed: 0,
            speculative: None,
            modeled_link: None,
            dcp_merge_exchange: MergeExchange::default(),
            serialize_plans: false,
            distributed_executor_backend: DistributedBackend::Mp,
        }
    }
}

/// Parses `--kv-cache-dtype`: vLLM's `auto` (`None`), `float32`, `bfloat16`, `fp8`
/// (= `fp8_e4m3`) or `fp8_e5m2`.
///
/// ```
/// use dcpserve_config::parse_kv_cache_dtype;
/// use dcpserve_kernels::KvCacheDType;
/// assert_eq!(parse_kv_cache_dtype("auto").unwrap(), None);
/// assert_eq!(parse_kv_cache_dtype("fp8").unwrap(), Some(KvCacheDType::Fp8E4M3));
/// assert!(parse_kv_cache_dtype("int4").is_err());
/// ```
pub fn parse_kv_cache_dtype(s: &str) -> Result<Option<KvCacheDType>, ConfigError> {
    match s {
        "auto" => Ok(None),
        other => other
            .parse::<KvCacheDType>()
            .map(Some)
            .map_err(|_| ConfigError(format!(
                "Unknown kv_cache_dtype `{other}`: expected one of auto, float32, bfloat16, fp8, fp8_e4m3, fp8_e5m2."
            ))),
    }
}

impl EngineConfig {
    /// The KV-cache element type the engine allocates. An explicit
    /// [`kv_cache_dtype`](EngineConfig::kv_cache_dtype) wins; `auto` (`None`) follows
    /// the compute dtype as vLLM's `auto` does: a model run in float32
    /// (`--dtype float32`, the reference precision every transformers comparison uses)
    /// keeps a float32 cache, and everything else — bf16 checkpoints and quantized
    /// (GGUF) models under `--dtype auto`, or `--dtype bfloat16` — gets bfloat16.
    ///
    /// ```
    /// use dcpserve_config::{DType, EngineConfig};
    /// use dcpserve_kernels::KvCacheDType;
    /// let mut c = EngineConfig::default();
    /// assert_eq!(c.kv_cache_dtype(), KvCacheDType::BF16);
    /// c.dtype = DType::Float32;
    /// assert_eq!(c.kv_cache_dtype(), KvCacheDType::F32);
    /// c.kv_cache_dtype = Some(KvCacheDType::Fp8E4M3);
    /// assert_eq!(c.kv_cache_dtype(), KvCacheDType::Fp8E4M3);
    /// ```
    pub fn kv_cache_dtype(&self) -> KvCacheDType {
        self.dtype.kv_cache_dtype(self.kv_cache_dtype)
    }

    /// Checks the settings that do not depend on the model.
    pub fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return Err(ConfigError("block_size must be at least 1.".into()));
        }
        if self.max_num_seqs == 0 {
            return Err(ConfigError("max_num_seqs must be at least 1.".into()));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(ConfigError(
                "max_num_batched_tokens must be at least 1.".into(),
            ));
        }
        if self.num_threads == Some(0) {
            return Err(ConfigError("num_threads must be at least 1.".into()));
        }
        if let Some(l) = self.modeled_link {
            let valid = l.latency_us >= 0.0
                && l.latency_us.is_finite()
                && l.gigabytes_per_second > 0.0
                && l.gigabytes_per_second.is_finite();
            if !valid {
                return Err(ConfigError(format!(
                    "modeled_link needs latency_us >= 0 and gigabytes_per_second > 0, got {} and {}.",
                    l.latency_us, l.gigabytes_per_second
                )));
            }
        }
        Ok(())
    }
}
