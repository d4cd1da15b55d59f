//! Configuration of dcpserve: parallel layout, engine limits, the multi-model TOML file of
//! `dcpserve serve --config` ([`serve_file`]), and their validation; a model's layout and
//! KV cache resolved in one place ([`resolve`]), with the KV budget rule
//! ([`KvBudgetRule`]).
//!
//! Validation happens when a config is built, before any weight is read, and uses
//! vLLM's wording so its users recognise the messages.
//!
//! ```
//! use dcpserve_config::{ParallelConfig, AttentionKind};
//! let p = ParallelConfig { tensor_parallel_size: 9, decode_context_parallel_size: 3, ..Default::default() };
//! p.validate(AttentionKind::Gqa { num_attention_heads: 9, num_key_value_heads: 3 }, 16).unwrap();
//! ```

mod engine;
mod kv_budget;
mod model_source;
mod parallel;
mod rank_settings;
mod resolve;
pub mod serve_file;
mod speculative;

/// How a DCP group exchanges attention partials (an [`EngineConfig`] setting).
pub use dcpserve_kernels::dcp::MergeExchange;
pub use engine::{
    parse_kv_cache_dtype, DType, DistributedBackend, EngineConfig, ModeledLinkConfig,
};
pub use kv_budget::{meminfo_bytes, KvBudgetRule, SharedMemory, ACTIVATION_RESERVE_BYTES};
pub use model_source::ModelSourceFlags;
pub use parallel::{AttentionKind, ConfigError, ParallelConfig};
pub use rank_settings::{RankSettings, RankSettingsFlags};
pub use resolve::{resolve, KvSizing, ResolvedLayout};
pub use serve_file::{ModelEntry, SamplingDefaults, ServeConfig, ServerSection};
pub use speculative::{SpeculativeConfig, SpeculativeMethod, MAX_SPECULATIVE_TOKENS};

/// File name of the default model (SmolLM2-135M-Instruct, GGUF Q4_1).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model is looked for: `$DCPSERVE_MODELS_DIR`, else `./models`, else
/// the `models/` folder of this source tree (`scripts/fetch-default-model.sh` puts it there).
pub fn default_model_path() -> std::path::PathBuf {
    use std::path::Path;
    if let Ok(dir) = std::env::var("DCPSERVE_MODELS_DIR") {
        return Path::new(&dir).join(DEFAULT_MODEL_FILE);
    }
    let local = Path::new("models").join(DEFAULT_MODEL_FILE);
    if local.exists() {
        return local;
    }
    // This crate sits one folder below the workspace root.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .unwrap_or(manifest)
        .join("models")
        .join(DEFAULT_MODEL_FILE)
}
