//! `dcpserve bench`: a serving benchmark client for OpenAI-compatible servers. (Being written.)

use anyhow::{bail, Result};
use clap::Args;

/// Flags of `dcpserve bench`, named as `vllm bench serve` names them.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub base_url: String,
}

/// Runs the benchmark.
pub async fn run(_args: BenchServeArgs) -> Result<()> {
    bail!("dcpserve bench is not implemented yet")
}
