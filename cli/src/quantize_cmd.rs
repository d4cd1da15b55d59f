//! `dcpserve quantize IN.gguf OUT.gguf --type Q4_K_M`: re-quantizes a GGUF file with
//! [`dcpserve_model::gguf::quantize_gguf`] (the type rules are documented there).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use dcpserve_model::gguf::{quantize_gguf, QuantTarget};
use dcpserve_model::GgufFile;

#[derive(Args)]
pub struct QuantizeArgs {
    /// The GGUF file to read (any type the engine loads).
    input: PathBuf,
    /// Where to write the re-quantized GGUF file.
    output: PathBuf,
    /// Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S, or one type for every matrix: Q8_0, Q6_K,
    /// Q5_K, Q4_K, Q3_K, Q2_K, Q5_1, Q5_0, Q4_1, Q4_0, IQ4_NL, IQ4_XS, F16, BF16, F32.
    #[arg(long = "type", value_parser = |s: &str| s.parse::<QuantTarget>())]
    target: QuantTarget,
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let src = GgufFile::open(&a.input).with_context(|| format!("opening {}", a.input.display()))?;
    let start = std::time::Instant::now();
    let (bytes, report) = quantize_gguf(&src, a.target)?;
    std::fs::write(&a.output, &bytes).with_context(|| format!("writing {}", a.output.display()))?;
    for (dtype, n, size) in &report.by_type {
        eprintln!(
            "{dtype:>7}: {n:>4} tensors, {:>8.1} MiB",
            *size as f64 / (1 << 20) as f64
        );
    }
    eprintln!(
        "wrote {} ({:.1} MiB) in {:.1} s",
        a.output.display(),
        bytes.len() as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
