//! `dcpserve plan`: a capacity planner for (tp, dcp) layouts. (Being written.)

use anyhow::{bail, Result};
use clap::Args;

/// Flags of `dcpserve plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A model's `config.json`, or the folder holding it.
    #[arg(long)]
    pub model: std::path::PathBuf,
}

/// Runs the planner and prints its table.
pub fn run(_args: PlanArgs) -> Result<()> {
    bail!("dcpserve plan is not implemented yet")
}
