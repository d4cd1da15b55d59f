//! Configuration of dcpserve: parallel layout, engine limits, and their validation.
//!
//! Validation happens when a config is built, before any weight is read, and uses
//! vLLM's wording so its users recognise the messages.
//!
//! ```
//! use dcpserve_config::{ParallelConfig, AttentionKind};
//! let p = ParallelConfig { tensor_parallel_size: 9, decode_context_parallel_size: 3, cp_kv_cache_interleave_size: 1 };
//! p.validate(AttentionKind::Gqa { num_attention_heads: 9, num_key_value_heads: 3 }, 16).unwrap();
//! ```

mod engine;
mod parallel;
mod speculative;

/// How a DCP group exchanges attention partials (an [`EngineConfig`] setting).
pub use dcpserve_kernels::dcp::MergeExchange;
pub use engine::{DType, EngineConfig, ModeledLinkConfig};
pub use parallel::{AttentionKind, ConfigError, ParallelConfig, RankLayout};
pub use speculative::{SpeculativeConfig, SpeculativeMethod, MAX_SPECULATIVE_TOKENS};
