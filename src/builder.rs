//! [`EngineBuilder`]: the settings of an embedded engine, gathered before it starts; the
//! one way to start an [`Engine`].

use std::path::{Path, PathBuf};

use dcpserve_config::{
    DType, EngineConfig, ModelSourceFlags, ParallelConfig, ServeConfig, SpeculativeConfig,
};

use crate::blocking::blocking;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::hub;

// Defined here rather than in engine.rs so that the engine does not depend on its builder.
impl Engine {
    /// A builder for the engine of the model at `path`: a GGUF file, a Hugging Face
    /// folder, or a Hugging Face repo id (`Qwen/Qwen3-0.6B`, `org/name-GGUF:Q4_K_M`)
    /// resolved by [`crate::hub`] when it is built; see [`EngineBuilder`].
    pub fn builder(path: impl Into<PathBuf>) -> EngineBuilder {
        EngineBuilder::new(path.into())
    }
}

/// Settings of an [`Engine`] to start: the model, the name it is served under, and its
/// [`EngineConfig`] (whole, or field by field). Made by [`Engine::builder`]; nothing is
/// checked or read until [`EngineBuilder::build`], which also resolves a Hugging Face
/// repo id (see [`crate::hub`]; a local path that exists wins).
///
/// ```no_run
/// # async fn demo() -> dcpserve::Result<()> {
/// use dcpserve::{DType, Engine, ParallelConfig, Prompt};
/// let engine = Engine::builder("models/SmolLM2-135M-Instruct.Q4_1.gguf")
///     .name("smollm2")
///     .parallel(ParallelConfig {
///         tensor_parallel_size: 3,
///         decode_context_parallel_size: 3,
///         ..Default::default()
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
    source: ModelSourceFlags,
}

impl EngineBuilder {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            name: None,
            config: EngineConfig::default(),
            source: ModelSourceFlags::default(),
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
            source: entry.model_source.clone(),
        })
    }

    /// The name the model is served under (default: its file or folder name without
    /// extension).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Where a model named by a Hugging Face repo id comes from (`revision`, `gguf_file`,
    /// `download_dir`), all at once; a local path ignores them.
    pub fn model_source(mut self, flags: ModelSourceFlags) -> Self {
        self.source = flags;
        self
    }

    /// The branch, tag or commit of a Hugging Face repo id (default: `main`).
    ///
    /// ```no_run
    /// # async fn demo() -> dcpserve::Result<()> {
    /// let engine = dcpserve::Engine::builder("Qwen/Qwen3-0.6B")
    ///     .revision("main")
    ///     .download_dir("/data/hf-cache")
    ///     .build()
    ///     .await?;
    /// assert_eq!(engine.name(), "Qwen/Qwen3-0.6B");
    /// # Ok(()) }
    /// ```
    pub fn revision(mut self, revision: impl Into<String>) -> Self {
        self.source.revision = Some(revision.into());
        self
    }

    /// Which `.gguf` file of a GGUF repo to load: a quantization (`Q4_K_M`) or a file
    /// name; the same as writing `ID:Q4_K_M`.
    pub fn gguf_file(mut self, file: impl Into<String>) -> Self {
        self.source.gguf_file = Some(file.into());
        self
    }

    /// The Hugging Face cache to look in and download into (default: `HF_HUB_CACHE`,
    /// else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub fn download_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.source.download_dir = Some(dir.into());
        self
    }

    /// All engine settings at once, replacing those set so far.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// The (tp, dcp, pcp, interleave) layout of the ranks.
    pub fn parallel(mut self, parallel: ParallelConfig) -> Self {
        self.config.parallel = parallel;
        self
    }

    /// Copies of the TP group that split each prefill's tokens
    /// (`--prefill-context-parallel-size`; world = tp × pcp).
    ///
    /// ```no_run
    /// # async fn demo() -> dcpserve::Result<()> {
    /// let engine = dcpserve::Engine::builder("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ///     .prefill_context_parallel_size(2)
    ///     .build()
    ///     .await?;
    /// assert_eq!(engine.layout().world(), 2);
    /// # Ok(()) }
    /// ```
    pub fn prefill_context_parallel_size(mut self, pcp: usize) -> Self {
        self.config.parallel.prefill_context_parallel_size = pcp;
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

    /// Resolves a Hugging Face repo id (the model's, and a draft model's) to its files in
    /// the cache, downloading them when needed; checks the settings against the model
    /// (before any weight is read), loads it, and brings the actors up. A local path is
    /// taken as it is.
    pub async fn build(self) -> Result<Engine> {
        let name = self.name.unwrap_or_else(|| hub::served_name(&self.path));
        let mut config = self.config;
        let draft = config.speculative.as_ref().and_then(|s| s.model.clone());
        let ids = [Some(&self.path), draft.as_ref()]
            .into_iter()
            .flatten()
            .any(|p| matches!(hub::ModelSpec::parse(p), hub::ModelSpec::Hub(_)));
        if ids {
            // A machine without the device learns it before a download.
            crate::device_check::check_device(config.rank_settings.device)?;
        }
        let (spec, source) = (self.path, self.source);
        let (path, draft) = blocking(move || -> Result<_> {
            let path = resolve_id(&spec, &source)?;
            // A draft model's id takes its file selector after a colon; the revision and
            // the GGUF file of the flags are the target's.
            let draft_source = ModelSourceFlags {
                download_dir: source.download_dir.clone(),
                ..Default::default()
            };
            let draft = draft
                .map(|d| resolve_id(&d, &draft_source))
                .transpose()
                .map_err(|e| Error::ModelLoading(format!("draft model: {e}")))?;
            Ok((path, draft))
        })
        .await??;
        if let (Some(s), Some(d)) = (config.speculative.as_mut(), draft) {
            s.model = Some(d);
        }
        Engine::start(name, path, config).await
    }
}

/// The local path of a hub id (see [`hub::resolve_model`]); a local path as it is, so that
/// the engine's start reports a missing one after its device check, as before.
fn resolve_id(spec: &Path, source: &ModelSourceFlags) -> Result<PathBuf> {
    match hub::ModelSpec::parse(spec) {
        hub::ModelSpec::Local(path) => Ok(path),
        hub::ModelSpec::Hub(_) => hub::resolve_model(spec, source),
    }
}
