//! [`EngineBuilder`]: the settings of an embedded engine, gathered before it starts; the
//! one way to start an [`Engine`].

use std::path::{Path, PathBuf};

use dcpserve_config::{DType, EngineConfig, ParallelConfig, ServeConfig, SpeculativeConfig};

use crate::engine::Engine;
use crate::error::{Error, Result};

// Defined here rather than in engine.rs so that the engine does not depend on its builder.
impl Engine {
    /// A builder for the engine of the model at `path` (a GGUF file or a Hugging Face
    /// folder); see [`EngineBuilder`].
    pub fn builder(path: impl Into<PathBuf>) -> EngineBuilder {
        EngineBuilder::new(path.into())
    }
}

/// Settings of an [`Engine`] to start: the model, the name it is served under, and its
/// [`EngineConfig`] (whole, or field by field). Made by [`Engine::builder`]; nothing is
/// checked or read until [`EngineBuilder::build`].
///
/// ```no_run
/// # async fn demo() -> dcpserve::Result<()> {
/// use dcpserve::{DType, Engine, ParallelConfig, Prompt};
/// let engine = Engine::builder("models/SmolLM2-135M-Instruct.Q4_1.gguf")
///     .name("smollm2")
///     .parallel(ParallelConfig {
///         tensor_parallel_size: 3,
///         decode_context_parallel_size: 3,
///         cp_kv_cache_interleave_size: 1,
///     })
///     .dtype(DType::Float32)
///     .max_model_len(2048)
///     .build()
///     .await?;
/// assert_eq!(engine.name(), "smollm2");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "an engine builder does nothing until `build` is awaited"]
pub struct EngineBuilder {
    path: PathBuf,
    name: Option<String>,
    config: EngineConfig,
}

impl EngineBuilder {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            name: None,
            config: EngineConfig::default(),
        }
    }

    /// The builder of one `[[models]]` entry of a multi-model TOML config file (the entry
    /// named `name`, or the first): its path, its served name and its settings.
    ///
    /// ```no_run
    /// # async fn demo() -> dcpserve::Result<()> {
    /// use dcpserve::EngineBuilder;
    /// let engine = EngineBuilder::from_config_file("examples/multi-model.toml", Some("smollm2"))?
    ///     .build()
    ///     .await?;
    /// assert_eq!(engine.name(), "smollm2");
    /// # Ok(()) }
    /// ```
    pub fn from_config_file(path: impl AsRef<Path>, name: Option<&str>) -> Result<Self> {
        let cfg = ServeConfig::load(path.as_ref())?;
        let entry = match name {
            None => cfg.models.first(),
            Some(n) => cfg.models.iter().find(|m| m.name.as_deref() == Some(n)),
        }
        .ok_or_else(|| {
            Error::Config(format!(
                "The model `{}` does not exist.",
                name.unwrap_or_default()
            ))
        })?;
        let model_path = entry.path.clone().unwrap_or_else(crate::default_model_path);
        Ok(Self {
            path: model_path,
            name: entry.name.clone(),
            config: entry.engine_config()?,
        })
    }

    /// The name the model is served under (default: its file or folder name without
    /// extension).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// All engine settings at once, replacing those set so far.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// The (tp, dcp, interleave) layout of the ranks.
    pub fn parallel(mut self, parallel: ParallelConfig) -> Self {
        self.config.parallel = parallel;
        self
    }

    /// Weight precision.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.config.dtype = dtype;
        self
    }

    /// Where the ranks compute (`--device`): the CPU, or CUDA GPUs (checked at start).
    pub fn device(mut self, device: dcpserve_kernels::Device) -> Self {
        self.config.rank_settings.device = device;
        self
    }

    /// How quantized weights are multiplied on the CPU (int8 activations or f32).
    pub fn cpu_matmul(mut self, mode: dcpserve_kernels::CpuMatmul) -> Self {
        self.config.rank_settings.cpu_matmul = mode;
        self
    }

    /// How GPU ranks multiply by bf16 weights (default: bf16 tensor-core GEMMs).
    pub fn gpu_matmul(mut self, mode: dcpserve_kernels::GpuMatmul) -> Self {
        self.config.rank_settings.gpu_matmul = mode;
        self
    }

    /// Whether GPU ranks replay decode steps from CUDA graphs (default: on; `off`
    /// launches every kernel one by one, as vLLM's `--enforce-eager`).
    pub fn cuda_graphs(mut self, mode: dcpserve_kernels::CudaGraphs) -> Self {
        self.config.rank_settings.cuda_graphs = mode;
        self
    }

    /// How the KV cache stores values (default `auto`: float32 under `DType::Float32`,
    /// bfloat16 otherwise; see [`EngineConfig::kv_cache_dtype`]).
    pub fn kv_cache_dtype(mut self, dtype: dcpserve_kernels::KvCacheDType) -> Self {
        self.config.kv_cache_dtype = Some(dtype);
        self
    }

    /// Tokens per KV block (per rank).
    pub fn block_size(mut self, tokens: usize) -> Self {
        self.config.block_size = tokens;
        self
    }

    /// KV-cache bytes per rank (default: derived from free memory).
    pub fn kv_cache_memory_bytes(mut self, bytes: u64) -> Self {
        self.config.kv_cache_memory_bytes = Some(bytes);
        self
    }

    /// Longest prompt + output (default: the model's context length).
    pub fn max_model_len(mut self, tokens: usize) -> Self {
        self.config.max_model_len = Some(tokens);
        self
    }

    /// Compute threads of this engine (default: all cores).
    pub fn threads(mut self, threads: usize) -> Self {
        self.config.num_threads = Some(threads);
        self
    }

    /// Speculative decoding, as vLLM's `--speculative-config`.
    pub fn speculative(mut self, speculative: SpeculativeConfig) -> Self {
        self.config.speculative = Some(speculative);
        self
    }

    /// The engine settings as they stand.
    pub fn engine_config(&self) -> &EngineConfig {
        &self.config
    }

    /// Checks the settings against the model (before any weight is read), loads it, and
    /// brings the actors up.
    pub async fn build(self) -> Result<Engine> {
        let name = self.name.unwrap_or_else(|| {
            self.path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });
        Engine::start(name, self.path, self.config).await
    }
}
