//! The `dcpserve` command line, apart from its `main`: [`serve`], the HTTP server of
//! `dcpserve serve` around embedded [`dcpserve::Engine`]s, which the binary runs and the
//! HTTP tests start in-process. The other subcommands (generate, the benchmarks,
//! quantize, gpu-check) live with the binary in `main.rs`.

pub mod serve;
