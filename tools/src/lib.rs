//! Tools around the dcpserve engine that the engine itself does not need; the `dcpserve`
//! command line reaches them as subcommands.
//!
//! - [`bench_client`]: `dcpserve bench`, a serving benchmark client for OpenAI-compatible
//!   servers (ours or a peer's), as `vllm bench serve`.
//! - [`planner`]: `dcpserve plan`, capacity planning of (tp, dcp) layouts.
//! - [`synthetic`]: random models of a chosen shape, written as safetensors, for the
//!   engine benchmarks.
//!
//! They live outside the `dcpserve` library so that embedding the engine does not pull
//! in an HTTP client, a plotting library or progress bars.

pub mod bench_client;
pub mod planner;
pub mod synthetic;
