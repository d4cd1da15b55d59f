//! The engine benchmarks of the command line (`bench-dcp`, `bench-engine`, `bench-spec`):
//! they drive an embedded [`dcpserve::Engine`], so they belong to the binary, not to the
//! library or to `dcpserve-tools` (which the library does not depend on).

pub mod dcp_bench;
pub mod engine_bench;
pub mod kl_divergence;
pub mod prefill_bench;
pub mod spec_bench;
pub mod synthetic_engine;
