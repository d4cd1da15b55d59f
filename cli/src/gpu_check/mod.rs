//! `dcpserve gpu-check`: the checks a GPU backend must pass, in one command that writes
//! one report (`scripts/gpu-check.sh` runs it on the GPU machine, with `serve` and
//! `bench` around it).
//!
//! 1. every backend op against the CPU backend on random inputs (max abs / rel diff);
//! 2. long-context decode attention as achieved bandwidth against a device copy;
//! 3. the engine on the test fixtures at several layouts against the CPU engine;
//! 4. decode steps replayed from CUDA graphs against the same steps launched eagerly
//!    (bit-identical logits).
//!
//! `--device cpu` runs the same checks with the CPU backend as the checked device,
//! which is how CI exercises this code without a GPU (every difference is then 0).

pub mod bandwidth;
pub mod engine;
pub mod graphs;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use dcpserve::{Device, EngineConfig, RankSettings};
use dcpserve_gpu_check::compare_with_cpu;
use dcpserve_kernels::{Backend, CpuBackend, CudaBackend, CudaGraphs};

/// Arguments of `dcpserve gpu-check`.
#[derive(Args, Debug)]
pub struct GpuCheckArgs {
    /// The checked device: cuda, or cpu (the checks' dry run).
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Folder the report (`gpu-check.txt`) is written to.
    #[arg(long)]
    pub report: PathBuf,
    /// The test fixtures folder (the repository's `fixtures/`).
    #[arg(long, default_value = "fixtures")]
    pub fixtures: PathBuf,
    /// Context lengths of the decode-attention bandwidth check.
    #[arg(long, value_delimiter = ',', default_value = "32768,131072")]
    pub contexts: Vec<usize>,
    /// Size of the device-to-device copy that the bandwidth is compared with.
    #[arg(long, default_value_t = 1024)]
    pub copy_mib: usize,
    /// Skip the engine cases (kernels and bandwidth only).
    #[arg(long)]
    pub skip_engine: bool,
    /// With --device cuda: whether the checked backend and the engine cases replay
    /// decode steps from CUDA graphs (on, the default) or launch every kernel one by
    /// one (off), as the engine's --cuda-graphs.
    #[arg(long, default_value = "on")]
    pub cuda_graphs: CudaGraphs,
}

/// One section of the report and whether it passed.
struct Section {
    title: &'static str,
    body: String,
    passed: bool,
}

/// Largest relative difference an op may show against the CPU. Ops whose device
/// version rounds to bf16 (GEMMs and embeddings of weights dequantized to bf16 at
/// load, a bf16 or fp8 cache) are held to that type's precision; the rest to f32
/// summation-order noise.
fn op_tolerance(op: &str) -> f64 {
    if op.contains("fp8") {
        0.07
    } else if op.starts_with("matmul") || op.contains("bfloat16") || op.contains("embedding") {
        2e-2
    } else {
        1e-4
    }
}

fn kernel_section<B: Backend>(dev: &B) -> Result<Section> {
    let cpu = CpuBackend::new(2);
    let diffs = compare_with_cpu(dev, &cpu).context("comparing ops with the CPU")?;
    let mut body = String::new();
    let mut passed = true;
    for d in &diffs {
        let ok = d.max_rel <= op_tolerance(&d.op);
        passed &= ok;
        body += &format!(
            "{d}  (tolerance {:.0e}) {}\n",
            op_tolerance(&d.op),
            if ok { "ok" } else { "FAILED" }
        );
    }
    Ok(Section {
        title: "ops against the CPU backend (random inputs)",
        body,
        passed,
    })
}

/// Whether the CUDA device is the emulated one (`gpu_emu/`, which names its devices
/// "dcpemu emulated CUDA device N"): its timings are the host CPU's, not a GPU's.
fn is_emulated(device_name: &str) -> bool {
    device_name.starts_with("dcpemu ")
}

fn bandwidth_section<B: Backend>(dev: &B, args: &GpuCheckArgs, emulated: bool) -> Result<Section> {
    let body = if emulated {
        // The kernels still run (so this section's code paths execute), but a figure
        // would be the CPU's speed under emulation and could be mistaken for a GPU's.
        bandwidth::run_once(dev, &args.contexts, args.copy_mib << 20)?;
        format!(
            "emulated: the copy ({} MiB) and decode attention at {:?} tokens ran; no bandwidth \
             figure, since the emulated device's timings are the host CPU's, not a GPU's\n",
            args.copy_mib, args.contexts
        )
    } else {
        bandwidth::report(dev, &args.contexts, args.copy_mib << 20)?
    };
    Ok(Section {
        title: "decode attention bandwidth",
        body,
        // A figure to read (the aim is 70% of the copy), not a pass/fail gate.
        passed: true,
    })
}

async fn engine_section(
    args: &GpuCheckArgs,
    checked: &dyn Fn(EngineConfig) -> EngineConfig,
) -> Result<Section> {
    let (body, passed) = engine::report(&args.fixtures, &engine::default_cases(), checked).await?;
    Ok(Section {
        title: "engine on the fixtures against the CPU engine at one rank",
        body,
        passed,
    })
}

/// The graphs check on the dense fixture with `with_graphs` against `eager`.
fn graphs_section<B: Backend>(
    args: &GpuCheckArgs,
    with_graphs: B,
    eager: B,
    stats: &dyn Fn(&B) -> (u64, String),
    must_replay: bool,
) -> Result<Section> {
    let fixture = args.fixtures.join("tiny-llama");
    let (body, passed) = graphs::report(&fixture, with_graphs, eager, stats, must_replay)?;
    Ok(Section {
        title: "decode steps from CUDA graphs against eager launches",
        body,
        passed,
    })
}

async fn sections_on<B: Backend>(
    dev: &B,
    args: &GpuCheckArgs,
    emulated: bool,
    checked: &dyn Fn(EngineConfig) -> EngineConfig,
) -> Result<Vec<Section>> {
    let mut v = vec![
        kernel_section(dev)?,
        bandwidth_section(dev, args, emulated)?,
    ];
    if !args.skip_engine {
        v.push(engine_section(args, checked).await?);
    }
    Ok(v)
}

/// Runs the checks and writes `gpu-check.txt` into the report folder; fails when a
/// check failed (after writing the report).
pub async fn run(args: &GpuCheckArgs) -> Result<()> {
    std::fs::create_dir_all(&args.report)
        .with_context(|| format!("creating {}", args.report.display()))?;
    let (device_line, sections) = match args.device.as_str() {
        "cpu" => {
            let dev = CpuBackend::new(2);
            (
                format!(
                    "device: cpu ({} threads), the dry run",
                    dev.pool().n_threads()
                ),
                {
                    let mut v = sections_on(&dev, args, false, &|c| c).await?;
                    let none = |_: &CpuBackend| {
                        (
                            0,
                            "cpu: no device graphs, both runs launch eagerly (the dry run)".into(),
                        )
                    };
                    let (a, b) = (CpuBackend::new(2), CpuBackend::new(2));
                    v.push(graphs_section(args, a, b, &none, false)?);
                    v
                },
            )
        }
        "cuda" => cuda_sections(args).await?,
        other => bail!("--device {other}: expected cuda or cpu"),
    };
    let mut text = format!("dcpserve gpu-check\n{device_line}\n");
    let mut all = true;
    for s in &sections {
        all &= s.passed;
        text += &format!(
            "\n## {} — {}\n{}",
            s.title,
            if s.passed { "passed" } else { "FAILED" },
            s.body
        );
    }
    let path = args.report.join("gpu-check.txt");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    print!("{text}");
    if !all {
        bail!("gpu-check: a check failed (report in {})", path.display());
    }
    Ok(())
}

/// The checks on GPU 0 through the CUDA backend; the engine cases with `--device cuda`.
async fn cuda_sections(args: &GpuCheckArgs) -> Result<(String, Vec<Section>)> {
    // Exact products for the op checks (`Precision::Fast` cases cover the tensor cores).
    let dev = CudaBackend::new(0)
        .map(|d| {
            d.with_gpu_matmul(dcpserve_kernels::GpuMatmul::Exact)
                .with_cuda_graphs(args.cuda_graphs)
        })
        .map_err(|e| anyhow::anyhow!("gpu-check --device cuda: {e}"))?;
    let emulated = is_emulated(dev.device_name());
    let line = format!(
        "device: cuda{}, GPU 0 of {}: {} ({:.1} GiB, {:.1} GiB free), CUDA graphs {}",
        if emulated {
            " (emulated: not a GPU run; timings are not a GPU's)"
        } else {
            ""
        },
        dcpserve_kernels::cuda_device_count().unwrap_or(0),
        dev.device_name(),
        dev.total_memory().unwrap_or(0) as f64 / (1u64 << 30) as f64,
        dev.free_memory().unwrap_or(0) as f64 / (1u64 << 30) as f64,
        args.cuda_graphs,
    );
    let checked = |c: EngineConfig| EngineConfig {
        rank_settings: RankSettings {
            device: Device::Cuda,
            cuda_graphs: args.cuda_graphs,
            ..c.rank_settings
        },
        ..c
    };
    let mut sections = sections_on(&dev, args, emulated, &checked).await?;
    let open = |g: CudaGraphs| {
        CudaBackend::new(0)
            .map(|d| d.with_cuda_graphs(g))
            .map_err(|e| anyhow::anyhow!("gpu-check --device cuda: {e}"))
    };
    let stats = |d: &CudaBackend| {
        let (s, off) = d.graph_stats();
        let why = off.map_or(String::new(), |w| format!("; graphs turned OFF: {w}"));
        (
            s.replayed,
            format!(
                "graph steps: {} replayed, {} captured, {} run eagerly after a refusal{why}",
                s.replayed, s.captured, s.refused
            ),
        )
    };
    sections.push(graphs_section(
        args,
        open(CudaGraphs::On)?,
        open(CudaGraphs::Off)?,
        &stats,
        true,
    )?);
    Ok((line, sections))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerances_follow_the_rounding_of_each_op() {
        assert_eq!(op_tolerance("rms_norm"), 1e-4);
        assert_eq!(op_tolerance("matmul Q4_1 m=1"), 2e-2);
        assert_eq!(op_tolerance("paged_attention out (bfloat16)"), 2e-2);
        assert_eq!(op_tolerance("paged_attention out (fp8_e4m3)"), 0.07);
        assert_eq!(op_tolerance("embedding (Q8_0 table)"), 2e-2);
    }

    #[test]
    fn the_emulated_device_is_told_from_a_gpu() {
        assert!(is_emulated("dcpemu emulated CUDA device 0"));
        assert!(!is_emulated("NVIDIA H100 80GB HBM3"));
    }
}
