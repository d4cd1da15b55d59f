//! dcpserve: an actor-based LLM serving engine whose headline feature is decode
//! context parallelism (the KV cache sharded across ranks by sequence position).
//!
//! Use it embedded through [`Engine`]:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use dcpserve::{Engine, Prompt};
//! let engine = Engine::from_path(dcpserve::default_model_path(), Default::default()).await?;
//! let mut params = dcpserve::SamplingParams::default();
//! params.temperature = 0.0;
//! let out = engine.complete(Prompt::Text("Hello".into()), params).await?;
//! println!("{}", out.text);
//! # Ok(()) }
//! ```

pub mod bench_client;
pub mod dcp_bench;
mod engine;
pub mod engine_bench;
pub mod planner;
pub mod serve;
pub mod spec_bench;
mod speculation;
pub mod synthetic;

pub use dcpserve_actors::{FinishReason, SamplingParams, TokenOutput};
pub use dcpserve_config::{
    DType, EngineConfig, ModeledLinkConfig, ParallelConfig, SpeculativeConfig, SpeculativeMethod,
};
pub use dcpserve_model::ChatMessage;
pub use engine::{Completion, Engine, GenerationEvent, GenerationStream, Prompt};

/// File name of the default model (SmolLM2-135M-Instruct, GGUF Q4_1).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model is looked for: `$DCPSERVE_MODELS_DIR`, else `./models`, else
/// the `models/` folder of this source tree (`scripts/fetch-default-model.sh` puts it there).
pub fn default_model_path() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("DCPSERVE_MODELS_DIR") {
        return std::path::Path::new(&dir).join(DEFAULT_MODEL_FILE);
    }
    let local = std::path::Path::new("models").join(DEFAULT_MODEL_FILE);
    if local.exists() {
        return local;
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(DEFAULT_MODEL_FILE)
}
