//! `dcpserve serve`: loads one model (or the models of a config file), each as its own
//! [`Engine`] with its own supervisor and rank group, and serves them over HTTP with the
//! OpenAI-compatible API of [`dcpserve_api`].

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Args;
use dcpserve_actors::ValidRequest;
use dcpserve_api::backend::SpeculationCounters;
use dcpserve_api::engine_status::{KvLayout, KvStatus};
use dcpserve_api::{
    AppState, BackendError, BackendEvent, BackendStats, ChatSettings, EventStream, ModelBackend,
    ModelRouter, ModelSlot,
};
use dcpserve_config::serve_file::{self as config, ModelEntry, SamplingDefaults, ServeConfig};
use dcpserve_model::ChatMessage;
use futures::future::BoxFuture;
use futures::StreamExt;

use dcpserve::{Engine, EngineConfig, GenerationEvent, SpeculativeConfig};

/// Flags of `dcpserve serve`, named as vLLM names them.
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// A GGUF file, a Hugging Face folder, or a Hugging Face repo id (Qwen/Qwen3-0.6B;
    /// ORG/NAME-GGUF:Q4_K_M for one file of a GGUF repo), looked up in the Hugging Face
    /// cache and downloaded into it when missing (default: the default model).
    pub model: Option<PathBuf>,
    /// A TOML file listing several models (see examples/multi-model.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (default 8000; 0 picks a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Name clients use in `model` (default: the model's file or folder name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1 routes (or set DCPSERVE_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Serve no web page at `GET /` (a 404; the API is unchanged).
    #[arg(long)]
    pub no_web_ui: bool,
    /// Requests allowed to wait beyond --max-num-seqs before answering 429.
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// Ranks of the model (query heads split across them); `-tp` works too.
    #[arg(long)]
    pub tensor_parallel_size: Option<usize>,
    /// Ranks sharding the KV cache by position; `-dcp` works too.
    #[arg(long)]
    pub decode_context_parallel_size: Option<usize>,
    /// Copies of the TP group that split each prefill's tokens (world = tp × pcp); `-pcp`
    /// works too.
    #[arg(long)]
    pub prefill_context_parallel_size: Option<usize>,
    /// Consecutive tokens on one DCP rank.
    #[arg(long)]
    pub cp_kv_cache_interleave_size: Option<usize>,
    /// Longest prompt + output (default: the model's context length).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Most sequences in one step.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one step.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Tokens per KV block.
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV-cache bytes per rank (default: derived from free memory).
    #[arg(long)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// auto, float32 or bfloat16.
    #[arg(long)]
    pub dtype: Option<String>,
    /// How the KV cache stores values (vLLM's names): auto (float32 under
    /// --dtype float32, else bfloat16), float32, bfloat16, fp8 (= fp8_e4m3), fp8_e5m2.
    #[arg(long)]
    pub kv_cache_dtype: Option<String>,
    /// `--device`, `--gpu-matmul`, `--cuda-graphs`, `--cpu-matmul`.
    #[command(flatten)]
    pub rank_settings: dcpserve_config::RankSettingsFlags,
    /// `--revision`, `--gguf-file`, `--download-dir`: where a model named by a Hugging
    /// Face repo id comes from.
    #[command(flatten)]
    pub model_source: dcpserve_config::ModelSourceFlags,
    /// With --device cuda: the share of each GPU's memory to use (weights, activations
    /// and the KV cache sized from what remains), as vLLM's flag [default: 0.9].
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Reuse KV blocks of shared prompt prefixes (default on).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Seed of requests that set none.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Compute threads of the model (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Speculative decoding as JSON, as vLLM spells it: e.g.
    /// '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}' or
    /// '{"method": "draft_model", "model": PATH, "num_speculative_tokens": 3}'.
    #[arg(long, value_parser = parse_speculative_config)]
    pub speculative_config: Option<SpeculativeConfig>,
    /// Run two micro-batches in ping-pong: each rank computes one while the other waits
    /// in its collectives (pays off when collectives are slow; see bench-dcp).
    #[arg(long)]
    pub overlap_micro_batches: bool,
    /// Where the rank actors run: mp (threads of this process) or mpi (split over the
    /// processes of `mpirun -np P`, P dividing the tensor-parallel size; needs a build
    /// with `--features mpi`).
    #[arg(long)]
    pub distributed_executor_backend: Option<String>,
    /// How the model writes tool calls (vLLM's names): hermes, llama3_json, deepseek_v3.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Let requests use `tool_choice: "auto"`: tool calls in the output are parsed with
    /// --tool-call-parser.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// Split `<think>` reasoning into `reasoning_content`: deepseek_r1 or qwen3.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
}

fn parse_speculative_config(s: &str) -> Result<SpeculativeConfig, String> {
    SpeculativeConfig::from_json(s).map_err(|e| e.to_string())
}

/// Rewrites vLLM's multi-letter short flags (`-tp 2`, `-dcp 2`) into their long forms,
/// which clap cannot declare.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .map(|a| {
            for (short, long) in [
                ("-tp", "--tensor-parallel-size"),
                ("-dcp", "--decode-context-parallel-size"),
                ("-pcp", "--prefill-context-parallel-size"),
            ] {
                if a == short {
                    return long.to_string();
                }
                if let Some(v) = a.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}");
                }
            }
            a
        })
        .collect()
}

impl ServeArgs {
    /// The command line as a one-model config entry.
    fn model_entry(&self) -> ModelEntry {
        ModelEntry {
            name: self.served_model_name.clone(),
            path: self.model.clone(),
            model_source: self.model_source.clone(),
            tensor_parallel_size: self.tensor_parallel_size,
            decode_context_parallel_size: self.decode_context_parallel_size,
            prefill_context_parallel_size: self.prefill_context_parallel_size,
            cp_kv_cache_interleave_size: self.cp_kv_cache_interleave_size,
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            dtype: self.dtype.clone(),
            kv_cache_dtype: self.kv_cache_dtype.clone(),
            rank_settings: self.rank_settings.clone(),
            gpu_memory_utilization: self.gpu_memory_utilization,
            enable_prefix_caching: if self.no_enable_prefix_caching {
                Some(false)
            } else if self.enable_prefix_caching {
                Some(true)
            } else {
                None
            },
            seed: self.seed,
            threads: self.threads,
            speculative_config: self.speculative_config.clone(),
            overlap_micro_batches: self.overlap_micro_batches.then_some(true),
            distributed_executor_backend: self.distributed_executor_backend.clone(),
            tool_call_parser: self.tool_call_parser.clone(),
            enable_auto_tool_choice: self.enable_auto_tool_choice.then_some(true),
            reasoning_parser: self.reasoning_parser.clone(),
            sampling: SamplingDefaults::default(),
        }
    }

    /// The effective config: the file given with --config, or one model from the flags;
    /// server flags on the command line win over the file's.
    pub fn resolve(&self) -> Result<ServeConfig> {
        let mut cfg = match &self.config {
            Some(path) => {
                if self.model.is_some() {
                    bail!("Give either a MODEL or --config, not both.");
                }
                if self.model_entry() != (ModelEntry::default()) {
                    bail!("Model flags (--tensor-parallel-size, --max-model-len, ...) apply to one model: set them per model in {}.", path.display());
                }
                ServeConfig::load(path)?
            }
            None => ServeConfig {
                models: vec![self.model_entry()],
                ..Default::default()
            },
        };
        let s = &mut cfg.server;
        s.host = self.host.clone().or(s.host.take());
        s.port = self.port.or(s.port);
        s.api_key = self
            .api_key
            .clone()
            .or_else(|| std::env::var("DCPSERVE_API_KEY").ok())
            .or(s.api_key.take());
        s.max_waiting_requests = self.max_waiting_requests.or(s.max_waiting_requests);
        if self.no_web_ui {
            s.web_ui = Some(false);
        }
        Ok(cfg)
    }
}

/// An [`Engine`] as the HTTP layer sees it.
pub struct EngineBackend {
    engine: Engine,
    ranks: usize,
    root: String,
}

impl EngineBackend {
    /// Wraps an engine whose layout has `ranks` ranks; `root` is shown by `/v1/models`.
    pub fn new(engine: Engine, ranks: usize, root: impl Into<String>) -> Self {
        Self {
            engine,
            ranks: ranks.max(1),
            root: root.into(),
        }
    }
}

/// The engine's error as the HTTP layer's: a request to fix (400), a model that cannot
/// serve now (503: its ranks are lost or restarting, or the engine stopped), or a failure.
fn backend_error(e: dcpserve::Error) -> BackendError {
    let message = e.to_string();
    match e {
        dcpserve::Error::InvalidRequest(_) => BackendError::invalid_request(message),
        dcpserve::Error::Unavailable(_)
        | dcpserve::Error::RankFailure(_)
        | dcpserve::Error::EngineStopped(_) => BackendError::unavailable(message),
        _ => BackendError::from(message),
    }
}

impl ModelBackend for EngineBackend {
    fn max_model_len(&self) -> usize {
        self.engine.max_model_len()
    }

    fn vocab_size(&self) -> usize {
        self.engine.files().config.vocab_size
    }

    fn kv_capacity_tokens(&self) -> usize {
        self.engine.kv_capacity().1
    }

    fn root(&self) -> String {
        self.root.clone()
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.engine
            .tokenizer()
            .encode(text, add_special_tokens)
            .map_err(|e| e.to_string())
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        self.engine
            .tokenizer()
            .decode(ids, skip_special_tokens)
            .map_err(|e| e.to_string())
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        self.engine.render_chat(messages).map_err(|e| e.to_string())
    }

    fn render_chat_context(&self, context: &serde_json::Value) -> Result<String, String> {
        self.engine
            .render_chat_context(context)
            .map_err(|e| e.to_string())
    }

    fn check_constraint(
        &self,
        constraint: &dcpserve_actors::OutputConstraint,
    ) -> Result<(), String> {
        self.engine.files().grammar()?.check(constraint)
    }

    fn generate(&self, request: ValidRequest) -> Result<EventStream, BackendError> {
        let stream = self.engine.generate_valid(request).map_err(backend_error)?;
        Ok(stream
            .map(|ev| match ev {
                Ok(GenerationEvent::Token { token, text }) => {
                    Ok(BackendEvent::Token { token, text })
                }
                Ok(GenerationEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                }) => Ok(BackendEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                }),
                Err(e) => Err(backend_error(e)),
            })
            .boxed())
    }

    fn kv_status(&self) -> BoxFuture<'static, Option<KvStatus>> {
        let engine = self.engine.clone();
        Box::pin(async move {
            let l = engine.layout();
            let layout = KvLayout {
                tensor_parallel_size: l.tp(),
                decode_context_parallel_size: l.dcp(),
                prefill_context_parallel_size: l.pcp(),
                cp_kv_cache_interleave_size: l.interleave(),
                block_size: l.block_size(),
            };
            // Two reads, not one snapshot: the blocks in use and the list may differ by a
            // sequence that starts or ends in between.
            let sequences = engine.sequences().await.ok()?;
            let s = engine.stats().await.ok()?;
            Some(KvStatus {
                layout,
                total_blocks: s.total_blocks,
                free_blocks: s.free_blocks,
                generated_tokens: s.generated_tokens,
                sequences,
            })
        })
    }

    fn stats(&self) -> BoxFuture<'static, Option<BackendStats>> {
        let engine = self.engine.clone();
        let ranks = self.ranks;
        Box::pin(async move {
            let s = engine.stats().await.ok()?;
            let used = s.total_blocks.saturating_sub(s.free_blocks);
            // Fraction of virtual KV blocks in use. Block tables are global: the scheduler
            // allocates each virtual block on every rank at once (each rank holds its shard of
            // the block's tokens), so all ranks have the same number of blocks in use and this
            // one number is every rank's usage. It is exported once per rank for dashboards
            // that expect a per-rank series, but the values are equal by construction.
            let usage = if s.total_blocks == 0 {
                0.0
            } else {
                used as f64 / s.total_blocks as f64
            };
            Some(BackendStats {
                unavailable: s.unavailable,
                running: s.running,
                waiting: s.waiting,
                kv_cache_usage: vec![usage; ranks],
                preemptions: s.preemptions,
                prefix_cache_hit_rate: (s.prefix_cache_queries > 0)
                    .then(|| s.prefix_cache_hits as f64 / s.prefix_cache_queries as f64),
                collective_seconds: engine.seconds_in_collectives().await.unwrap_or_default(),
                speculation: engine.speculates().then(|| SpeculationCounters {
                    num_drafts: s.speculation.num_drafts,
                    num_draft_tokens: s.speculation.num_draft_tokens,
                    num_accepted_tokens: s.speculation.num_accepted_tokens,
                    drafts_by_accepted: s.speculation.accepted_histogram.clone(),
                }),
            })
        })
    }
}

/// Loads one config entry, showing a spinner on a terminal and log lines otherwise. A
/// Hugging Face repo id is resolved first (downloads show their own progress); the path
/// returned is the model as the entry names it (the id, or the path).
pub async fn load_model(entry: &ModelEntry) -> Result<(String, Engine, EngineConfig, PathBuf)> {
    let spec = entry
        .path
        .clone()
        .unwrap_or_else(dcpserve::default_model_path);
    if entry.path.is_none() && !spec.exists() {
        bail!(
            "The default model is not at {}: run scripts/fetch-default-model.sh first.",
            spec.display()
        );
    }
    let cfg = entry.engine_config()?;
    let name = entry
        .name
        .clone()
        .unwrap_or_else(|| dcpserve::hub::served_name(&spec));
    let started = Instant::now();
    let (s, source) = (spec.clone(), entry.model_source.clone());
    let path = tokio::task::spawn_blocking(move || dcpserve::hub::resolve_model(&s, &source))
        .await
        .context("resolving the model")?
        .with_context(|| format!("loading model `{name}`"))?;
    tracing::info!(model = %name, path = %path.display(), "loading");
    let spinner = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(format!("loading {name} from {}", path.display()));
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    });
    let result = Engine::builder(path)
        .name(name.clone())
        .config(cfg.clone())
        .model_source(entry.model_source.clone())
        .build()
        .await;
    if let Some(pb) = spinner {
        pb.finish_and_clear();
    }
    let engine = result.with_context(|| format!("loading model `{name}`"))?;
    let (per_rank, total) = engine.kv_capacity();
    tracing::info!(
        model = %name,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        max_model_len = engine.max_model_len(),
        kv_tokens_per_rank = per_rank,
        kv_tokens_total = total,
        "loaded"
    );
    Ok((name, engine, cfg, spec))
}

/// Loads every model of `cfg` and builds the router (bounded queue per model).
pub async fn build_router(cfg: &ServeConfig) -> Result<ModelRouter> {
    let waiting = cfg
        .server
        .max_waiting_requests
        .unwrap_or(config::DEFAULT_MAX_WAITING_REQUESTS);
    let mut router = ModelRouter::new();
    // Models of one process share its cores: unless an entry says otherwise, each gets
    // an equal part rather than all of them (which would oversubscribe).
    let share = (dcpserve_kernels::available_cores() / cfg.models.len().max(1)).max(1);
    for entry in &cfg.models {
        let mut entry = entry.clone();
        if cfg.models.len() > 1 && entry.threads.is_none() {
            entry.threads = Some(share);
        }
        let entry = &entry;
        let chat = ChatSettings::from_names(
            entry.tool_call_parser.as_deref(),
            entry.enable_auto_tool_choice.unwrap_or(false),
            entry.reasoning_parser.as_deref(),
        )
        .map_err(|e| anyhow!(e))?;
        let (name, engine, ecfg, path) = load_model(entry).await?;
        let backend = EngineBackend::new(
            engine,
            ecfg.parallel.tensor_parallel_size,
            path.display().to_string(),
        );
        router
            .add(
                ModelSlot::new(
                    name,
                    Arc::new(backend),
                    entry.sampling,
                    ecfg.max_num_seqs + waiting,
                )
                .with_chat_settings(chat),
            )
            .map_err(|e| anyhow!(e))?;
    }
    Ok(router)
}

/// Runs `dcpserve serve` until Ctrl-C.
pub async fn run(args: ServeArgs) -> Result<()> {
    let cfg = args.resolve()?;
    let router = build_router(&cfg).await?;
    let host = cfg.server.host.as_deref().unwrap_or(config::DEFAULT_HOST);
    let port = cfg.server.port.unwrap_or(config::DEFAULT_PORT);
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .next()
        .ok_or_else(|| anyhow!("{host} resolves to no address"))?;
    let names: Vec<String> = router.models().iter().map(|m| m.name.clone()).collect();
    let state = AppState::new(router, cfg.server.api_key.clone())
        .with_web_ui(cfg.server.web_ui.unwrap_or(true));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    };
    let (bound, server) = dcpserve_api::serve(addr, state, shutdown)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(models = ?names, "serving on http://{bound}");
    server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{normalize_args, ServeArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn device_flag_reaches_the_engine_config() {
        let cli = Cli::try_parse_from(["serve", "--device", "cuda"]).unwrap();
        let e = cli.serve.model_entry().engine_config().unwrap();
        assert_eq!(e.rank_settings.device, dcpserve_kernels::Device::Cuda);
        let cli = Cli::try_parse_from(["serve"]).unwrap();
        let e = cli.serve.model_entry().engine_config().unwrap();
        assert_eq!(
            e.rank_settings.device,
            dcpserve_kernels::Device::Cpu,
            "cpu by default"
        );
        assert!(Cli::try_parse_from(["serve", "--device", "tpu"]).is_err());
    }

    #[test]
    fn gpu_matmul_and_cuda_graphs_flags_reach_the_engine_config() {
        use dcpserve_kernels::{CudaGraphs, GpuMatmul};
        let cli = Cli::try_parse_from([
            "serve",
            "--device",
            "cuda",
            "--gpu-matmul",
            "exact",
            "--cuda-graphs",
            "off",
        ])
        .unwrap();
        let e = cli.serve.model_entry().engine_config().unwrap();
        assert_eq!(e.rank_settings.gpu_matmul, GpuMatmul::Exact);
        assert_eq!(e.rank_settings.cuda_graphs, CudaGraphs::Off);
        let cli = Cli::try_parse_from(["serve", "--cuda-graphs=on"]).unwrap();
        let e = cli.serve.model_entry().engine_config().unwrap();
        assert_eq!(e.rank_settings.cuda_graphs, CudaGraphs::On);
        let cli = Cli::try_parse_from(["serve"]).unwrap();
        let e = cli.serve.model_entry().engine_config().unwrap();
        assert_eq!(
            e.rank_settings.gpu_matmul,
            GpuMatmul::Bf16,
            "bf16 by default"
        );
        assert_eq!(e.rank_settings.cuda_graphs, CudaGraphs::On, "on by default");
        assert!(Cli::try_parse_from(["serve", "--gpu-matmul", "fp4"]).is_err());
        let err = Cli::try_parse_from(["serve", "--cuda-graphs", "eager"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("expected on or off"), "{err}");
    }

    #[test]
    fn no_web_ui_flag_and_toml_key() {
        let cli = Cli::try_parse_from(["serve"]).unwrap();
        assert_eq!(
            cli.serve.resolve().unwrap().server.web_ui,
            None,
            "on by default"
        );
        let cli = Cli::try_parse_from(["serve", "--no-web-ui"]).unwrap();
        assert_eq!(cli.serve.resolve().unwrap().server.web_ui, Some(false));
        let dir = std::env::temp_dir().join(format!("dcpserve-web-ui-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            "[server]\nweb_ui = false\n[[models]]\nname = \"m\"\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let cli = Cli::try_parse_from(["serve", "--config", path]).unwrap();
        assert_eq!(cli.serve.resolve().unwrap().server.web_ui, Some(false));
        std::fs::write(&file, "[server]\nweb_ui = \"no\"\n").unwrap();
        let err = Cli::try_parse_from(["serve", "--config", path])
            .unwrap()
            .serve
            .resolve()
            .unwrap_err();
        assert!(format!("{err:#}").contains("web_ui"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn vllm_short_flags_become_long_ones() {
        let args = [
            "dcpserve",
            "serve",
            "-tp",
            "2",
            "-dcp=2",
            "-pcp",
            "2",
            "-tpx",
            "--tensor-parallel-size=4",
        ];
        let got = normalize_args(args.iter().map(|s| s.to_string()));
        assert_eq!(
            got,
            [
                "dcpserve",
                "serve",
                "--tensor-parallel-size",
                "2",
                "--decode-context-parallel-size=2",
                "--prefill-context-parallel-size",
                "2",
                "-tpx",
                "--tensor-parallel-size=4"
            ]
        );
    }
}
