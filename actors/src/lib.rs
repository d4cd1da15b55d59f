//! The actor system of one served model: a supervisor spawns the scheduler and the
//! rank actors (each computing on its own OS thread); the scheduler batches requests
//! continuously and broadcasts one plan per step.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use dcpserve_actors::{ModelSupervisor, SupervisorArgs, SupervisorMsg};
//! let files = Arc::new(dcpserve_model::ModelFiles::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?);
//! let args = SupervisorArgs { name: "smollm2".into(), files, engine: Default::default(), precision: Default::default(), draft: None };
//! let (sup, _) = ractor::Actor::spawn(None, ModelSupervisor, args).await?;
//! let info = ractor::call!(sup, SupervisorMsg::Info)?;
//! println!("{} KV tokens", info.kv_tokens_total);
//! # Ok(()) }
//! ```

pub mod block_manager;
pub mod collective;
mod gpu_kv_budget;
mod host_buffers;
pub mod kv_manager_actor;
mod model_sizing;
pub mod placement;
pub mod plan;
pub mod process_map;
pub mod rank;
mod rank_cuda;
pub mod rank_group;
mod rank_turns;
pub mod remote;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod seq_states;
pub mod speculative;
pub mod supervisor;
mod valid_request;

pub use block_manager::KvBlockManager;
pub use dcpserve_kernels::{OutputConstraint, SamplingParams};
pub use placement::Placement;
pub use request::{FinishReason, GenerationRequest, RequestEvent, TokenOutput};
pub use scheduler::{
    Scheduler, SchedulerArgs, SchedulerConfig, SchedulerMsg, SchedulerStats, SequenceKv, SpecStats,
    SpeculationLimits,
};
pub use supervisor::{ModelInfo, ModelSupervisor, SupervisorArgs, SupervisorMsg};
pub use valid_request::{PromptError, ValidPrompt, ValidRequest};
