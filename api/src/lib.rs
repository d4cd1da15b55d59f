//! The HTTP serving layer of dcpserve: an OpenAI-compatible API on warp.
//!
//! - `POST /v1/completions`, `POST /v1/chat/completions` (with SSE streaming), `GET /v1/models`
//! - vLLM's `POST /tokenize`, `POST /detokenize`, `GET /health`, `GET /version`
//! - `GET /metrics`: Prometheus text, labelled by model
//! - `GET /v1/engine/status`: KV blocks per rank, each sequence's KV per DCP rank,
//!   requests, tokens per second ([`engine_status`])
//! - `GET /`: a chat and engine page ([`web`]), unless turned off
//! - tool calls (`tools`, `tool_choice`; [`tools`], [`tool_parsers`]) and reasoning content
//!   ([`reasoning`]) on chat completions
//!
//! Models are reached through the [`ModelBackend`] trait (`dcpserve-cli` implements it
//! for dcpserve's `Engine`), routed by the request's `model` through a [`ModelRouter`] that bounds
//! each model's outstanding requests. Errors use OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! ```no_run
//! # async fn demo(backend: std::sync::Arc<dyn dcpserve_api::ModelBackend>) -> std::io::Result<()> {
//! use dcpserve_api::{serve, AppState, ModelRouter, ModelSlot};
//! let mut router = ModelRouter::new();
//! router.add(ModelSlot::new("my-model", backend, Default::default(), 256)).unwrap();
//! let (addr, server) = serve(
//!     "127.0.0.1:0".parse().unwrap(),
//!     AppState::new(router, None),
//!     std::future::pending(),
//! )
//! .await?;
//! println!("listening on {addr}");
//! server.await;
//! # Ok(()) }
//! ```

pub mod backend;
pub mod chat_messages;
pub mod chat_output;
pub mod engine_status;
pub mod errors;
#[doc(hidden)]
pub mod fuzzing;
pub mod generation;
pub mod http;
pub mod kv_status;
pub mod limits;
pub mod metrics;
pub mod reasoning;
pub mod request_fields;
pub mod router;
pub mod routes;
pub mod sse;
pub mod state;
pub mod structured;
pub mod tool_parsers;
pub mod tools;
pub mod types;
pub mod validation;
pub mod web;

pub use backend::{
    BackendError, BackendErrorKind, BackendEvent, BackendStats, EventStream, ModelBackend,
};
// The config file's types live in dcpserve-config; the router's API uses them.
pub use dcpserve_config::{ModelEntry, SamplingDefaults, ServeConfig, ServerSection};
pub use errors::ApiError;
pub use http::{routes as filter, serve};
pub use router::{ModelRouter, ModelSlot};
pub use state::AppState;
pub use tools::ChatSettings;
