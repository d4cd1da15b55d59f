//! The `dcpserve` command line.

mod bench;
mod gpu_check;
mod logging;
mod quantize_cmd;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use dcpserve::{ChatMessage, DType, Engine, EngineConfig, GenerationEvent, Prompt, SamplingParams};
use futures::StreamExt;

#[derive(Parser)]
#[command(
    name = "dcpserve",
    version,
    about = "LLM serving engine with decode context parallelism"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr: text (coloured only on a terminal) or json (one object per
    /// line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt and stream it to stdout.
    Generate(GenerateArgs),
    /// Serve models over an OpenAI-compatible HTTP API.
    Serve(Box<dcpserve_cli::serve::ServeArgs>),
    /// Benchmark an OpenAI-compatible server (ours or a peer's), as `vllm bench serve` does.
    Bench(dcpserve_tools::bench_client::BenchServeArgs),
    /// Plan capacity: every valid (tp, dcp) layout of a model on given hardware.
    Plan(dcpserve_tools::planner::PlanArgs),
    /// Decode context parallelism in miniature: long-context step time and capacity, dcp=1 vs dcp=tp.
    #[command(name = "bench-dcp")]
    BenchDcp(BenchDcpArgs),
    /// Measure prefill and decode throughput (one JSON line on stdout).
    #[command(name = "bench-engine")]
    BenchEngine(BenchArgs),
    /// Decode speed with n-gram speculation vs without, on workloads that repeat their context.
    #[command(name = "bench-spec")]
    BenchSpec(BenchSpecArgs),
    /// Re-quantize a GGUF file (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q5_0, …), as llama-quantize does.
    Quantize(quantize_cmd::QuantizeArgs),
    /// KL divergence of the int8-activation matmul from the f32 path on a text (one JSON line).
    #[command(name = "kl-divergence")]
    KlDivergence(KlDivergenceArgs),
    /// Check a GPU backend: ops against the CPU, decode-attention bandwidth, the engine on the fixtures.
    #[command(name = "gpu-check")]
    GpuCheck(gpu_check::GpuCheckArgs),
}

#[derive(Args)]
struct KlDivergenceArgs {
    /// A GGUF file, a Hugging Face model folder, or a Hugging Face repo id (ORG/NAME, or
    /// ORG/NAME-GGUF:Q4_K_M), looked up in the Hugging Face cache and downloaded into it
    /// when missing (default: SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// `--revision`, `--gguf-file`, `--download-dir` of a Hugging Face repo id.
    #[command(flatten)]
    model_source: dcpserve::ModelSourceFlags,
    /// The text to score (plain UTF-8).
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Most chunks scored.
    #[arg(long, default_value_t = 8)]
    chunks: usize,
    /// Tokens per forward pass (default: the whole chunk in one prefill); 1 to 4 score
    /// the chunk as decode steps do, through the one-row / small-batch kernels.
    #[arg(long)]
    step: Option<usize>,
    /// The path compared with f32: `int8` (every quantized product) or `auto` (the
    /// products `--cpu-matmul auto` sends to int8).
    #[arg(long, default_value = "int8")]
    against: String,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

#[derive(Args)]
struct BenchDcpArgs {
    /// Ranks (tensor-parallel size); compared at dcp=1 and dcp=tp.
    #[arg(long = "tensor-parallel-size", short = 't', default_value_t = 2)]
    tp: usize,
    /// History length of the step-time measurement.
    #[arg(long, default_value_t = 16384)]
    context: usize,
    /// Query heads of the synthetic model (it has one KV head; must divide by tp).
    #[arg(long, default_value_t = 8)]
    query_heads: usize,
    /// Decode steps measured (the median is reported).
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Length of each sequence in the capacity measurement.
    #[arg(long, default_value_t = 2048)]
    capacity_context: usize,
    /// Sequences submitted at once in the capacity measurement.
    #[arg(long, default_value_t = 16)]
    capacity_sequences: usize,
    /// Prompt length of the prefill measurement (section `prefill`).
    #[arg(long, default_value_t = 16384)]
    prefill_context: usize,
    /// Prefills measured per layout in the prefill measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    prefill_runs: usize,
    /// Sequences in the overlap and merge measurements.
    #[arg(long, default_value_t = 32)]
    overlap_batch: usize,
    /// Prompt length of each sequence in the overlap and merge measurements.
    #[arg(long, default_value_t = 1024)]
    overlap_context: usize,
    /// Compute threads in all.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Latency per collective of the modeled link in the overlap and merge measurements (µs).
    #[arg(long, default_value_t = 100.0)]
    link_latency_us: f64,
    /// Bandwidth of the modeled link in the overlap and merge measurements (GB/s).
    #[arg(long, default_value_t = 10.0)]
    link_gbps: f64,
    /// Measurements to run (all by default).
    #[arg(long = "section", value_enum)]
    sections: Vec<bench::dcp_bench::DcpBenchSection>,
    /// How the KV cache stores values: auto (= float32: the synthetic model computes in
    /// float32), float32, bfloat16, fp8 (= fp8_e4m3), fp8_e5m2.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// Where the ranks run (section `ranks`): mp (threads of this process) or mpi (the
    /// processes of `mpirun`; see scripts/bench-mpi.sh).
    #[arg(long, default_value = "mp")]
    distributed_executor_backend: String,
}

#[derive(Args)]
struct BenchSpecArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Most tokens generated per request.
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// Runs of each workload per engine (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated per sequence in the decode measurements.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Concurrent sequences of the batched decode measurement.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Repeats of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

/// Engine flags shared by the subcommands, named as vLLM names them.
#[derive(Args)]
struct EngineArgs {
    /// A GGUF file, a Hugging Face model folder, or a Hugging Face repo id (ORG/NAME, or
    /// ORG/NAME-GGUF:Q4_K_M), looked up in the Hugging Face cache and downloaded into it
    /// when missing (default: SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// `--revision`, `--gguf-file`, `--download-dir` of a Hugging Face repo id.
    #[command(flatten)]
    model_source: dcpserve::ModelSourceFlags,
    /// Weight precision: auto (bf16, or quantized weights kept quantized), float32, bfloat16.
    #[arg(long, default_value = "auto")]
    dtype: String,
    #[command(flatten)]
    rank_settings: dcpserve::RankSettingsFlags,
    /// With --device cuda: the share of each GPU's memory to use (weights, activations
    /// and the KV cache sized from what remains), as vLLM's flag.
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// How the KV cache stores values (vLLM's names): auto (float32 under
    /// --dtype float32, else bfloat16), float32, bfloat16, fp8 (= fp8_e4m3), fp8_e5m2.
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: String,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV-cache bytes per rank (default: derived from free memory).
    #[arg(long)]
    kv_cache_memory_bytes: Option<u64>,
    /// Longest prompt + output (default: the model's context length).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Speculative decoding as JSON, as vLLM's --speculative-config (bench-spec's default:
    /// n-gram lookup of 4 tokens, n from 2 to 4).
    #[arg(long, value_parser = parse_speculative_config)]
    speculative_config: Option<dcpserve::SpeculativeConfig>,
    /// Where the rank actors run: mp (threads of this process) or mpi (the processes of
    /// `mpirun`; needs a build with `--features mpi`).
    #[arg(long, default_value = "mp")]
    distributed_executor_backend: String,
    /// Ranks of the model; `-tp` works too.
    #[arg(long, default_value_t = 1)]
    tensor_parallel_size: usize,
    /// Ranks sharding the KV cache by position; `-dcp` works too.
    #[arg(long, default_value_t = 1)]
    decode_context_parallel_size: usize,
    /// Copies of the TP group splitting each prefill's tokens; `-pcp` works too.
    #[arg(long, default_value_t = 1)]
    prefill_context_parallel_size: usize,
}

fn parse_speculative_config(s: &str) -> Result<dcpserve::SpeculativeConfig, String> {
    dcpserve::SpeculativeConfig::from_json(s).map_err(|e| e.to_string())
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long)]
    seed: Option<u64>,
}

impl EngineArgs {
    /// The model's local path (a Hugging Face repo id resolved, downloading it when
    /// needed) and the engine settings.
    fn config(&self) -> Result<(PathBuf, EngineConfig)> {
        let path = model_path(self.model.as_ref(), &self.model_source)?;
        let cfg = EngineConfig {
            dtype: self.dtype.parse::<DType>()?,
            rank_settings: self.rank_settings.rank_settings()?,
            gpu_memory_utilization: self.gpu_memory_utilization,
            kv_cache_dtype: dcpserve::parse_kv_cache_dtype(&self.kv_cache_dtype)?,
            block_size: self.block_size,
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            max_model_len: self.max_model_len,
            num_threads: self.threads,
            speculative: self.speculative_config.clone(),
            distributed_executor_backend: self.distributed_executor_backend.parse()?,
            parallel: dcpserve::ParallelConfig {
                tensor_parallel_size: self.tensor_parallel_size,
                decode_context_parallel_size: self.decode_context_parallel_size,
                prefill_context_parallel_size: self.prefill_context_parallel_size,
                cp_kv_cache_interleave_size: 1,
            },
            ..Default::default()
        };
        Ok((path, cfg))
    }
}

/// The local path of `model` (the default model when `None`), a Hugging Face repo id
/// resolved through [`dcpserve::hub`].
fn model_path(model: Option<&PathBuf>, source: &dcpserve::ModelSourceFlags) -> Result<PathBuf> {
    let Some(spec) = model else {
        let path = dcpserve::default_model_path();
        if !path.exists() {
            bail!(
                "The default model is not at {}: run scripts/fetch-default-model.sh first.",
                path.display()
            );
        }
        return Ok(path);
    };
    Ok(dcpserve::hub::resolve_model(spec, source)?)
}

async fn generate(args: GenerateArgs) -> Result<()> {
    let (path, cfg) = args.engine.config()?;
    let engine = Engine::builder(path).config(cfg).build().await?;
    let prompt = if args.chat {
        Prompt::Chat(vec![ChatMessage {
            role: "user".into(),
            content: args.prompt,
        }])
    } else {
        Prompt::Text(args.prompt)
    };
    let mut params = SamplingParams {
        max_tokens: args.max_tokens,
        seed: args.seed,
        ..Default::default()
    };
    params.temperature = args.temperature;
    params.top_p = args.top_p;
    params.top_k = args.top_k;
    let mut stream = engine.generate(prompt, params)?;
    let mut out = std::io::stdout().lock();
    while let Some(ev) = stream.next().await {
        match ev? {
            GenerationEvent::Token { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            GenerationEvent::Finished { .. } => break,
        }
    }
    writeln!(out)?;
    Ok(())
}

fn main() -> Result<()> {
    let args = dcpserve_cli::serve::normalize_args(std::env::args());
    // Parsed before anything logs, so that the first line already has its format.
    let cli = Cli::parse_from(&args);
    let log_format = cli.log_format;
    logging::init(log_format);
    // Under an MPI launcher every process runs this program: process 0 goes on as the
    // engine, the others serve their ranks inside `init` and exit there.
    #[cfg(feature = "mpi")]
    let mpi = asks_for_mpi(&args) || dcpserve::distributed::launched_by_mpi();
    #[cfg(feature = "mpi")]
    if mpi {
        dcpserve::distributed::init()?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        match cli.command {
            Command::Generate(a) => generate(a).await,
            Command::Serve(a) => dcpserve_cli::serve::run(*a).await,
            Command::Bench(a) => dcpserve_tools::bench_client::run(a).await,
            Command::Plan(a) => dcpserve_tools::planner::run(a),
            Command::Quantize(a) => quantize_cmd::run(a),
            Command::GpuCheck(a) => gpu_check::run(&a).await,
            Command::BenchDcp(a) => {
                let spec = bench::dcp_bench::DcpBenchSpec {
                    kv_cache_dtype: dcpserve::parse_kv_cache_dtype(&a.kv_cache_dtype)?
                        .unwrap_or(dcpserve::KvCacheDType::F32),
                    tp: a.tp,
                    query_heads: a.query_heads,
                    context: a.context,
                    decode_tokens: a.decode_tokens,
                    capacity_context: a.capacity_context,
                    capacity_sequences: a.capacity_sequences,
                    overlap_batch: a.overlap_batch,
                    overlap_context: a.overlap_context,
                    threads: a.threads,
                    executor: a.distributed_executor_backend.parse()?,
                    prefill_context: a.prefill_context,
                    prefill_runs: a.prefill_runs,
                    link: dcpserve::ModeledLinkConfig {
                        latency_us: a.link_latency_us,
                        gigabytes_per_second: a.link_gbps,
                    },
                    sections: if a.sections.is_empty() {
                        use bench::dcp_bench::DcpBenchSection::*;
                        vec![Step, Capacity, Overlap, Merge]
                    } else {
                        a.sections
                    },
                };
                print!("{}", bench::dcp_bench::run(&spec).await?);
                Ok(())
            }
            Command::BenchSpec(a) => {
                let (path, mut cfg) = a.engine.config()?;
                let spec = match cfg.speculative.take() {
                    Some(s) => s,
                    None => dcpserve::SpeculativeConfig::from_json(
                        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}"#,
                    )?,
                };
                let table =
                    bench::spec_bench::run(&path, cfg, spec, a.max_tokens, a.repeats).await?;
                print!("{table}");
                Ok(())
            }
            Command::KlDivergence(a) => {
                let model = model_path(a.model.as_ref(), &a.model_source)?;
                let spec = bench::kl_divergence::KlSpec {
                    ctx: a.ctx,
                    chunks: a.chunks,
                    step: a.step.unwrap_or(a.ctx),
                    against: match a.against.as_str() {
                        "int8" => dcpserve::CpuMatmul::Int8,
                        "auto" => dcpserve::CpuMatmul::Auto,
                        other => anyhow::bail!("--against {other}: expected int8 or auto"),
                    },
                    threads: a.threads.max(1),
                };
                println!("{}", bench::kl_divergence::run(&model, &a.text, &spec)?);
                Ok(())
            }
            Command::BenchEngine(a) => {
                let (path, cfg) = a.engine.config()?;
                let engine = Engine::builder(path).config(cfg).build().await?;
                let spec = bench::engine_bench::BenchSpec {
                    prompt_tokens: a.prompt_tokens,
                    decode_tokens: a.decode_tokens,
                    batch: a.batch,
                    repeats: a.repeats.max(1),
                };
                println!("{}", bench::engine_bench::run(&engine, &spec).await?);
                Ok(())
            }
        }
    });
    // A rank thread of a group lost with an MPI process may be stuck in MPI for good.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    #[cfg(feature = "mpi")]
    if mpi {
        dcpserve::distributed::shutdown();
    }
    if let (Err(e), logging::LogFormat::Json) = (&result, log_format) {
        // A log shipper reads the failure as one more JSON line.
        tracing::error!("{e:#}");
        std::process::exit(1);
    }
    result
}

/// Whether the command line asks for `--distributed-executor-backend mpi`.
#[cfg(feature = "mpi")]
fn asks_for_mpi(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--distributed-executor-backend" && w[1] == "mpi")
        || args
            .iter()
            .any(|a| a == "--distributed-executor-backend=mpi")
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use clap::Parser;

    #[test]
    fn device_flag_parses_for_generate() {
        let cli =
            Cli::try_parse_from(["dcpserve", "generate", "--prompt", "x", "--device", "cuda"])
                .unwrap();
        let Command::Generate(a) = cli.command else {
            panic!("not generate");
        };
        assert_eq!(a.engine.rank_settings.device, Some(dcpserve::Device::Cuda));
        let cli = Cli::try_parse_from(["dcpserve", "generate", "--prompt", "x"]).unwrap();
        let Command::Generate(a) = cli.command else {
            panic!("not generate");
        };
        let settings = a.engine.rank_settings.rank_settings().unwrap();
        assert_eq!(settings.device, dcpserve::Device::Cpu, "cpu by default");
        assert!(
            Cli::try_parse_from(["dcpserve", "generate", "--prompt", "x", "--device", "gpu"])
                .is_err()
        );
    }

    fn generate_engine(extra: &[&str]) -> Result<super::EngineArgs, clap::Error> {
        let args = ["dcpserve", "generate", "--prompt", "x"]
            .iter()
            .chain(extra);
        match Cli::try_parse_from(args)?.command {
            Command::Generate(a) => Ok(a.engine),
            _ => panic!("not generate"),
        }
    }

    #[test]
    fn gpu_matmul_and_cuda_graphs_flags_parse_for_generate() {
        let settings = |a: super::EngineArgs| a.rank_settings.rank_settings().unwrap();
        let s =
            settings(generate_engine(&["--gpu-matmul", "exact", "--cuda-graphs", "off"]).unwrap());
        assert_eq!(s.gpu_matmul, dcpserve::GpuMatmul::Exact);
        assert_eq!(s.cuda_graphs, dcpserve::CudaGraphs::Off);
        // Both reach the engine config (any existing path stands in for the model).
        let a = generate_engine(&["--model", "Cargo.toml", "--cuda-graphs", "off"]).unwrap();
        let (_, cfg) = a.config().unwrap();
        assert_eq!(cfg.rank_settings.cuda_graphs, dcpserve::CudaGraphs::Off);
        assert_eq!(cfg.rank_settings.gpu_matmul, dcpserve::GpuMatmul::Bf16);
        let a = generate_engine(&["--cuda-graphs=on"]).unwrap();
        assert_eq!(settings(a).cuda_graphs, dcpserve::CudaGraphs::On);
        let a = settings(generate_engine(&[]).unwrap());
        assert_eq!(a.gpu_matmul, dcpserve::GpuMatmul::Bf16, "bf16 by default");
        assert_eq!(a.cuda_graphs, dcpserve::CudaGraphs::On, "on by default");
        assert!(generate_engine(&["--gpu-matmul", "fp4"]).is_err());
        let err = generate_engine(&["--cuda-graphs", "eager"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("expected on or off"), "{err}");
    }
}
