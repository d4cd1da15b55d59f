//! `dcpserve plan`: a capacity planner for (tp, dcp) layouts.
//!
//! For a model (`config.json`, Hugging Face folder or GGUF file) on a machine (a preset
//! with overridable figures), it lists every (tp, dcp) layout of the machine's ranks:
//! weights per rank, KV bytes per token per rank, the KV capacity in tokens per rank and
//! in total (the engine's own resolution, [`dcpserve_config::resolve`]), how many
//! requests of a workload fit at once, and a roofline estimate of decode tok/s per rank
//! at that concurrency ([`roofline`]). Layouts the engine rejects appear with its
//! (vLLM's) constraint message. See [`plan_layouts`] for the library entry point.

mod dtype;
mod hardware;
mod layouts;
mod model_shape;
mod plan;
pub mod roofline;
mod table;
#[cfg(test)]
mod tests;
mod workload;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

pub use dtype::{KvDtype, WeightDtype};
pub use hardware::{Hardware, HardwareOverrides, HardwarePreset, KvBudgetRule};
pub use layouts::{candidate_layouts, check_layout, Layout};
pub use model_shape::{load_model_config, rank_params, RankParams};
pub use plan::{plan_layouts, weight_bytes_per_rank, LayoutEstimate, LayoutRow, PlanOptions};
pub use table::render;
pub use workload::{max_concurrency, RequestShape, Workload};

/// Flags of `dcpserve plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A model's `config.json`, a Hugging Face folder holding one, or a `.gguf` file
    /// (its header is read); the default model when absent.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Machine preset: h100, h200, b200, or cpu (this machine: one rank per core).
    #[arg(long, value_enum, default_value_t = HardwarePreset::Cpu)]
    pub hardware: HardwarePreset,
    /// Ranks (GPUs, or CPU cores); default 8 for GPUs, all cores for cpu.
    #[arg(long, visible_alias = "ranks")]
    pub gpus: Option<usize>,
    /// Memory per rank in GB (default: the preset's; cpu: MemTotal / ranks).
    #[arg(long)]
    pub mem_per_gpu_gb: Option<f64>,
    /// Memory bandwidth per rank in GB/s.
    #[arg(long)]
    pub mem_bw_gbs: Option<f64>,
    /// Interconnect bandwidth per rank and direction in GB/s.
    #[arg(long)]
    pub link_bw_gbs: Option<f64>,
    /// Dense matmul peak per rank in TFLOP/s.
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Fixed cost of one collective in microseconds.
    #[arg(long)]
    pub collective_latency_us: Option<f64>,
    /// Fraction of GPU memory the engine may use (vLLM's default 0.9).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// GPU memory per rank kept for activations, CUDA graphs and NCCL, in GiB (default 4).
    #[arg(long)]
    pub activation_reserve_gb: Option<f64>,
    /// KV-cache bytes per rank, exactly (as `dcpserve serve --kv-cache-memory-bytes`).
    #[arg(long)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Format of the MLP / expert weights (and of attention unless --attention-dtype).
    #[arg(long, value_enum, default_value_t = WeightDtype::Bf16)]
    pub weight_dtype: WeightDtype,
    /// Format of the attention projections (default: --weight-dtype).
    #[arg(long, value_enum)]
    pub attention_dtype: Option<WeightDtype>,
    /// KV-cache format, as the engine's --kv-cache-dtype (auto, f32, bf16, fp8 = fp8_e4m3,
    /// fp8_e5m2; default auto, resolved as the engine resolves it: f32 for f32 weights,
    /// bf16 otherwise).
    #[arg(long, value_enum, alias = "kv-cache-dtype")]
    pub kv_dtype: Option<KvDtype>,
    /// Tokens per KV block on one rank.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Consecutive tokens per DCP rank.
    #[arg(long, default_value_t = 1)]
    pub cp_kv_cache_interleave_size: usize,
    /// Most sequences in one step (the engine's default 256).
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Every request's prompt length (default 2048 unless another workload is given).
    #[arg(long, visible_alias = "input-len")]
    pub context_len: Option<usize>,
    /// Median prompt length of log-normally distributed prompts.
    #[arg(long, conflicts_with = "context_len")]
    pub input_len_median: Option<usize>,
    /// σ of the log of the prompt lengths (with --input-len-median; 0 = all at the median).
    #[arg(long, default_value_t = 0.0)]
    pub input_len_sigma: f64,
    /// Prompt lengths uniform in LO:HI.
    #[arg(long, value_name = "LO:HI", conflicts_with_all = ["context_len", "input_len_median"])]
    pub input_len_range: Option<String>,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// A JSON-lines trace of requests (`input_len`, optional `output_len` per line).
    #[arg(long, conflicts_with_all = ["context_len", "input_len_median", "input_len_range"])]
    pub trace: Option<PathBuf>,
    /// Evaluate at this many concurrent requests (default: the most that fit).
    #[arg(long)]
    pub concurrency: Option<usize>,
}

impl PlanArgs {
    fn workload(&self) -> Result<Workload> {
        if let Some(path) = &self.trace {
            return Workload::from_trace(path, self.output_len);
        }
        if let Some(range) = &self.input_len_range {
            let Some((lo, hi)) = range.split_once(':') else {
                bail!("--input-len-range takes LO:HI, found {range:?}");
            };
            return Ok(Workload::uniform(
                lo.trim().parse()?,
                hi.trim().parse()?,
                self.output_len,
            ));
        }
        if let Some(median) = self.input_len_median {
            if self.input_len_sigma == 0.0 {
                return Ok(Workload::fixed(median, self.output_len));
            }
            return Ok(Workload::lognormal(
                median,
                self.input_len_sigma,
                self.output_len,
            ));
        }
        Ok(Workload::fixed(
            self.context_len.unwrap_or(2048),
            self.output_len,
        ))
    }

    fn hardware(&self) -> Hardware {
        Hardware::new(
            self.hardware,
            &HardwareOverrides {
                ranks: self.gpus,
                mem_per_rank_gb: self.mem_per_gpu_gb,
                mem_bw_gbs: self.mem_bw_gbs,
                link_bw_gbs: self.link_bw_gbs,
                peak_tflops: self.peak_tflops,
                collective_latency_us: self.collective_latency_us,
                gpu_memory_utilization: self.gpu_memory_utilization,
                activation_reserve_gb: self.activation_reserve_gb,
                kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            },
        )
    }

    /// The options these flags describe.
    pub fn options(&self) -> Result<PlanOptions> {
        if self.block_size == 0 || self.max_num_seqs == 0 {
            bail!("--block-size and --max-num-seqs must be at least 1");
        }
        Ok(PlanOptions {
            weight_dtype: self.weight_dtype,
            attention_dtype: self.attention_dtype.unwrap_or(self.weight_dtype),
            kv_dtype: self.kv_dtype.unwrap_or(KvDtype::Auto),
            block_size: self.block_size,
            interleave: self.cp_kv_cache_interleave_size,
            max_num_seqs: self.max_num_seqs,
            workload: self.workload()?,
            concurrency: self.concurrency,
        })
    }
}

/// Runs the planner and prints its table.
pub fn run(args: PlanArgs) -> Result<()> {
    let path = args
        .model
        .clone()
        .unwrap_or_else(dcpserve_config::default_model_path);
    let cfg = load_model_config(&path)?;
    let hw = args.hardware();
    if hw.ranks == 0 {
        bail!("--gpus must be at least 1");
    }
    let opts = args.options()?;
    let rows = plan_layouts(&cfg, &hw, &opts);
    print!("{}", render(&cfg, &hw, &opts, &rows));
    Ok(())
}
