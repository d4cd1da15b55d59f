//! dcpserve: an actor-based LLM serving engine whose headline feature is decode
//! context parallelism (the KV cache sharded across ranks by sequence position).
//!
//! Use it embedded through [`Engine`], started by an [`EngineBuilder`] (the command line,
//! `dcpserve serve` among it, is the `dcpserve-cli` package in cli/):
//!
//! ```no_run
//! # async fn demo() -> dcpserve::Result<()> {
//! use dcpserve::{Engine, Prompt};
//! let engine = Engine::builder(dcpserve::default_model_path()).build().await?;
//! let mut params = dcpserve::SamplingParams::default();
//! params.temperature = 0.0;
//! let out = engine.complete(Prompt::Text("Hello".into()), params).await?;
//! println!("{}", out.text);
//! # Ok(()) }
//! ```

mod blocking;
mod builder;
mod device_check;
#[cfg(feature = "mpi")]
pub mod distributed;
mod engine;
mod error;
pub mod hub;
mod speculation;

pub use builder::EngineBuilder;
pub use dcpserve_actors::{
    FinishReason, PromptError, SamplingParams, TokenOutput, ValidPrompt, ValidRequest,
};
pub use dcpserve_config::{
    default_model_path, parse_kv_cache_dtype, DType, DistributedBackend, EngineConfig,
    ModelSourceFlags, ModeledLinkConfig, ParallelConfig, RankSettings, RankSettingsFlags,
    SpeculativeConfig, SpeculativeMethod, DEFAULT_MODEL_FILE,
};
pub use dcpserve_kernels::{CpuMatmul, CudaGraphs, Device, GpuMatmul, KvCacheDType};
pub use dcpserve_model::ChatMessage;
pub use engine::{Completion, Engine, GenerationEvent, GenerationStream, Prompt};
pub use error::{Error, Result};
