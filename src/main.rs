//! The `dcpserve` command line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use dcpserve::{
    ChatMessage, DType, Engine, EngineConfig, GenerationEvent, GenerationParams, Prompt,
};
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
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt and stream it to stdout.
    Generate(GenerateArgs),
    /// Measure prefill and decode throughput (one JSON line on stdout).
    Bench(BenchArgs),
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
    /// A GGUF file or a Hugging Face model folder (default: SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Weight precision: auto (bf16, or quantized weights kept quantized), float32, bfloat16.
    #[arg(long, default_value = "auto")]
    dtype: String,
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
    fn config(&self) -> Result<(PathBuf, EngineConfig)> {
        let path = self
            .model
            .clone()
            .unwrap_or_else(dcpserve::default_model_path);
        if !path.exists() {
            if self.model.is_none() {
                bail!(
                    "The default model is not at {}: run scripts/fetch-default-model.sh first.",
                    path.display()
                );
            }
            bail!("Model path {} does not exist.", path.display());
        }
        let cfg = EngineConfig {
            dtype: self.dtype.parse::<DType>()?,
            block_size: self.block_size,
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            max_model_len: self.max_model_len,
            num_threads: self.threads,
            ..Default::default()
        };
        Ok((path, cfg))
    }
}

async fn generate(args: GenerateArgs) -> Result<()> {
    let (path, cfg) = args.engine.config()?;
    let engine = Engine::from_path(path, cfg).await?;
    let prompt = if args.chat {
        Prompt::Chat(vec![ChatMessage {
            role: "user".into(),
            content: args.prompt,
        }])
    } else {
        Prompt::Text(args.prompt)
    };
    let mut params = GenerationParams {
        max_tokens: args.max_tokens,
        seed: args.seed,
        ..Default::default()
    };
    params.sampling.temperature = args.temperature;
    params.sampling.top_p = args.top_p;
    params.sampling.top_k = args.top_k;
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.command {
            Command::Generate(a) => generate(a).await,
            Command::Bench(a) => {
                let (path, cfg) = a.engine.config()?;
                let engine = Engine::from_path(path, cfg).await?;
                let spec = dcpserve::bench::BenchSpec {
                    prompt_tokens: a.prompt_tokens,
                    decode_tokens: a.decode_tokens,
                    batch: a.batch,
                    repeats: a.repeats.max(1),
                };
                println!("{}", dcpserve::bench::run(&engine, &spec).await?);
                Ok(())
            }
        }
    })
}
